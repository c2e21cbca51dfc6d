"""verl's own ``SFTTrainer`` trains two steps on seam's SFT build, on CPU (skipped where
``verl`` is not installed; CI installs it in a virtualenv of its own, see ``.ci/run``).

verl 0.9.1 resolves its device through its platform plugins and has none for CPU;
``tests/report/verl_cpu_platform.py`` registers one (``VERL_PLATFORM=cpu``). The trainer
runs in a subprocess started as torchrun starts a rank, with docs/sft.md's overrides
plus the settings a CPU needs: no flash-attn (``attn_implementation=sdpa``), no
``use_remove_padding`` (its packed forward needs flash-attn's varlen kernels), fp32
instead of bf16 mixed precision, FSDP2 (FSDP1 wants an accelerator ``device_id``), and
verl's torch fused-kernel log-probs (its default CPU path, ``logprobs_from_logits_v2``,
runs a ``logsumexp`` per token: 30 s a step here). Everything else, the dataloader,
dynamic micro-batching, the FSDP engine's forward and backward, ``sft_loss``, the
optimizer and the checkpoint, is verl's as the command runs it.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

import pipeline.export.verl_sft  # noqa: E402
from tests.report.conftest import shard_rows  # noqa: E402
from trainer.models import build_tiny_model  # noqa: E402

ROOT = Path(pipeline.export.verl_sft.__file__).parents[2]
STEP = re.compile(r"^step:(\d+) - .*\btrain/loss:(\S+)", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sft_trainer(overrides: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """``python -m tests.report.verl_cpu_platform OVERRIDES`` from the seam checkout, with
    the environment torchrun gives rank 0 of 1."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "HYDRA_FULL_ERROR": "1",
        "VERL_PLATFORM": "cpu",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        # The logits of a 151,936-token vocabulary are hundreds of MB per chunk: keep
        # glibc from returning them to the kernel and page-faulting them back in each
        # time (a step takes 3 s instead of 10).
        "MALLOC_MMAP_THRESHOLD_": str(2**32),
        "MALLOC_TRIM_THRESHOLD_": str(2**32),
    }
    command = [sys.executable, "-m", "tests.report.verl_cpu_platform", *overrides]
    command += [f"hydra.run.dir={tmp / 'hydra'}", "hydra.output_subdir=null"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def own_loss(model_dir: Path, rows) -> float:
    """Mean negative log-likelihood of the rows' trainable tokens, each row run alone."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    nll, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = torch.as_tensor(row["input_ids"])[None]
            mask = torch.as_tensor(row["loss_mask"], dtype=torch.bool)[1:]
            logp = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
            nll -= float(logp.gather(-1, ids[0, 1:, None])[:, 0][mask].sum())
            count += int(mask.sum())
    return nll / count


def test_verls_sft_trainer_trains_seams_trainable_tokens_on_cpu(sft_build, tmp_path):
    model_dir = build_tiny_model(tmp_path / "tiny")
    rows = shard_rows(sft_build)
    longest = max(len(r["input_ids"]) for r in rows)
    overrides = [
        # docs/sft.md's command, sized for the test build (5 rows, longest 401 tokens)
        f"model.path={model_dir}",
        f"data.train_files={sft_build}",
        "data.custom_cls.path=pipeline/export/verl_sft.py",
        "data.custom_cls.name=SeamSFTDataset",
        f"data.max_length={longest}",
        "data.truncation=error",
        f"data.max_token_len_per_gpu={longest}",  # one row per micro-batch, mostly
        f"data.train_batch_size={len(rows)}",  # every row in each step
        "trainer.total_training_steps=2",
        "trainer.logger=[console]",
        # on CPU
        "trainer.device=cpu",
        "data.num_workers=0",
        "+model.override_config.attn_implementation=sdpa",
        "model.use_remove_padding=False",
        "model.use_fused_kernels=True",
        "model.enable_gradient_checkpointing=False",
        "engine.strategy=fsdp2",
        "+engine.mixed_precision.param_dtype=fp32",
        "engine.use_torch_compile=False",
        f"trainer.default_local_dir={tmp_path / 'checkpoints'}",
    ]
    done = run_sft_trainer(overrides, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    losses = {int(step): float(loss) for step, loss in STEP.findall(done.stdout)}
    assert sorted(losses) == [1, 2], done.stdout[-4000:]
    assert all(math.isfinite(loss) for loss in losses.values())
    # Step 1 sees the untrained model: verl's loss is the mean NLL of exactly seam's
    # trainable tokens (184 in the 5 rows) over the whole batch, however it split it.
    assert losses[1] == pytest.approx(own_loss(model_dir, rows), rel=1e-5)
    assert losses[2] < losses[1]  # the same rows again, one AdamW step later
    assert (tmp_path / "checkpoints" / "global_step_2" / "huggingface").is_dir()
