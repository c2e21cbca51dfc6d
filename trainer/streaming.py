"""Streaming shards: an index of the build, a plan per rank, and reading only a step's rows.

``read_segments`` holds the whole build (~10.5 bytes per token). Here the build is read
once as an **index**: for every row its file, row group and row within the group, plus
``rollout_id``, ``segment_index``, ``num_tokens`` and ``num_trainable_tokens`` — four
scalar columns, read row group by row group, never the token lists. The step plan
(``batching.plan_steps`` over the index) is a pure function of index, config and seed,
so every rank computes the same plan with no communication. Each step is then split
over ranks (``split_step``) and each rank reads only its rows (``read_rows``): memory
per rank is bounded by the step, not by the build.

Rank balance: a segment of L tokens costs ``L + L²/quadratic_tokens`` — linear layers
cost per token, attention per token pair, and for a decoder with hidden size h the
pairwise term matches the linear one near L ≈ 6h (attention ``4·h·L`` FLOPs per token
against ``24·h²`` for the projections and MLP), so ``quadratic_tokens`` defaults to 8192.
Segments go largest cost first to the least-loaded rank (LPT, ties to the lower rank).
Every rank then packs its segments (``batching.pack_bins``) and all ranks run the same
number of micro-batches: a rank with fewer is padded with empty ones, so collectives
inside the forward and backward (FSDP's all-gathers and reduce-scatters) always pair up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from trainer.batching import (
    COLUMNS,
    TrainingSegment,
    pack_bins,
    rollout_order,
    segments_from_table,
    shard_files,
)

INDEX_COLUMNS = ["rollout_id", "segment_index", "num_tokens", "num_trainable_tokens"]
QUADRATIC_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """Where one segment lies in the build, and its size; no tokens."""

    file: int  # index into ShardIndex.files
    row_group: int
    row: int  # row within the row group
    rollout_id: str
    segment_index: int
    num_tokens: int
    num_trainable_tokens: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.rollout_id, self.segment_index)


@dataclass(frozen=True)
class ShardIndex:
    files: tuple[Path, ...]
    segments: tuple[
        SegmentRef, ...
    ]  # by rollout (first appearance), then segment: read_segments' order


def build_index(shards_dir: str | Path) -> ShardIndex:
    """The index of ``DIR/train-*.parquet``: ``INDEX_COLUMNS`` of every row, one row group at a time."""
    files = shard_files(shards_dir)
    refs: list[SegmentRef] = []
    for f, path in enumerate(files):
        shard = pq.ParquetFile(path)
        for g in range(shard.metadata.num_row_groups):
            cols = shard.read_row_group(g, columns=INDEX_COLUMNS).to_pydict()
            for r, (rid, seg, n, m) in enumerate(zip(*(cols[c] for c in INDEX_COLUMNS))):
                if rid is None or seg is None or n is None or m is None:
                    raise ValueError(
                        f"{path}: row group {g} row {r}: {', '.join(INDEX_COLUMNS)} must not be null"
                    )
                refs.append(SegmentRef(f, g, r, rid, int(seg), int(n), int(m)))
    order = rollout_order([ref.key for ref in refs])
    return ShardIndex(tuple(files), tuple(refs[i] for i in order))


def segment_cost(num_tokens: int, quadratic_tokens: int = QUADRATIC_TOKENS) -> float:
    """Relative compute of a segment: ``L + L²/quadratic_tokens`` (module docstring)."""
    return num_tokens + num_tokens * num_tokens / quadratic_tokens


@dataclass(frozen=True)
class RankStep:
    """One rank's share of a step: its segments, and micro-batches as indices into them.

    ``micro_batches`` has the same length on every rank; trailing ``[]`` are padding.
    """

    segments: tuple[SegmentRef, ...]
    micro_batches: tuple[tuple[int, ...], ...]


def split_step(
    step: Sequence[SegmentRef],
    world_size: int,
    micro_batch_tokens: int,
    quadratic_tokens: int = QUADRATIC_TOKENS,
) -> list[RankStep]:
    """Assign a step's segments to ranks by cost, pack each rank's, pad to a common count.

    Pure: every rank calls it on the same step and takes its own entry. A rank's segments
    keep their order in the step; with one rank the micro-batches are ``pack``'s.
    """
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    loads = [0.0] * world_size
    owner = [0] * len(step)
    by_cost = sorted(
        range(len(step)), key=lambda i: (-segment_cost(step[i].num_tokens, quadratic_tokens), i)
    )
    for i in by_cost:
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        owner[i] = rank
        loads[rank] += segment_cost(step[i].num_tokens, quadratic_tokens)
    shares = [[step[i] for i in range(len(step)) if owner[i] == r] for r in range(world_size)]
    bins = [pack_bins([s.num_tokens for s in share], micro_batch_tokens) for share in shares]
    count = max(len(b) for b in bins)
    return [
        RankStep(tuple(share), tuple(tuple(m) for m in b) + ((),) * (count - len(b)))
        for share, b in zip(shares, bins)
    ]


def read_rows(index: ShardIndex, refs: Sequence[SegmentRef]) -> list[TrainingSegment]:
    """The segments of ``refs``, in that order, reading only the row groups that hold them.

    Each row is checked against its index entry (same rollout, segment, token counts), so
    shards rewritten after indexing fail with a one-line error instead of training on
    the wrong rows.
    """
    wanted: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, ref in enumerate(refs):
        wanted[(ref.file, ref.row_group)].append(k)
    out: list[TrainingSegment | None] = [None] * len(refs)
    for (f, g), ks in sorted(wanted.items()):
        path = index.files[f]
        group = pq.ParquetFile(path).read_row_group(g, columns=COLUMNS)
        rows = group.take([refs[k].row for k in ks])
        for k, seg in zip(ks, segments_from_table(path, rows)):
            ref = refs[k]
            if (seg.rollout_id, seg.segment_index, seg.num_tokens, seg.num_trainable_tokens) != (
                ref.rollout_id,
                ref.segment_index,
                ref.num_tokens,
                ref.num_trainable_tokens,
            ):
                raise ValueError(
                    f"{path}: row group {g} row {ref.row}: holds rollout {seg.rollout_id} segment "
                    f"{seg.segment_index} with {seg.num_tokens} tokens ({seg.num_trainable_tokens} "
                    f"trainable), the index says {ref.rollout_id} segment {ref.segment_index} with "
                    f"{ref.num_tokens} ({ref.num_trainable_tokens}): the shards changed after indexing"
                )
            out[k] = seg
    return [seg for seg in out if seg is not None]
