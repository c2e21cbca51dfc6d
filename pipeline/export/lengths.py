"""How much of a build each sequence-length cutoff keeps.

Trainers cut or drop sequences longer than their ``max_length`` (TRL SFT's default is
1,024 tokens, verl's prompt and response limits are set per run), usually without a
word. ``length_table`` counts, per cutoff, the rows (segments) and trainable tokens a
build keeps when rows longer than the cutoff are left out; exports print it and write it
into ``export.json`` and the export's README, and ``--max-length`` leaves those rows out
with the count said, never silently. The report (``seam report``) plots the same counts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CUTOFFS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def row_lengths(shards: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """``num_tokens`` and ``num_trainable_tokens`` of every row, in build order."""
    tables = [pq.read_table(s, columns=["num_tokens", "num_trainable_tokens"]) for s in shards]
    if not tables:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    table = pa.concat_tables(tables)
    return (
        table["num_tokens"].to_numpy().astype(np.int64),
        table["num_trainable_tokens"].to_numpy().astype(np.int64),
    )


def length_table(
    tokens: np.ndarray, trainable: np.ndarray, cutoffs=CUTOFFS, extra: int | None = None
) -> list[dict]:
    """For each cutoff (and ``extra``, e.g. the chosen ``--max-length``): rows and
    trainable tokens kept by leaving out rows longer than it, and their shares."""
    rows, total_trainable = len(tokens), int(trainable.sum())
    points = sorted({*cutoffs, *([extra] if extra else [])})
    out = []
    for cutoff in points:
        keep = tokens <= cutoff
        kept_trainable = int(trainable[keep].sum())
        out.append(
            {
                "max_length": cutoff,
                "rows": int(keep.sum()),
                "rows_share": float(keep.mean()) if rows else 1.0,
                "trainable_tokens": kept_trainable,
                "trainable_share": kept_trainable / total_trainable if total_trainable else 1.0,
            }
        )
    return out


def markdown(table: list[dict], total_rows: int, total_trainable: int) -> list[str]:
    lines = [
        f"| max length | rows kept (of {total_rows:,}) | trainable tokens kept (of {total_trainable:,}) |",
        "|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['max_length']:,} | {r['rows']:,} ({r['rows_share']:.1%}) | "
            f"{r['trainable_tokens']:,} ({r['trainable_share']:.1%}) |"
        )
    return lines
