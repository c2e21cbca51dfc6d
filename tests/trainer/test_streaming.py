"""Streaming shards: the index, the per-rank plan, reading one step's rows (no torch needed)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from trainer.batching import pack, plan_steps, read_segments
from trainer.streaming import build_index, read_rows, split_step
from trainer.synthetic import write_synthetic_shard

VOCAB = 151665
ROLLOUTS = [[(12, 6), (10, 5), (8, 4)], [(14, 8)], [(9, 7), (11, 3)], [(30, 20)], [(5, 2), (6, 3)]]


def keys(segments):
    return [(s.rollout_id, s.segment_index) for s in segments]


@pytest.fixture
def shards(tmp_path):
    """Two shard files with small row groups, the second one's rollouts first in the build."""
    write_synthetic_shard(tmp_path, ROLLOUTS, VOCAB, seed=3, with_logprobs=True)
    table = pq.read_table(tmp_path / "train-00000-of-00001.parquet")
    # Rows interleaved across files and row groups: rollout order comes from the index, not the layout.
    pq.write_table(table.slice(0, 5), tmp_path / "train-00000-of-00002.parquet", row_group_size=2)
    pq.write_table(table.slice(5), tmp_path / "train-00001-of-00002.parquet", row_group_size=3)
    (tmp_path / "train-00000-of-00001.parquet").unlink()
    return tmp_path


def test_the_index_reads_places_and_sizes_in_read_segments_order(shards):
    index = build_index(shards)
    segments = read_segments(shards)
    assert keys(index.segments) == keys(segments)
    assert [r.num_tokens for r in index.segments] == [s.num_tokens for s in segments]
    assert [r.num_trainable_tokens for r in index.segments] == [
        s.num_trainable_tokens for s in segments
    ]
    # Hand-checked places: row 5 of the build is the first row of file 1's first row group.
    assert [(r.file, r.row_group, r.row) for r in index.segments[4:7]] == [
        (0, 2, 0),
        (1, 0, 0),
        (1, 0, 1),
    ]


@pytest.mark.parametrize("cap", [None, 40])
def test_the_streaming_plan_equals_the_in_memory_plan(shards, cap):
    index = build_index(shards)
    segments = read_segments(shards)
    streamed = plan_steps(index.segments, 2, 6, cap)
    in_memory = plan_steps(segments, 2, 6, cap)
    assert [keys(s) for s in streamed] == [keys(s) for s in in_memory]
    for step, expected in zip(streamed, in_memory):
        got = read_rows(index, step)
        assert keys(got) == keys(expected)
        for a, b in zip(got, expected):
            assert np.array_equal(a.input_ids, b.input_ids)
            assert np.array_equal(a.loss_mask, b.loss_mask)
            assert np.array_equal(a.logprobs, b.logprobs)
            assert (a.reward, a.trainable_tokens_after) == (b.reward, b.trainable_tokens_after)
        # One rank: the rank's micro-batches are exactly pack()'s rows.
        (only,) = split_step(step, 1, micro_batch_tokens=40)
        rows = [pack_member_keys(expected, b) for b in pack(expected, 40)]
        assert [[keys(got)[i] for i in mb] for mb in only.micro_batches] == rows


def pack_member_keys(segments, batch):
    return [keys(segments)[i] for i, _, _ in batch.spans]


def test_the_plan_is_a_pure_function_and_the_shuffle_moves_whole_rollouts(shards):
    index = build_index(shards)
    again = build_index(shards)
    a = plan_steps(index.segments, 2, 8, None, seed=7)
    assert [keys(s) for s in a] == [keys(s) for s in plan_steps(again.segments, 2, 8, None, seed=7)]
    assert [keys(s) for s in a] != [keys(s) for s in plan_steps(index.segments, 2, 8, None, seed=8)]
    assert [keys(s) for s in a] != [keys(s) for s in plan_steps(index.segments, 2, 8)]
    flat = [k for s in a for k in keys(s)]
    n = len(index.segments)
    for epoch in (flat[:n], flat[n : 2 * n]):
        assert sorted(epoch) == sorted(keys(index.segments))  # each pass sees every segment once
        for rid in {r for r, _ in epoch}:  # a rollout's segments stay together and in order
            at = [i for i, (r, _) in enumerate(epoch) if r == rid]
            assert at == list(range(at[0], at[0] + len(at)))
            assert [epoch[i][1] for i in at] == sorted(epoch[i][1] for i in at)
    assert flat[:n] != flat[n : 2 * n]  # a new permutation per pass


def test_ranks_split_a_step_by_cost_and_run_the_same_number_of_micro_batches(shards):
    index = build_index(shards)
    (step,) = plan_steps(index.segments, 10, 1)
    ranks = split_step(step, 2, micro_batch_tokens=30)
    assert sorted(k for r in ranks for k in keys(r.segments)) == sorted(keys(step))
    assert len({len(r.micro_batches) for r in ranks}) == 1
    loads = [sum(s.num_tokens for s in r.segments) for r in ranks]
    assert abs(loads[0] - loads[1]) <= max(s.num_tokens for s in step)  # LPT bound
    for r in ranks:  # each real micro-batch within budget unless it is one long segment
        for mb in r.micro_batches:
            size = sum(r.segments[i].num_tokens for i in mb)
            assert size <= 30 or len(mb) == 1
    # Hand-checked: the 50-token segment (cost 50 + 2500/8192) alone outweighs the rest of one rank.
    assert ("r0003", 0) in keys(ranks[0].segments)


def test_a_rank_without_segments_gets_only_empty_micro_batches(shards):
    index = build_index(shards)
    step = list(index.segments[:2])
    ranks = split_step(step, 3, micro_batch_tokens=1000)
    assert [len(r.segments) for r in ranks] == [1, 1, 0]
    assert [r.micro_batches for r in ranks] == [((0,),), ((0,),), ((),)]


def test_a_segment_longer_than_the_budget_gets_a_micro_batch_of_its_own(shards):
    index = build_index(shards)
    (step,) = plan_steps(index.segments, 10, 1)
    (rank,) = split_step(step, 1, micro_batch_tokens=10)
    assert sorted(i for mb in rank.micro_batches for i in mb) == list(range(len(step)))
    assert all(len(mb) == 1 for mb in rank.micro_batches)  # every segment is longer than 10


def test_a_step_reads_only_the_row_groups_it_needs(shards, monkeypatch):
    index = build_index(shards)
    read = []
    original = pq.ParquetFile.read_row_group

    def recording(self, i, *args, **kwargs):
        read.append((Path(self_path[id(self)]).name, i))
        return original(self, i, *args, **kwargs)

    self_path = {}
    original_init = pq.ParquetFile.__init__

    def init(self, source, *args, **kwargs):
        original_init(self, source, *args, **kwargs)
        self_path[id(self)] = source

    monkeypatch.setattr(pq.ParquetFile, "__init__", init)
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", recording)
    step = [index.segments[1], index.segments[6]]  # (file 0, group 0) and (file 1, group 0)
    assert [(r.file, r.row_group) for r in step] == [(0, 0), (1, 0)]
    got = read_rows(index, step)
    assert keys(got) == [s.key for s in step]
    assert read == [("train-00000-of-00002.parquet", 0), ("train-00001-of-00002.parquet", 0)]


def test_shards_rewritten_after_indexing_fail_in_one_line(shards):
    index = build_index(shards)
    path = shards / "train-00001-of-00002.parquet"
    table = pq.read_table(path)
    pq.write_table(table.slice(1), path, row_group_size=3)
    with pytest.raises(ValueError, match="the shards changed after indexing"):
        read_rows(index, index.segments)


def test_a_null_size_is_refused_when_indexing(shards):
    path = shards / "train-00001-of-00002.parquet"
    table = pq.read_table(path)
    column = table.schema.get_field_index("num_tokens")
    nulls = pa.nulls(table.num_rows, pa.int32()).cast(table.schema.field(column).type)
    table = table.set_column(column, table.schema.field(column).name, nulls)
    pq.write_table(table, path)
    with pytest.raises(ValueError, match="must not be null"):
        build_index(shards)


def _replicate(src, dst, copies):
    """One shard of ``copies`` renamed copies of a build: new rollout ids, same rows (cheap 10x data)."""
    dst.mkdir()
    table = pq.read_table(src)
    renamed = [
        table.set_column(
            0, "rollout_id", pc.binary_join_element_wise(table["rollout_id"], f"-copy{c}", "")
        )
        for c in range(copies)
    ]
    pq.write_table(
        pa.concat_tables(renamed), dst / "train-00000-of-00001.parquet", row_group_size=8
    )
    return dst


def _plan_and_read(shards):
    index = build_index(shards)
    for step in plan_steps(index.segments, 4, 3):
        for rank in split_step(step, 2, 4096):
            read_rows(index, rank.segments)


def _peak_of_planning_and_reading(shards):
    """Peak Python/numpy bytes (tracemalloc) of indexing, planning 3 steps and reading them.

    Run once untraced first, so modules pyarrow imports lazily are not counted. Arrow's
    own buffers are not traced; ``test_a_step_reads_only_the_row_groups_it_needs``
    covers what Arrow reads.
    """
    _plan_and_read(shards)
    tracemalloc.start()
    try:
        _plan_and_read(shards)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_is_bounded_by_the_step_not_the_build(tmp_path):
    big = [[(6000, 2000), (5000, 3000)] for _ in range(12)]  # 24 segments, 192k tokens
    one = tmp_path / "one"
    write_synthetic_shard(one, big, VOCAB, seed=5)
    one_x = _replicate(one, tmp_path / "x1", 1)
    ten_x = _replicate(one, tmp_path / "x10", 10)
    shutil.rmtree(one)
    small = _peak_of_planning_and_reading(one_x)
    large = _peak_of_planning_and_reading(ten_x)
    assert large < 1.2 * small, (small, large)
    tracemalloc.start()  # the in-memory reader, for scale: it grows with the build
    read_segments(ten_x)
    _, whole = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert whole > 5 * large, (whole, large)


# Peak RSS (VmHWM) of a fresh process that indexes, plans 3 steps and reads them for 2 ranks;
# with "whole", then also of read_segments over the same build after resetting the peak
# (writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS, Linux >= 4.0).
RSS_PROBE = """
import re, sys
from pathlib import Path
from trainer.batching import plan_steps, read_segments
from trainer.streaming import build_index, read_rows, split_step

def peak_kb():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1))

index = build_index(sys.argv[1])
for step in plan_steps(index.segments, 4, 3):
    for rank in split_step(step, 2, 4096):
        read_rows(index, rank.segments)
print(peak_kb())
if sys.argv[2:] == ["whole"]:
    Path("/proc/self/clear_refs").write_text("5")
    read_segments(sys.argv[1])
    print(peak_kb())
"""


def _peak_rss_kb(shards, *extra):
    out = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(shards), *extra],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return [int(line) for line in out.split()]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_peak_rss_of_a_10x_build_is_within_1_2x_of_the_1x_build(tmp_path):
    """Arrow's buffers included (the traced test above sees only Python and numpy)."""
    big = [[(6000, 2000), (5000, 3000)] for _ in range(12)]
    write_synthetic_shard(tmp_path / "one", big, VOCAB, seed=5)
    one_x = _replicate(tmp_path / "one", tmp_path / "x1", 1)
    ten_x = _replicate(tmp_path / "one", tmp_path / "x10", 10)
    (small,) = _peak_rss_kb(one_x)
    large, whole = _peak_rss_kb(ten_x, "whole")
    assert large < 1.2 * small, (small, large)
    assert whole > 1.2 * small, (small, whole)  # the in-memory reader would break the bound
