"""slime: one ``Sample`` dict per segment, as JSON lines.

Each line is what ``slime.utils.types.Sample.to_dict()`` produces for the fields seam
knows, so ``Sample.from_dict(json.loads(line))`` rebuilds the sample (missing fields
take their defaults). The fields follow slime's compact/sub-agent convention
(``slime/agent/trajectory.py``): ``tokens`` is the whole segment, ``response_length``
counts the tokens from the first generated one, and ``loss_mask`` and
``rollout_log_probs`` cover only that response part. Segments of one rollout are
siblings: they share ``rollout_id`` (so slime averages the loss within the rollout
instead of counting it once per segment) and ``group_index`` is the task's group.
Integer ids are ordinals in build order; the string ids are in ``metadata``.

slime loads saved rollouts with ``--load-debug-rollout-data PATH``, a ``torch.save``
of ``{"rollout_id": step, "samples": [sample dicts]}``; docs/data.md shows the
three-line conversion.
"""

from __future__ import annotations

import json
from typing import IO

import pyarrow as pa

from pipeline.export.tokens import FIDELITY_COLUMNS, fidelity_columns, response_starts

METADATA = [
    "task_id",
    "segment_index",
    "num_segments",
    "advantage",
    "group_size",
    "seam_kind",
    "seam_trigger",
    "num_compactions",
    "num_trainable_tokens",
    "trainable_tokens_after",
    "loss_weight_per_rollout",
    *FIDELITY_COLUMNS,
]


class SampleWriter:
    """Writes the sample dicts of successive shards; keeps the id ordinals across shards."""

    def __init__(self, fh: IO[str]):
        self.fh = fh
        self.rollout_ordinals: dict[str, int] = {}
        self.group_ordinals: dict[str, int] = {}
        self.index = 0

    def write(self, shard: pa.Table) -> None:
        starts = response_starts(shard)
        for name, column in zip(FIDELITY_COLUMNS, fidelity_columns(shard)):
            if name not in shard.column_names:  # a build from before the column existed
                shard = shard.append_column(name, column)
        columns = [
            "rollout_id",
            "input_ids",
            "loss_mask",
            "logprobs",
            "reward",
            "truncated",
            *METADATA,
        ]
        for start, row in zip(starts, shard.select(columns).to_pylist()):
            self.fh.write(json.dumps(self._sample(int(start), row), ensure_ascii=False) + "\n")
            self.index += 1

    def _sample(self, start: int, row: dict) -> dict:
        rollout = self.rollout_ordinals.setdefault(row["rollout_id"], len(self.rollout_ordinals))
        group = self.group_ordinals.setdefault(row["task_id"], len(self.group_ordinals))
        tokens = row["input_ids"]
        return {
            "group_index": group,
            "index": self.index,
            "rollout_id": rollout,
            "tokens": tokens,
            "response_length": len(tokens) - start,
            "loss_mask": row["loss_mask"][start:],
            "rollout_log_probs": row["logprobs"][start:] if row["logprobs"] is not None else None,
            "reward": row["reward"],
            "status": "truncated" if row["truncated"] else "completed",
            "metadata": {"seam_rollout_id": row["rollout_id"], **{k: row[k] for k in METADATA}},
        }
