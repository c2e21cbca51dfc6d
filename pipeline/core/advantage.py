"""Training signal: GRPO shared outcome advantages and PPO metadata.

GRPO (over **rollouts**, never over segments):

    A_r = (R_r − mean_{g(r)} R) / (std_{g(r)} R + ε),   ε = 1e-6        (``--std none``: A_r = R_r − mean)

where g(r) is the rollout's task group and std is the population standard deviation
(``--std sample``: the sample std with Bessel's correction, as verl and TRL compute it;
the population std is √((G−1)/G) of it, so seam's default advantages are √(G/(G−1))
larger: 1.15× for G = 4).
Every segment of rollout r gets A_r. Normalizing over segment rows instead would give
a rollout that compacted k times k+1 votes in the mean — the segment-count bias. A
group of one has no baseline: its advantage is 0 and it is counted in the report. A
rollout and its sub-agents are one vote (``write.vote_roots``): only the top-level
rollout enters the group; its sub-agents get its A_r.

PPO metadata for cross-trajectory GAE (CompactionRL), per segment s of a rollout:
``n_s`` = trainable tokens of s, and ``N_{>s} = Σ_{t>s} n_t``, so the trainer can
apply ``Â(s,i) = (γλ)^{N_{>s}} · A_loc(s,i)``.
"""

from __future__ import annotations

import numpy as np

EPSILON = 1e-6


def group_advantages(
    group_ids: np.ndarray, rewards: np.ndarray, use_std: bool = True, ddof: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Per-rollout advantages and group sizes.

    ``group_ids``: one group key per rollout (any hashable dtype); ``rewards``: float;
    ``ddof``: 0 for the population std, 1 for the sample std.
    Returns ``(advantage, group_size)`` aligned with the inputs.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    # A rollout without an outcome (NaN, SFT builds only) is in no group: advantage 0.
    known = ~np.isnan(rewards)
    _, inverse = np.unique(group_ids, return_inverse=True)
    counts = np.bincount(inverse, weights=known)
    safe = np.where(known, rewards, 0.0)
    means = np.bincount(inverse, weights=safe) / np.maximum(counts, 1)
    centered = np.where(known, safe - means[inverse], 0.0)
    adv = centered
    if use_std:
        var = np.bincount(inverse, weights=centered * centered) / np.maximum(counts - ddof, 1)
        adv = centered / (np.sqrt(var)[inverse] + EPSILON)
    sizes = np.where(known, counts[inverse], 1).astype(np.int64)
    adv = np.where(sizes > 1, adv, 0.0)
    return adv, sizes


def trainable_tokens_after(per_segment: list[int]) -> list[int]:
    """N_{>s} for each segment s of one rollout, given n_s in segment order."""
    after, total = [], 0
    for n in reversed(per_segment):
        after.append(total)
        total += n
    return after[::-1]
