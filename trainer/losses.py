"""PPO losses, per token, and the one normalization CompactionRL prescribes.

All functions take flat tensors over trainable tokens (``[M]``). A step's loss is

    L = (1/|M|) · Σ_{segments s} Σ_{i ∈ trainable(s)} ℓ(s, i)

with |M| the trainable tokens of *all* segments of the step. A micro-batch contributes
``Σ_{its tokens} ℓ / |M|``, so gradient accumulation over micro-batches gives the same
gradient as one pass, whatever the packing and however the rollout was cut into
segments. Averaging per sample (``mean_s mean_i ℓ``) instead gives each segment equal
weight: a rollout that compacted k times counts k+1 times and its tokens weigh less
the more segments it has — the segment-count bias.
"""

from __future__ import annotations

import torch


def clipped_surrogate(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO policy loss and whether the clip was active.

    ``ρ = exp(log π - log π_old)``,  ``ℓ = -min(ρ·Â, clip(ρ, 1-ε, 1+ε)·Â)``.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return -torch.minimum(unclipped, clipped), (clipped < unclipped)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> torch.Tensor:
    """Per-token critic loss ``½·max((V - G)², (V_old + clip(V - V_old, ±c) - G)²)``."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)


def approx_kl(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token ``KL(π_old ‖ π)`` estimate ``(ρ - 1) - log ρ`` (Schulman's k3: unbiased, ≥ 0)."""
    log_ratio = logprobs - old_logprobs
    return torch.expm1(log_ratio) - log_ratio


def token_level(per_token: torch.Tensor, total_trainable_tokens: int) -> torch.Tensor:
    """A micro-batch's share of the step loss: ``Σ ℓ / |M|`` with |M| counted over the whole step."""
    return per_token.sum() / total_trainable_tokens
