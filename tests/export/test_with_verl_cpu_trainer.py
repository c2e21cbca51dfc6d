"""verl's own trainer code on seam's builds, on CPU (skipped where ``verl`` is not
installed; CI installs it in a virtualenv of its own, see ``.ci/run``): its
``SFTTrainer`` trains two steps on the SFT build, and its actor worker (``TrainingWorker``
with the FSDP engine and ``ppo_loss``) two PPO epochs on the verl RL export.

verl 0.9.1 resolves its device through its platform plugins and has none for CPU;
``tests/export/verl_cpu_platform.py`` registers one (``VERL_PLATFORM=cpu``). Each run is
a subprocess started as torchrun starts rank 0 of 1 (verl resolves its platform once per
process, on import), with the settings a CPU needs (``CPU``): no flash-attn
(``attn_implementation=sdpa``), no ``use_remove_padding`` (its packed forward needs
flash-attn's varlen kernels), fp32 instead of bf16 mixed precision, FSDP2 (FSDP1 wants an
accelerator ``device_id``), and verl's torch fused-kernel log-probs (its default CPU
path, ``logprobs_from_logits_v2``, runs a ``logsumexp`` per token: 31 s a step here
instead of 6). Everything else -- the dataloader, micro-batching, the FSDP engine's
forward and backward, the losses, the optimizer, the checkpoint -- is verl's.
"""

from __future__ import annotations

import json
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
from pipeline.export import export_build  # noqa: E402
from tests.export.test_with_verl_sft import own_loss  # noqa: E402
from tests.sample_builds import shard_rows  # noqa: E402
from trainer.models import build_tiny_model  # noqa: E402

ROOT = Path(pipeline.export.verl_sft.__file__).parents[2]
# What verl's FSDP engine needs on CPU (see the module docstring).
CPU = [
    "+model.override_config.attn_implementation=sdpa",
    "model.use_remove_padding=False",
    "model.use_fused_kernels=True",
    "model.enable_gradient_checkpointing=False",
    "engine.strategy=fsdp2",
    "+engine.mixed_precision.param_dtype=fp32",
    "engine.use_torch_compile=False",
]
STEP = re.compile(r"^step:(\d+) - .*\btrain/loss:(\S+)", re.M)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_on_cpu(args: list[str]) -> subprocess.CompletedProcess:
    """``python ARGS`` from the seam checkout, with the environment torchrun gives rank 0
    of 1."""
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
    command = [sys.executable, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_verls_sft_trainer_trains_seams_trainable_tokens_on_cpu(
    sft_build, tiny_model_dir, tmp_path
):
    model_dir = tiny_model_dir
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
        *CPU,
        f"trainer.default_local_dir={tmp_path / 'checkpoints'}",
    ]
    hydra = [f"hydra.run.dir={tmp_path / 'hydra'}", "hydra.output_subdir=null"]
    done = run_on_cpu(["-m", "tests.export.verl_cpu_platform", *overrides, *hydra])
    assert done.returncode == 0, done.stderr[-4000:]
    losses = {int(step): float(loss) for step, loss in STEP.findall(done.stdout)}
    assert sorted(losses) == [1, 2], done.stdout[-4000:]
    assert all(math.isfinite(loss) for loss in losses.values())
    # Step 1 sees the untrained model: verl's loss is the mean NLL of exactly seam's
    # trainable tokens (184 in the 5 rows) over the whole batch, however it split it.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    assert losses[1] == pytest.approx(own_loss(model, rows), rel=1e-5)
    assert losses[2] < losses[1]  # the same rows again, one AdamW step later
    assert (tmp_path / "checkpoints" / "global_step_2" / "huggingface").is_dir()


def test_verls_actor_worker_weighs_rollouts_by_their_trainable_tokens(
    rl_build, tiny_model_dir, tmp_path
):
    """verl's own actor update (``TrainingWorker``, FSDP engine, ``ppo_loss``, see
    ``actor_steps``) on the verl export of ``a0`` (1 segment, advantage +1) and ``a2`` (3
    segments, advantage -1), one row per micro-batch. At step 1 the ratio is 1, so
    verl's ``pg_loss`` is minus the advantages' mean over the tokens it trains: with its
    default ``token-mean`` and the global token count, every trainable token weighs the
    same across micro-batches (a per-micro-batch mean would give each segment 1/4)."""
    export_build(rl_build, "verl", tmp_path / "verl")
    out = tmp_path / "actor.json"
    script = (
        "import sys; import tests.export.verl_cpu_platform as cpu; cpu.use_cpu_platform(); "
        "from tests.export.test_with_verl_cpu_trainer import actor_steps; "
        "actor_steps(*sys.argv[1:])"
    )
    args = [str(tmp_path / "verl"), str(tiny_model_dir), str(out), "a0", "a2"]
    done = run_on_cpu(["-c", script, *args])
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    build = {(r["rollout_id"], r["segment_index"]): r for r in shard_rows(rl_build)}
    expected = [build["a0", 0]] + [build["a2", s] for s in range(3)]
    assert result["tokens"] == [r["num_trainable_tokens"] for r in expected]  # 50, 47, 61, 3
    assert result["advantages"] == pytest.approx([r["advantage"] for r in expected])
    tokens, advantages = result["tokens"], result["advantages"]
    token_mean = sum(a * n for a, n in zip(advantages, tokens, strict=True)) / sum(tokens)
    metrics = result["metrics"]
    pg_loss, kl = metrics["actor/pg_loss"], metrics["actor/ppo_kl"]
    assert len(pg_loss) == 2 and all(math.isfinite(x) for x in pg_loss + metrics["grad_norm"])
    assert pg_loss[0] == pytest.approx(-token_mean, rel=1e-5)  # 61/161, not 1/2
    assert kl[0] == 0.0 and abs(kl[1]) > 1e-4  # ratio 1 at step 1; step 2 sees the update
    assert metrics["loss"] == pytest.approx(
        pg_loss, rel=1e-6
    )  # no KL or entropy term in verl's default actor


def actor_steps(export_dir: str, model_dir: str, out: str, *rollout_ids: str) -> None:
    """Run in a subprocess on the CPU platform (``use_cpu_platform`` first): verl's
    ``TrainingWorker`` with the FSDP engine and ``ppo_loss`` as ``ActorRolloutRefWorker``
    builds it (micro-batches of one row, verl's default actor config), the export's rows
    of ``rollout_ids`` padded as verl's agent loop pads them, old log-probs from the
    worker's ``infer_batch`` (``ray_trainer._compute_old_log_prob``), each row's
    advantage on its response tokens, then ``train_mini_batch`` with the meta
    ``ray_trainer._update_actor`` sets: one mini-batch of every row, two PPO epochs.
    Writes the metrics and each row's trained-token count to ``out``."""
    from functools import partial

    import pyarrow.parquet as pq
    from hydra import compose, initialize_config_dir
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import FSDPActorConfig
    from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    torch.distributed.init_process_group(backend="gloo")
    rows = [
        r
        for f in sorted(Path(export_dir).glob("*.parquet"))
        for r in pq.read_table(f).to_pylist()
        if r["extra_info"]["rollout_id"] in rollout_ids
    ]
    config_dir = Path(sys.modules["verl"].__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("sft_trainer_engine", overrides=[f"model.path={model_dir}", *CPU])
    model_config = omega_conf_to_dataclass(config.model)
    engine_config = omega_conf_to_dataclass(config.engine)
    engine_config.use_dynamic_bsz = False
    engine_config.micro_batch_size_per_gpu = engine_config.infer_micro_batch_size_per_gpu = 1
    worker = TrainingWorker(
        TrainingWorkerConfig(
            model_type="language_model",
            model_config=model_config,
            engine_config=engine_config,
            optimizer_config=omega_conf_to_dataclass(config.optim),
            checkpoint_config=omega_conf_to_dataclass(config.checkpoint),
        )
    )
    actor = FSDPActorConfig(
        strategy="fsdp2", ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=len(rows), rollout_n=1
    )
    worker.set_loss_fn(partial(ppo_loss, config=actor))
    worker.reset()

    batch = pad_as_agent_loop(rows, model_config.tokenizer.pad_token_id)
    td = left_right_2_no_padding(batch.clone())
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False, temperature=1.0)
    old = worker.infer_batch(td)
    batch["old_log_probs"] = no_padding_2_padding(tu.get(old, "log_probs"), td).float()
    advantage = torch.tensor([r["extra_info"]["advantage"] for r in rows])
    batch["advantages"] = advantage[:, None] * batch["response_mask"]
    metrics = train_one_mini_batch(
        worker,
        batch,
        epochs=2,
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
    )
    result = {
        "metrics": {k: [float(x) for x in v] for k, v in metrics.items() if isinstance(v, list)},
        "advantages": advantage.tolist(),
        "tokens": batch["response_mask"].sum(-1).tolist(),
    }
    Path(out).write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


def pad_as_agent_loop(rows: list[dict], pad: int):
    """The export's rows as verl's agent loop batches them: prompts left-padded, responses
    and ``response_mask`` right-padded to the longest (``AgentLoopWorker._postprocess``)."""
    from tensordict import TensorDict
    from verl.utils.model import compute_position_id_with_mask

    outputs = [r["agent_loop_output"] for r in rows]
    width_p = max(len(o["prompt_ids"]) for o in outputs)
    width_r = max(len(o["response_ids"]) for o in outputs)
    prompts = torch.full((len(rows), width_p), pad)
    responses = torch.full((len(rows), width_r), pad)
    mask = torch.zeros((len(rows), width_p + width_r), dtype=torch.long)
    response_mask = torch.zeros((len(rows), width_r), dtype=torch.long)
    for i, o in enumerate(outputs):
        p, r = len(o["prompt_ids"]), len(o["response_ids"])
        prompts[i, width_p - p :] = torch.as_tensor(o["prompt_ids"])
        responses[i, :r] = torch.as_tensor(o["response_ids"])
        mask[i, width_p - p : width_p + r] = 1
        response_mask[i, :r] = torch.as_tensor(o["response_mask"])
    return TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": mask,
            "position_ids": compute_position_id_with_mask(mask),
            "response_mask": response_mask,
        },
        batch_size=len(rows),
    )


def train_one_mini_batch(worker, batch, epochs: int, **meta) -> dict:
    """``worker.train_mini_batch`` on every row of the padded ``batch`` as one mini-batch,
    unpadded and with the meta the trainer's ``_update_actor``/``_update_critic`` set
    (plus ``meta``), no shuffle; its metrics."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(batch)
    tu.assign_non_tensor(
        td,
        temperature=1.0,
        global_batch_size=len(batch),
        mini_batch_size=len(batch),
        epochs=epochs,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
        **meta,
    )
    return tu.get(worker.train_mini_batch(td), "metrics")
