"""Hand-checked: the reward a rollout's rows carry, a list column's nulls, and the row
options seam's Python API (``seam.segments``) and ``seam show`` rely on by default.

Written for the mutants ``make mutate`` found alive in ``pipeline/core/rows.py`` once its
main test file was in the run again (tools/mutate.py's table named a file that never
existed): each test below fails with one of them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core.mask import MaskOptions
from pipeline.core.rows import RejectedRollout, RowBatch, RowOptions, _list_array, rollout_reward
from schemas.rollout import Rollout


def _rollout(**outcome) -> Rollout:
    return Rollout.model_validate(
        {
            "rollout_id": "r",
            "task_id": "t",
            "source": "s",
            "model": "m",
            "events": [
                {"type": "message", "id": "m0", "role": "user", "content": "fix it"},
                {"type": "message", "id": "m1", "role": "assistant", "content": "done"},
            ],
            **outcome,
        }
    )


@pytest.mark.parametrize(
    ("outcome", "reward"),
    [
        ({"resolved": True}, 1.0),  # SWE-bench style: resolved is the outcome
        ({"resolved": False}, 0.0),
        ({"reward": 0.25}, 0.25),
        ({"reward": 0.25, "resolved": True}, 0.25),  # a reward wins over resolved
        ({"reward": -1, "resolved": False}, -1.0),
    ],
)
def test_the_reward_comes_from_the_reward_else_from_resolved(outcome, reward):
    assert rollout_reward(_rollout(**outcome)) == reward


def test_a_rollout_with_neither_is_rejected_with_what_to_do():
    with pytest.raises(RejectedRollout, match="--rewards"):
        rollout_reward(_rollout())


def test_a_list_column_is_null_exactly_where_a_row_has_no_values():
    chunks = [np.array([0.5, -1.0]), None, np.array([], dtype=np.float64), np.array([2.0])]
    column = _list_array(chunks, pa.float32(), np.float32)
    assert column.to_pylist() == [[0.5, -1.0], None, [], [2.0]]
    assert column.null_count == 1
    every = _list_array([np.array([1]), np.array([2, 3])], pa.int32(), np.int32)
    assert every.to_pylist() == [[1], [2, 3]] and every.null_count == 0
    assert _list_array([None, None], pa.int8(), np.int8).to_pylist() == [None, None]


def test_the_default_options_keep_every_segment_and_require_an_outcome():
    """``seam.segments`` and ``seam show`` pass only the mask options and
    ``require_outcome=False``; a build passes every option (pipeline/build/config.py)."""
    assert RowOptions() == RowOptions(
        mask=MaskOptions(),
        drop_truncated=False,
        require_outcome=True,
        keep_damaged=False,
        exclude_fidelity=frozenset(),
    )
    assert RowBatch().require_outcome is True
    with pytest.raises(dataclasses.FrozenInstanceError):  # one object serves every worker
        RowOptions().drop_truncated = True  # type: ignore[misc]
