"""3 PPO steps on a build, as ``seam train-step`` runs them; FSDP2-sharded when under torchrun.

``python fsdp_worker.py SHARDS MODEL OUT`` (one process, unsharded) or
``torchrun --nproc_per_node=N fsdp_worker.py SHARDS MODEL OUT``. Rank 0 writes OUT (torch.save):
per step the policy loss, value loss, policy grad norm; the full parameters after 3 steps.
"""

from __future__ import annotations

import sys

import torch

from trainer import distributed
from trainer.batching import plan_steps
from trainer.models import Critic, load_policy
from trainer.ppo import PPOConfig, PPOTrainer
from trainer.streaming import build_index, read_rows, split_step


def main(shards: str, model: str, out: str) -> None:
    device = torch.device("cpu")
    rank, world = distributed.init(device) if distributed.launched_by_torchrun() else (0, 1)
    torch.manual_seed(0)
    config = PPOConfig(micro_batch_tokens=48, policy_lr=1e-3, critic_lr=1e-3, policy_updates=2)
    trainer = PPOTrainer(
        load_policy(model, device),
        Critic.from_pretrained(model, device),
        config,
        device,
        sharded=distributed.launched_by_torchrun(),
    )
    index = build_index(shards)
    history = []
    for step in plan_steps(index.segments, 3, 3):
        share = split_step(step, world, config.micro_batch_tokens)[rank]
        m = trainer.step(read_rows(index, share.segments), list(share.micro_batches))
        history.append((m.policy_loss, m.value_loss, trainer.policy_grad_norm, m.trainable_tokens))
    params = {}
    for name, p in list(trainer.policy.named_parameters()) + [
        ("critic." + n, p) for n, p in trainer.critic.named_parameters()
    ]:
        params[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
    if rank == 0:
        torch.save({"history": history, "params": params}, out)
    if distributed.launched_by_torchrun():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
