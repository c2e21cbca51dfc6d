"""The shard contract: one explicit Arrow schema, one row per segment.

Every column is documented here and in the README ("Shard columns"); the schema is
versioned with ``SHARD_SCHEMA_VERSION`` and written into each file's metadata, so
``datasets``, Polars and DuckDB restore the exact types.
"""

from __future__ import annotations

import pyarrow as pa

# 1.1: context_gap_tokens (the second witness, pipeline/core/witness.py) and the reason
# unexplained_context_gap in context_fidelity.
SHARD_SCHEMA_VERSION = "1.1"

CALL_SPAN = pa.struct(
    [
        ("call_index", pa.int32()),  # index of the call among the rollout's assistant calls
        ("kind", pa.string()),  # "action" | "summary"
        ("start", pa.int32()),  # first token of the call's output in input_ids
        ("length", pa.int32()),  # output tokens (end-of-turn token included)
        (
            "trained",
            pa.bool_(),
        ),  # False when masked by an option (--mask-summaries, --last-call-only)
        ("truncated", pa.bool_()),  # the output was cut by the length limit
    ]
)

COLUMNS: list[tuple[str, pa.DataType, bool, str]] = [
    ("rollout_id", pa.string(), False, "Id of the rollout this segment comes from."),
    ("task_id", pa.string(), False, "Task (GRPO group key)."),
    ("source", pa.string(), False, "Reader or simulator that produced the rollout."),
    ("model", pa.string(), True, "Policy model name when recorded."),
    ("segment_index", pa.int32(), False, "0-based position of the segment in its rollout."),
    (
        "num_segments",
        pa.int32(),
        False,
        "Segments of the rollout (after options that drop segments).",
    ),
    (
        "input_ids",
        pa.list_(pa.int32()),
        False,
        "The segment's token sequence: last call's input + its output.",
    ),
    (
        "loss_mask",
        pa.list_(pa.int8()),
        False,
        "1 on tokens the policy generated in this segment, else 0.",
    ),
    (
        "logprobs",
        pa.list_(pa.float32()),
        True,
        "Sampling log-probs aligned with input_ids (0 off the mask); null unless every trained call logged them.",
    ),
    ("reward", pa.float32(), False, "Rollout's terminal reward (shared by all its segments)."),
    (
        "advantage",
        pa.float32(),
        False,
        "GRPO shared outcome advantage of the rollout, over rollouts of the task.",
    ),
    ("group_size", pa.int32(), False, "Rollouts in the task's group (1 → advantage 0)."),
    ("num_tokens", pa.int32(), False, "len(input_ids)."),
    ("num_trainable_tokens", pa.int32(), False, "n_s: sum(loss_mask)."),
    (
        "trainable_tokens_after",
        pa.int32(),
        False,
        "N_{>s}: trainable tokens of later segments of the same rollout.",
    ),
    (
        "rollout_trainable_tokens",
        pa.int32(),
        False,
        "Trainable tokens of the whole rollout (all segments).",
    ),
    (
        "loss_weight_per_rollout",
        pa.float32(),
        False,
        "1/num_segments: per-sample weight that makes a rollout count once.",
    ),
    ("num_calls", pa.int32(), False, "Policy calls in this segment."),
    ("call_spans", pa.list_(CALL_SPAN), False, "Where each call's output lies in input_ids."),
    ("num_compactions", pa.int32(), False, "Compactions in the whole rollout (not edits)."),
    (
        "seam_kind",
        pa.string(),
        False,
        "Seam that starts this segment: none | compaction | edit | truncation | template | "
        "divergence.",
    ),
    ("seam_trigger", pa.string(), True, "budget | model | manual for rewrite seams, else null."),
    (
        "drift_realigned",
        pa.int32(),
        False,
        "Re-tokenization drifts inside the last output realigned (not split) in this segment.",
    ),
    ("truncated", pa.bool_(), False, "Some call of this segment was cut by the length limit."),
    ("resolved", pa.bool_(), True, "Task outcome when recorded."),
    ("parent_rollout_id", pa.string(), True, "Sub-agent rollouts: the parent rollout."),
    (
        "num_context_edits",
        pa.int32(),
        False,
        "Context edits (rewrites with reason edit, e.g. Claude Code microcompactions) in the "
        "whole rollout; counted apart from compactions.",
    ),
    (
        "context_fidelity",
        pa.list_(pa.string()),
        False,
        "['exact'] when the segment's context is exactly what the model received, else the "
        "sorted reasons it is not (slice_start, opaque_summary, lost_records, "
        "unexplained_context_gap, ...; docs/data.md).",
    ),
    (
        "reported_input_tokens",
        pa.list_(pa.int32()),
        False,
        "Per call (aligned with call_spans): input tokens the provider reported (cache "
        "included), null where the log has no usage; rebuilt input = call_spans[i].start.",
    ),
    (
        "context_gap_tokens",
        pa.int32(),
        True,
        "Second witness: tokens by which the reported input growth between two calls of the "
        "segment departs from the rebuilt growth, summed over the pairs over the threshold "
        "(0: every witnessed pair agrees; null: no pair had reported counts; docs/data.md).",
    ),
]

SHARD_SCHEMA = pa.schema(
    [
        pa.field(name, dtype, nullable=nullable, metadata={"doc": doc})
        for name, dtype, nullable, doc in COLUMNS
    ],
    metadata={"seam.shard_schema_version": SHARD_SCHEMA_VERSION},
)


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth dictionary encoding in Parquet: the top-level strings (ids, kinds),
    which repeat. Token ids are not: with a vocabulary of ~150k their dictionary pages
    overflow and fall back to plain pages anyway, and trying costs twice the write time
    of plain zstd pages, which are also smaller (measured on the sample: 1.8 vs 2.5 MB)."""
    return [
        f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
    ]
