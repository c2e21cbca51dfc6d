"""PPO runs on a build as ``seam train-step`` runs them (``trainer.loop.run``); FSDP2-sharded
under torchrun. Rank 0 writes ``OUT/one.pt`` (one process) or ``OUT/two.pt`` (torchrun).

``python fsdp_worker.py SHARDS MODEL OUT``: 3 steps, checkpoints every step in ``OUT/ck1``.

``torchrun --nproc_per_node=2 fsdp_worker.py SHARDS MODEL OUT``, four runs in one launch
(a torchrun start is the expensive part):

- ``fresh``: 3 steps, checkpoints in ``OUT/ck2`` (steps 2 and 3);
- ``same``: a new trainer resumes ``OUT/ck2`` at step 2 (``latest`` moved back) for step 3;
- ``from_one``: a new trainer resumes ``OUT/ck1-at2`` (the one-process run's checkpoint of
  step 2, prepared by the test) for step 3: 1 → 2 ranks;
- ``bf16``: 1 step with bf16 parameters and fp32 gradient reduction (``MixedPrecisionPolicy``).

Each result: per step (policy loss, value loss, policy grad norm, |M|) and, but for
``bf16``, the full parameters after the run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from trainer import distributed
from trainer.checkpoint import LATEST
from trainer.loop import Checkpointing, PlanOptions, run
from trainer.models import Critic, load_policy
from trainer.ppo import PPOConfig, PPOTrainer
from trainer.streaming import build_index

PLAN = PlanOptions(rollouts_per_step=3, steps=3)
CONFIG = dict(micro_batch_tokens=48, policy_lr=1e-3, critic_lr=1e-3, policy_updates=2)


def full_params(trainer: PPOTrainer) -> dict[str, torch.Tensor]:
    params = {}
    for name, p in list(trainer.policy.named_parameters()) + [
        ("critic." + n, p) for n, p in trainer.critic.named_parameters()
    ]:
        params[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
    return params


def train(model: str, index, world: int, rank: int, checkpoints=None, plan=PLAN, **config):
    torch.manual_seed(0)
    trainer = PPOTrainer(
        load_policy(model, torch.device("cpu")),
        Critic.from_pretrained(model, torch.device("cpu")),
        PPOConfig(**{**CONFIG, **config}),
        torch.device("cpu"),
        sharded=world > 1,
    )
    history = run(
        trainer, index, plan, rank, world, checkpoints, {"policy": model, "critic": model}
    )
    record = [
        (m.policy_loss, m.value_loss, m.policy_grad_norm, m.trainable_tokens) for m in history
    ]
    return record, full_params(trainer)


def main(shards: str, model: str, out: str) -> None:
    out_dir = Path(out)
    index = build_index(shards)
    if not distributed.launched_by_torchrun():
        history, params = train(model, index, 1, 0, Checkpointing(out_dir / "ck1", every=1))
        torch.save({"history": history, "params": params}, out_dir / "one.pt")
        return
    rank, world = distributed.init(torch.device("cpu"))
    results = {}
    ck2 = out_dir / "ck2"
    results["fresh"] = train(model, index, world, rank, Checkpointing(ck2, every=2))
    if rank == 0:
        (ck2 / LATEST).write_text("step-00000002\n")
    torch.distributed.barrier()
    results["same"] = train(model, index, world, rank, Checkpointing(ck2, resume=True))
    results["from_one"] = train(
        model, index, world, rank, Checkpointing(out_dir / "ck1-at2", resume=True)
    )
    bf16 = train(model, index, world, rank, plan=PlanOptions(3, 1), bf16=True)
    results["bf16"] = (bf16[0], {})
    if rank == 0:
        torch.save(results, out_dir / "two.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
