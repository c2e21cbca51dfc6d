"""verl reward functions for seam exports: the recorded outcome, or seam's advantage.

``reward.custom_reward_function.path=<this file>``: verl's reward manager calls the named
function once per row with ``data_source`` (``seam/<source>``), ``ground_truth`` (the
rollout's recorded reward as text) and ``extra_info`` (the export's, with seam's
``advantage``), and puts the score on the last token of the response, which the export
makes the segment's last trainable token.

- ``name=compute_score``: the recorded reward, for verl's own advantage estimators.
- ``name=compute_advantage``: seam's advantage (the rollout's reward normalized over the
  rollouts of its task, the same for each of its segments). With
  ``algorithm.adv_estimator=grpo`` and ``actor_rollout_ref.rollout.n=1`` every row is a
  group of one, which verl's GRPO passes through unchanged (mean 0, std 1), so each
  trainable token gets seam's advantage. verl's GRPO over segments instead would count a
  rollout once per segment in its group's mean and std.
"""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    _check(data_source)
    return float(ground_truth)


def compute_advantage(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    _check(data_source)
    return float(extra_info["advantage"])


def _check(data_source) -> None:
    if not str(data_source).startswith("seam/"):
        raise ValueError(f"data_source {data_source!r} is not a seam export row")
