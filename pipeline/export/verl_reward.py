"""verl reward function for seam exports: the recorded outcome.

``reward.custom_reward_function.path=<this file>`` and ``...name=compute_score``: verl's
reward manager calls it once per row with ``data_source`` (``seam/<source>``) and
``ground_truth`` (the rollout's recorded reward as text) and puts the score on the last
token of the response, which the export makes the segment's last trainable token.
"""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    if not str(data_source).startswith("seam/"):
        raise ValueError(f"data_source {data_source!r} is not a seam export row")
    return float(ground_truth)
