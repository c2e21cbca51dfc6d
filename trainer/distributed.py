"""Data-parallel PPO under ``torchrun``: process group, FSDP2 sharding, global sums.

Every rank plans the same steps (``streaming.split_step``) and trains its share. Both
losses are normalised by the step's *global* trainable-token count |M| (one all-reduce),
so rank r's loss is ``Σ_{its tokens} ℓ / |M|`` and the update needs the **sum** of the
ranks' gradients. FSDP2 averages gradients over ranks by default; the loss is therefore
multiplied by the world size (``loss_scale``), which gives the sum. (Forcing a sum with
a divide factor of 1 uses ``PREMUL_SUM``, which gloo lacks.) ``clip_grad_norm_`` on the
sharded (DTensor) gradients clips on the global norm.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device: torch.device) -> tuple[int, int]:
    """Join the process group torchrun describes (gloo on CPU, NCCL on CUDA); (rank, world size)."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def shard(root: torch.nn.Module, layers, bf16: bool = False) -> None:
    """FSDP2 ``fully_shard`` on each decoder layer, then on the root (embeddings, norm, head).

    ``bf16``: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` — the
    all-gathered parameters the forward and backward compute with are bf16 (half the
    all-gather traffic and memory), gradients are reduced over ranks in fp32, and the
    sharded master weights and AdamW state stay fp32.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if bf16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(root, mp_policy=policy)


def decoder_layers(model) -> list[torch.nn.Module]:
    """The decoder layers of a Hugging Face causal LM or base model (``base_model.layers``)."""
    return list(model.base_model.layers)


def global_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum over ranks (identity without a process group), in float64."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def global_max(values: list[float], device: torch.device) -> list[float]:
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
