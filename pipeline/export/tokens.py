"""Prompt/response views of a segment, shared by every export target.

Trainers that separate a prompt from a response (TRL GRPO, verl, slime) get the
segment cut where the policy first wrote: the prompt is everything before the first
call's output, the response is the rest. The response still holds the observations
between the segment's calls; its mask (the shard's ``loss_mask`` from that point on)
is 0 there, so the masked tokens are exactly the shard's trainable tokens.

The cut is done on whole Arrow columns with numpy (no Python loop over tokens).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Every export carries each row's context fidelity as the shard has it (docs/data.md,
# "Context fidelity"; the second witness's tokens): a trainer can weight or drop by it.
FIDELITY_FIELDS = [
    pa.field("context_fidelity", pa.list_(pa.string())),
    pa.field("context_gap_tokens", pa.int32()),
]
FIDELITY_COLUMNS = [f.name for f in FIDELITY_FIELDS]


def fidelity_columns(shard: pa.Table) -> list[pa.Array]:
    """The shard's ``FIDELITY_COLUMNS``; nulls for a build from before a column existed."""
    return [
        shard[f.name].combine_chunks()
        if f.name in shard.column_names
        else pa.nulls(shard.num_rows, f.type)
        for f in FIDELITY_FIELDS
    ]


def response_starts(table: pa.Table) -> np.ndarray:
    """Per row: the index in ``input_ids`` of the first generated token of the segment."""
    first_call = pc.list_element(table["call_spans"].combine_chunks(), 0)
    return pc.struct_field(first_call, "start").to_numpy(zero_copy_only=False).astype(np.int64)


def split_lists(
    column: pa.ChunkedArray | pa.Array, at: np.ndarray
) -> tuple[pa.ListArray, pa.ListArray]:
    """Each row's list cut into ``[:at]`` and ``[at:]``; a null row stays null in both."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    lengths = array.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    at = np.minimum(np.where(valid, at, 0), lengths)
    values = array.flatten()
    position_in_row = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    in_head = position_in_row < np.repeat(at, lengths)
    mask = None if valid.all() else pa.array(~valid)
    head = pa.ListArray.from_arrays(_offsets(at), values.filter(pa.array(in_head)), mask=mask)
    tail = pa.ListArray.from_arrays(
        _offsets(lengths - at), values.filter(pa.array(~in_head)), mask=mask
    )
    return head, tail


def _offsets(lengths: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.array(offsets, type=pa.int32())
