"""Data-parallel PPO and its checkpoints: 2 ranks under torchrun (gloo, FSDP2) equal one
unsharded process, and DCP checkpoints resume across world sizes.

One torchrun launch holds every 2-rank run (``fsdp_worker.py``); marked ``slow``; skip with
``-m 'not slow'``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.trainer.conftest import SMALL_VOCAB  # noqa: E402
from tests.trainer.fsdp_worker import CONFIG, PLAN, full_params  # noqa: E402
from trainer.loop import Checkpointing, run  # noqa: E402
from trainer.models import Critic, load_policy  # noqa: E402
from trainer.ppo import PPOConfig, PPOTrainer  # noqa: E402
from trainer.streaming import build_index  # noqa: E402
from trainer.synthetic import write_synthetic_shard  # noqa: E402

WORKER = Path(__file__).with_name("fsdp_worker.py")
# 5 rollouts, 8 segments; one segment (60 tokens) longer than the 48-token micro-batch budget;
# with 2 ranks the 3rd step's 1 segment leaves rank 1 only padding.
ROLLOUTS = [[(12, 6), (10, 5)], [(40, 20)], [(9, 7), (11, 3), (8, 4)], [(14, 8)], [(6, 3)]]


def _at_step(src: Path, dst: Path, step: int) -> Path:
    """A copy of a checkpoint directory whose ``latest`` names ``step``."""
    shutil.copytree(src, dst)
    (dst / "latest").write_text(f"step-{step:08d}\n")
    return dst


def _close_history(a, b):
    for x, y in zip(a, b, strict=True):
        assert x[3] == y[3]  # the same global |M|
        assert x[:3] == pytest.approx(y[:3], rel=1e-5, abs=1e-7)


def _close_params(a, b):
    assert a.keys() == b.keys()
    for name, p in a.items():
        # lr 1e-3, 6 AdamW updates: Adam divides by √v, so a rounding difference in a
        # near-zero gradient moves an element by up to a fraction of lr; 1e-5 is 1% of one step.
        torch.testing.assert_close(b[name], p, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_ranks_equal_one_process_and_resume_across_world_sizes(tmp_path, small_vocab_model_dir):
    shards = tmp_path / "shards"
    write_synthetic_shard(shards, ROLLOUTS, SMALL_VOCAB, seed=4)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [str(shards), str(small_vocab_model_dir), str(tmp_path)]
    subprocess.run([sys.executable, str(WORKER), *args], check=True, env=env, timeout=240)
    one = torch.load(tmp_path / "one.pt")
    _at_step(tmp_path / "ck1", tmp_path / "ck1-at2", 2)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    subprocess.run([*launch, str(WORKER), *args], check=True, env=env, timeout=400)
    two = torch.load(tmp_path / "two.pt")

    # 2 ranks equal 1 process: losses, grad norms, |M| per step; parameters after 3 steps.
    _close_history(one["history"], two["fresh"][0])
    _close_params(one["params"], two["fresh"][1])
    # Resumed at the same world size: bit-for-bit.
    assert two["same"][0] == two["fresh"][0][2:]
    for name, p in two["fresh"][1].items():
        assert torch.equal(two["same"][1][name], p), name
    # 1 → 2 ranks: within the 1-vs-2 tolerance.
    _close_history(one["history"][2:], two["from_one"][0])
    _close_params(one["params"], two["from_one"][1])
    # 2 → 1: the 2-rank checkpoint of step 2 in this (unsharded) process.
    torch.manual_seed(0)
    trainer = PPOTrainer(
        load_policy(small_vocab_model_dir, torch.device("cpu")),
        Critic.from_pretrained(small_vocab_model_dir, torch.device("cpu")),
        PPOConfig(**CONFIG),
        torch.device("cpu"),
    )
    ck = _at_step(tmp_path / "ck2", tmp_path / "ck2-at2", 2)
    (m,) = run(trainer, build_index(shards), PLAN, checkpoints=Checkpointing(ck, resume=True))
    _close_history(
        one["history"][2:], [(m.policy_loss, m.value_loss, m.policy_grad_norm, m.trainable_tokens)]
    )
    _close_params(one["params"], full_params(trainer))
    # bf16 parameters, fp32 reduction: the first step within bf16's precision of fp32.
    (bf16,) = two["bf16"][0]
    assert bf16[3] == one["history"][0][3]
    assert bf16[:3] == pytest.approx(one["history"][0][:3], rel=3e-2, abs=1e-3)
