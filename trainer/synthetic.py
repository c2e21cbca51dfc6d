"""Synthetic RL shards in the real shard schema, for the GPU benchmark and the tests.

A rollout is described by its segments' shapes ``(context_tokens, generated_tokens)``:
each segment is one call whose input is ``context_tokens`` random tokens and whose
output is ``generated_tokens`` trainable tokens. Every column of ``SHARD_SCHEMA`` is
filled consistently (n_s, N_{>s}, 1/num_segments, call spans), so the trainer reads
these files exactly like ``seam build-rl`` output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.shard_schema import SHARD_SCHEMA

Shape = tuple[int, int]


def rollout_rows(
    rollout_id: str,
    shapes: list[Shape],
    reward: float,
    rng: np.random.Generator,
    vocab_size: int,
    with_logprobs: bool,
) -> list[dict]:
    generated = [g for _, g in shapes]
    rows = []
    for s, (context, gen) in enumerate(shapes):
        n = context + gen
        mask = np.r_[np.zeros(context, np.int8), np.ones(gen, np.int8)]
        logprobs = None
        if with_logprobs:
            logprobs = (
                np.where(mask == 1, -rng.uniform(0.05, 3.0, n), 0.0).astype(np.float32).tolist()
            )
        rows.append(
            dict(
                rollout_id=rollout_id,
                task_id=f"task-{rollout_id}",
                source="synthetic",
                model=None,
                segment_index=s,
                num_segments=len(shapes),
                input_ids=rng.integers(0, vocab_size, n, dtype=np.int32).tolist(),
                loss_mask=mask.tolist(),
                logprobs=logprobs,
                reward=reward,
                advantage=0.0,
                group_size=1,
                num_tokens=n,
                num_trainable_tokens=gen,
                trainable_tokens_after=int(sum(generated[s + 1 :])),
                rollout_trainable_tokens=int(sum(generated)),
                loss_weight_per_rollout=1.0 / len(shapes),
                num_calls=1,
                call_spans=[
                    dict(
                        call_index=s,
                        kind="action",
                        start=context,
                        length=gen,
                        trained=True,
                        truncated=False,
                    )
                ],
                num_compactions=len(shapes) - 1,
                num_context_edits=0,
                seam_kind="none" if s == 0 else "compaction",
                seam_trigger=None if s == 0 else "budget",
                drift_realigned=0,
                truncated=False,
                resolved=reward > 0,
                parent_rollout_id=None,
            )
        )
    return rows


def write_synthetic_shard(
    out_dir: str | Path,
    rollouts: list[list[Shape]],
    vocab_size: int,
    seed: int = 0,
    with_logprobs: bool = False,
) -> Path:
    """One ``train-00000-of-00001.parquet`` in ``out_dir``; rewards alternate 1, 0, 1, ..."""
    rng = np.random.default_rng(seed)
    rows = [
        row
        for k, shapes in enumerate(rollouts)
        for row in rollout_rows(
            f"r{k:04d}", shapes, float(k % 2 == 0), rng, vocab_size, with_logprobs
        )
    ]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), path, compression="zstd")
    return path
