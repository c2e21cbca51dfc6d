"""Rollout → segment rows: cut it into segments (``segment.py``), mask each one
(``mask.py``) and lay the rows out column by column.

``masked_segments`` does the first two for one rollout (and drops truncated segments
under ``drop_truncated``, counting them). ``RowBatch`` collects the rows of a task's
rollouts column-wise and becomes one Arrow table with an explicit schema — the shard
schema plus the internal ``_rollout_ordinal`` — that the worker writes as a part file
(``worker.py``); no schema is ever inferred. The columns that depend on the rollout's
task group (``advantage``, ``group_size``) are placeholders here: ``write.py`` fills
them once every task is done, joining on the rollout ordinal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.core.advantage import trainable_tokens_after
from pipeline.core.fidelity import (
    UnknownReason,
    check_reasons,
    reported_input_tokens,
    segment_fidelity,
    segment_witnesses,
)
from pipeline.core.mask import MaskedSegment, MaskOptions, mask_segment
from pipeline.core.segment import Segmenter
from pipeline.core.shard_schema import CALL_SPAN, SHARD_SCHEMA
from schemas.rollout import RewriteEvent, Rollout

# Part files carry one internal column: the rollout's ordinal inside the part, the key
# that joins rows to their rollout's group advantage when the build is finalized.
ROLLOUT_ORDINAL = "_rollout_ordinal"
PART_SCHEMA = SHARD_SCHEMA.append(pa.field(ROLLOUT_ORDINAL, pa.int64(), nullable=False))


@dataclass(frozen=True)
class RowOptions:
    mask: MaskOptions = MaskOptions()
    drop_truncated: bool = False
    # RL needs an outcome for every rollout; SFT trains on corrected trajectories whose
    # outcome may be unknown (reward NaN, advantage 0).
    require_outcome: bool = True
    # A damaged rollout (a lost or undecodable record: pipeline/core/fidelity.py DAMAGE) is
    # quarantined unless this is set; kept, its segments carry the reason.
    keep_damaged: bool = False
    # Segments whose context_fidelity names one of these reasons are left out (counted
    # per reason, like --drop-truncated: the rollout keeps its GRPO vote).
    exclude_fidelity: frozenset[str] = frozenset()


class RejectedRollout(ValueError):
    """The rollout is valid but cannot become rows (reason in the message)."""


def rollout_reward(rollout: Rollout) -> float:
    if rollout.reward is not None:
        return float(rollout.reward)
    if rollout.resolved is not None:
        return 1.0 if rollout.resolved else 0.0
    raise RejectedRollout(
        "no reward and no resolved outcome: RL needs one (join them with --rewards FILE)"
    )


def call_span_rows(masked: MaskedSegment) -> list[dict]:
    """The ``call_spans`` column of one segment: where each call's output lies, and whether
    it is trained."""
    return [
        {
            "call_index": s.call_index,
            "kind": s.kind,
            "start": s.start,
            "length": s.length,
            "trained": t,
            "truncated": s.truncated,
        }
        for s, t in zip(masked.segment.spans, masked.trained)
    ]


def masked_segments(
    rollout: Rollout, segmenter: Segmenter, options: RowOptions
) -> tuple[list[MaskedSegment], int]:
    """The rollout's masked segments (after ``drop_truncated``) and how many were dropped.
    A rollout naming a fidelity reason seam does not know is rejected."""
    try:
        check_reasons(rollout)
    except UnknownReason as exc:
        raise RejectedRollout(str(exc)) from None
    calls = rollout.calls()
    segments = segmenter.segments(rollout)
    masked = []
    for seg in segments:
        logged = [calls[s.call_index].output_ids is not None for s in seg.spans]
        masked.append(mask_segment(seg, options.mask, segmenter.renderer.eos_id, logged))
    kept = [
        m
        for m in masked
        if not (options.drop_truncated and any(s.truncated for s in m.segment.spans))
    ]
    return kept, len(masked) - len(kept)


EXCLUDED = "excluded_segments"  # build count: segments left out by --exclude-fidelity
EXCLUDED_PREFIX = "excluded_fidelity_"  # and per reason (a segment counts under each)


def exclude_by_fidelity(
    rollout: Rollout, segments: list[MaskedSegment], exclude: frozenset[str]
) -> tuple[list[MaskedSegment], dict[str, int]]:
    """The segments whose ``context_fidelity`` names none of ``exclude``, and the build
    counts of the others (``excluded_segments`` and one ``excluded_fidelity_<reason>``
    per excluded reason they carry). A segment's fidelity depends on its own calls only,
    so the kept segments keep theirs; like ``--drop-truncated``, the rollout keeps its
    reward and its vote in its GRPO group even when every segment is excluded."""
    if not exclude or not segments:
        return segments, {}
    fidelity = segment_fidelity(rollout, [m.segment for m in segments])
    kept: list[MaskedSegment] = []
    counts: dict[str, int] = {}
    for m, reasons in zip(segments, fidelity):
        hit = exclude.intersection(reasons)
        if not hit:
            kept.append(m)
            continue
        counts[EXCLUDED] = counts.get(EXCLUDED, 0) + 1
        for reason in hit:
            counts[EXCLUDED_PREFIX + reason] = counts.get(EXCLUDED_PREFIX + reason, 0) + 1
    return kept, counts


class RowBatch:
    """Column buffers for the rows of many rollouts."""

    def __init__(self, extra_fields=(), require_outcome: bool = True):
        self.require_outcome = require_outcome
        # Extra columns come from a build stage (e.g. the SFT columns); values via add_extra.
        self.schema = pa.schema([*PART_SCHEMA, *extra_fields], metadata=PART_SCHEMA.metadata)
        self.cols: dict[str, list] = {f.name: [] for f in self.schema}
        self.token_chunks: list[np.ndarray | None] = []
        self.mask_chunks: list[np.ndarray | None] = []
        self.logprob_chunks: list[np.ndarray | None] = []
        self.num_rows = 0
        # Per rollout with rows, in ordinal order: (rollout id, parent id, task id, reward,
        # ordinal), for the build's GRPO groups (``group_rows``).
        self._groups: list[tuple] = []
        self.last_fidelity: list[list[str]] = []  # context_fidelity of the rollout added last
        self.last_witnesses: list = []  # and its segments' second witness (pipeline/core/witness.py)

    def add_rollout(self, rollout: Rollout, ordinal: int, segments: list[MaskedSegment]) -> None:
        if self.require_outcome or rollout.reward is not None or rollout.resolved is not None:
            reward = rollout_reward(rollout)
        else:
            reward = float("nan")
        self.last_fidelity, self.last_witnesses = [], []
        if not segments:
            return
        n_s = [m.num_trainable_tokens for m in segments]
        after = trainable_tokens_after(n_s)
        rewrites = [e.reason for e in rollout.events if isinstance(e, RewriteEvent)]
        compactions, edits = rewrites.count("compaction"), rewrites.count("edit")
        calls = rollout.calls()
        segs = [m.segment for m in segments]
        witnessed = segment_witnesses(rollout, segs, calls)
        fidelity = segment_fidelity(rollout, segs, witnessed)
        self.last_fidelity = fidelity
        self.last_witnesses = witnessed
        self._groups.append(
            (rollout.rollout_id, rollout.parent_rollout_id, rollout.task_id, reward, ordinal)
        )
        for index, (m, n, tail, fid, wit) in enumerate(
            zip(segments, n_s, after, fidelity, witnessed)
        ):
            seg = m.segment
            c = self.cols
            c["rollout_id"].append(rollout.rollout_id)
            c["task_id"].append(rollout.task_id)
            c["source"].append(rollout.source)
            c["model"].append(rollout.model)
            c["segment_index"].append(index)
            c["num_segments"].append(len(segments))
            c["reward"].append(reward)
            c["advantage"].append(0.0)
            c["group_size"].append(0)
            c["num_tokens"].append(len(seg.tokens))
            c["num_trainable_tokens"].append(n)
            c["trainable_tokens_after"].append(tail)
            c["rollout_trainable_tokens"].append(sum(n_s))
            c["loss_weight_per_rollout"].append(1.0 / len(segments))
            c["num_calls"].append(len(seg.spans))
            c["call_spans"].append(call_span_rows(m))
            c["num_compactions"].append(compactions)
            c["num_context_edits"].append(edits)
            c["seam_kind"].append(seg.seam_kind)
            c["seam_trigger"].append(seg.seam_trigger)
            c["drift_realigned"].append(seg.drift_realigned)
            c["truncated"].append(any(s.truncated for s in seg.spans))
            c["resolved"].append(rollout.resolved)
            c["parent_rollout_id"].append(rollout.parent_rollout_id)
            c["context_fidelity"].append(fid)
            c["reported_input_tokens"].append(reported_input_tokens(rollout, seg, calls))
            c["context_gap_tokens"].append(wit.gap_tokens)
            c[ROLLOUT_ORDINAL].append(ordinal)
            self.token_chunks.append(seg.tokens)
            self.mask_chunks.append(m.loss_mask)
            self.logprob_chunks.append(m.logprobs)
            self.num_rows += 1

    def group_rows(self) -> list[tuple]:
        """One row per rollout with rows, in ordinal order: (rollout id, parent id, task
        id, reward, ordinal), the reward as the float32 ``reward`` column holds it (None
        for NaN: no outcome) — what reading the table's first segments back would give,
        without building or filtering the table (``worker.group_table``)."""
        rewards = np.array([g[3] for g in self._groups], dtype=np.float64)
        with np.errstate(over="ignore"):  # past float32's range: inf, as in the column
            stored = rewards.astype(np.float32).tolist()
        return [(*g[:3], None if math.isnan(r) else r, g[4]) for g, r in zip(self._groups, stored)]

    def add_extra(self, values: dict[str, list]) -> None:
        """Extra column values for the rows of the rollout added last."""
        for name, column in values.items():
            self.cols[name].extend(column)

    def to_table(self) -> pa.Table:
        arrays = []
        for f in self.schema:
            if f.name == "input_ids":
                arrays.append(_list_array(self.token_chunks, pa.int32(), np.int32))
            elif f.name == "loss_mask":
                arrays.append(_list_array(self.mask_chunks, pa.int8(), np.int8))
            elif f.name == "logprobs":
                arrays.append(_list_array(self.logprob_chunks, pa.float32(), np.float32))
            elif f.name == "call_spans":
                arrays.append(pa.array(self.cols[f.name], type=pa.list_(CALL_SPAN)))
            else:
                arrays.append(pa.array(self.cols[f.name], type=f.type))
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _list_array(chunks: list[np.ndarray | None], arrow_type: pa.DataType, np_type) -> pa.Array:
    """A list array from numpy chunks without a Python loop over elements; None → null."""
    lengths = np.fromiter(
        (0 if c is None else len(c) for c in chunks), dtype=np.int64, count=len(chunks)
    )
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [c for c in chunks if c is not None]
    values = (
        np.concatenate(present).astype(np_type, copy=False)
        if present
        else np.zeros(0, dtype=np_type)
    )
    mask = None
    if len(present) != len(chunks):
        mask = pa.array([c is None for c in chunks], type=pa.bool_())
    return pa.ListArray.from_arrays(
        pa.array(offsets, type=pa.int32()), pa.array(values, type=arrow_type), mask=mask
    )
