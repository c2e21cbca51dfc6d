"""Cross-trajectory GAE for rollouts cut into segments (CompactionRL).

A rollout of the policy is cut by compactions into segments s = 1..S. The time steps of
segment s are its ``n_s`` trainable tokens (``loss_mask == 1``) in order; context,
observation and copied-summary tokens are not time steps. ``N_{>s}`` is the number of
trainable tokens generated in later segments (shard column ``trainable_tokens_after``).

Reward placement. The rollout's terminal reward ``R`` sits on the **last trainable token
of every segment**, and each segment is an episode of its own (no bootstrap from the
next segment's values: ``V(n_s) = 0``):

    r_t = R if t = n_s - 1 else 0                       (t = 0..n_s-1)
    δ_t = r_t + γ·V(t+1) - V(t),  V(n_s) = 0
    A_loc(t) = Σ_{l≥0} (γλ)^l δ_{t+l} = δ_t + γλ·A_loc(t+1),  A_loc(n_s) = 0

The cross-trajectory correction then discounts a segment by the tokens that follow it:

    Â(s, t) = (γλ)^{N_{>s}} · A_loc(s, t)

Why this placement: with ``V ≡ 0`` and a fixed λ, ``A_loc(s,t) = (γλ)^{n_s-1-t}·R`` and
so ``Â(s,t) = (γλ)^{n_s-1-t+N_{>s}}·R``. Token t of segment s sits at position
``u = N_{<s} + t`` of the concatenated trainable tokens, whose length is
``T = N_{<s} + n_s + N_{>s}``; plain GAE there with R on the very last token gives
``(γλ)^{T-1-u}·R`` — the same exponent. Had only the last segment carried R, every
earlier segment would get A ≡ 0 and no factor could restore the signal; the
correction is exact only because every segment ends with R.

Length-adaptive λ (VAPO's rule, α = 1.5 in CompactionRL): ``λ = 1 - 1/(α·l)``, clipped
to [0, 1]. The factor ``(γλ)^{N_{>s}}`` reproduces GAE over the concatenated rollout only
when every segment uses the **same** λ, so by default ``l`` is the rollout's trainable
tokens (``rule="rollout"``, shard column ``rollout_trainable_tokens``): one λ per rollout,
and the credit ``(γλ)^{T-1-u}`` never decreases toward the outcome. The per-segment rule
(``rule="segment"``: ``l = n_s``, one λ_s per segment, used inside the segment and in its
correction) is kept as an option; it breaks that equivalence: with n = [300, 4000] the
first token of segment 1 keeps 1e-4 of R instead of 0.51, and with n = [2000, 500, 3000]
the first tokens keep [0.16, 0.009, 0.51] of R — an earlier segment more than a later one.

Critic targets. ``G(t) = A_loc(t) + V(t)``: the λ-return of the segment seen as an
episode ending in R. The critic estimates the expected terminal reward from a state,
which does not depend on how many tokens follow in later segments, so it regresses on
the local return, not on the discounted ``Â``. With λ = 1 it is the Monte-Carlo return
``γ^{n_s-1-t}·R``; with λ = 0 it is the TD(0) target ``r_t + γ·V(t+1)``.

Everything here is float64 numpy; the trainer moves results to torch.
"""

from __future__ import annotations

import numpy as np

DEFAULT_ALPHA = 1.5
LAMBDA_RULES = ("rollout", "segment")


def adaptive_lambda(num_trainable_tokens: int, alpha: float = DEFAULT_ALPHA) -> float:
    """``λ = clip(1 - 1/(α·l), 0, 1)``; longer sequences keep more of the far future."""
    if num_trainable_tokens <= 0:
        raise ValueError("a sequence without trainable tokens has no time steps and no λ")
    return float(np.clip(1.0 - 1.0 / (alpha * num_trainable_tokens), 0.0, 1.0))


def segment_lambda(
    rule: str, segment_tokens: int, rollout_tokens: int, alpha: float = DEFAULT_ALPHA
) -> float:
    """The adaptive λ of a segment under ``rule``: ``rollout`` (default) takes
    ``l = rollout_tokens`` (the rollout's trainable tokens, the same λ for all its
    segments), ``segment`` takes ``l = segment_tokens`` (``n_s``)."""
    if rule not in LAMBDA_RULES:
        raise ValueError(f"unknown λ rule {rule!r}; choose one of {', '.join(LAMBDA_RULES)}")
    return adaptive_lambda(rollout_tokens if rule == "rollout" else segment_tokens, alpha)


def local_gae(
    values: np.ndarray, reward: float, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """GAE inside one segment, R on its last trainable token, no bootstrap past it.

    Args:
        values: ``[n_s]`` critic values V(t) at the segment's trainable tokens, in order.
        reward: the rollout's terminal reward R.
    Returns:
        ``(A_loc, G)``, both ``[n_s]``: ``A_loc(t) = δ_t + γλ·A_loc(t+1)`` and ``G = A_loc + V``.
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[0]
    advantages = np.zeros(n, dtype=np.float64)
    next_value = 0.0
    running = 0.0
    for t in range(n - 1, -1, -1):
        r = reward if t == n - 1 else 0.0
        delta = r + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
        next_value = values[t]
    return advantages, advantages + values


def cross_trajectory_gae(
    values: np.ndarray,
    reward: float,
    trainable_tokens_after: int,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages ``Â(s,t) = (γλ)^{N_{>s}}·A_loc(s,t)`` and critic targets ``G = A_loc + V``.

    Args:
        values: ``[n_s]`` critic values at the segment's trainable tokens.
        reward: the rollout's terminal reward R (on the segment's last trainable token).
        trainable_tokens_after: ``N_{>s}``.
        lam: the segment's λ: a fixed one, or ``segment_lambda(...)``.
    Returns:
        ``(Â, G)``, both ``[n_s]``; empty for a segment with no trainable tokens.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.shape[0] == 0:
        return np.zeros(0), np.zeros(0)
    advantages, returns = local_gae(values, reward, gamma, lam)
    return (gamma * lam) ** trainable_tokens_after * advantages, returns
