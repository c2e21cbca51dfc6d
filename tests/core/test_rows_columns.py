"""The rows' columns made the fast way equal the straightforward way (property tests).

- ``mask_segment`` makes a logprobs array only when it is used and counts n_s once: the
  reference below is the per-span algorithm it replaced (one float32 array per segment,
  always; n_s summed from the mask on every read).
- ``RowBatch.group_rows`` (the build's GRPO group table) is what reading the task's
  table back gives: the rows whose ``segment_index`` is 0, their ids, float32 reward
  (NaN → None) and ordinal, as ``worker.group_table`` made it before.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.build.worker import group_table
from pipeline.core.mask import MaskOptions, mask_segment
from pipeline.core.rows import ROLLOUT_ORDINAL, RowBatch, RowOptions, masked_segments
from pipeline.core.seams import CallSpan, Segment
from pipeline.core.segment import Segmenter
from tests.strategies import rollouts

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EOS = 7


def reference_mask(seg: Segment, options: MaskOptions, logged_output: list[bool]):
    """Token by token: (loss mask, logprobs or None, trained flags). A trained span's
    tokens are 1, except the end-of-turn token a template added to a truncated output
    that was rendered, not logged; logprobs exist when every trained span logged them."""
    last = len(seg.spans) - 1
    trained = [
        not (options.mask_summaries and s.kind == "summary")
        and not (options.last_call_only and j != last)
        for j, s in enumerate(seg.spans)
    ]
    mask = [0] * len(seg.tokens)
    logprobs = [0.0] * len(seg.tokens)
    for span, train, logged in zip(seg.spans, trained, logged_output):
        if not train:
            continue
        positions = list(range(span.start, span.start + span.length))
        for k, i in enumerate(positions):
            if span.logprobs is not None:
                logprobs[i] = float(span.logprobs[k])
        if span.truncated and not logged and positions and seg.tokens[positions[-1]] == EOS:
            positions.pop()  # the template's end-of-turn token, never sampled
        for i in positions:
            mask[i] = 1
    with_logprobs = any(trained) and all(
        s.logprobs is not None for s, t in zip(seg.spans, trained) if t
    )
    return (
        np.asarray(mask, dtype=np.int8),
        np.asarray(logprobs, dtype=np.float32) if with_logprobs else None,
        trained,
    )


@st.composite
def segments(draw) -> tuple[Segment, list[bool]]:
    """A segment of context runs and call outputs (some ending in EOS, some truncated,
    some with logprobs) and, per span, whether its output was logged."""
    tokens: list[int] = []
    spans = []
    for index in range(draw(st.integers(0, 5))):
        tokens += draw(st.lists(st.integers(0, 9), max_size=4))  # context before the call
        # often ending in EOS: a truncated one, rendered, has it masked out
        out = draw(st.lists(st.integers(0, 9), max_size=4)) + draw(st.sampled_from([[], [EOS]]))
        logprobs = draw(
            st.none() | st.lists(st.floats(-5, 0, width=32), min_size=len(out), max_size=len(out))
        )
        spans.append(
            CallSpan(
                index,
                draw(st.sampled_from(["action", "summary"])),
                len(tokens),
                len(out),
                draw(st.booleans()),
                None if logprobs is None else np.asarray(logprobs, dtype=np.float32),
            )
        )
        tokens += out
    seg = Segment(np.asarray(tokens, dtype=np.int32), spans, "none", None, 0)
    return seg, draw(st.lists(st.booleans(), min_size=len(spans), max_size=len(spans)))


@SETTINGS
@given(segments(), st.booleans(), st.booleans())
def test_mask_is_the_per_span_reference(segment, mask_summaries, last_call_only):
    seg, logged = segment
    options = MaskOptions(mask_summaries, last_call_only)
    masked = mask_segment(seg, options, EOS, logged)
    mask, logprobs, trained = reference_mask(seg, options, logged)
    assert np.array_equal(masked.loss_mask, mask) and masked.loss_mask.dtype == np.int8
    assert masked.trained == trained
    assert masked.num_trainable_tokens == int(mask.sum())
    if logprobs is None:
        assert masked.logprobs is None
    else:
        assert masked.logprobs is not None and masked.logprobs.dtype == np.float32
        assert np.array_equal(masked.logprobs, logprobs)


def groups_read_back(batch: RowBatch) -> list[tuple]:
    """The group table as the worker read it from the task's table before."""
    table = batch.to_table()
    first = table.filter(pc.equal(table["segment_index"], 0))
    return list(
        zip(
            first["rollout_id"].to_pylist(),
            first["parent_rollout_id"].to_pylist(),
            first["task_id"].to_pylist(),
            [None if math.isnan(r) else r for r in first["reward"].to_pylist()],
            first[ROLLOUT_ORDINAL].to_pylist(),
        )
    )


REWARDS = st.one_of(
    st.none(),  # no outcome: NaN in the column (builds that do not require one)
    st.floats(allow_nan=False, allow_infinity=False),  # past float32's range: inf
    st.sampled_from([0.0, 1.0, 0.1, -1 / 3, 3.4028235e38, 1e39]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(rollouts(), REWARDS, st.sampled_from(["a", "b"]), st.booleans(), st.booleans()),
        min_size=1,
        max_size=4,
    )
)
def test_group_rows_are_the_tables_first_segments_read_back(renderer, drawn):
    segmenter = Segmenter(renderer)
    batch = RowBatch(require_outcome=False)
    rowless = []
    for ordinal, (rollout, reward, task, sub_agent, keep) in enumerate(drawn):
        rollout = rollout.model_copy(
            update={
                "rollout_id": f"r{ordinal}",
                "task_id": task,
                "reward": reward,
                "parent_rollout_id": "r0" if sub_agent and ordinal else None,
            }
        )
        masked = masked_segments(rollout, segmenter, RowOptions())[0] if keep else []
        batch.add_rollout(rollout, ordinal, masked)
        if not masked:
            rowless.append((rollout.rollout_id, None, task, reward, ordinal))
    assert batch.group_rows() == groups_read_back(batch)
    table = group_table(batch.group_rows(), rowless)
    assert table["ordinal"] == [g[4] for g in groups_read_back(batch)] + [r[4] for r in rowless]
    assert table["reward"][len(batch.group_rows()) :] == [r[3] for r in rowless]
