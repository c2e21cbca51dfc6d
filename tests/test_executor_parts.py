"""Pieces of the local executor: shard planning, the helper thread, the encode cache."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.build import worker
from pipeline.build.write import plan_shards
from pipeline.core import render


@given(st.lists(st.integers(0, 50), max_size=30), st.integers(1, 40))
def test_shards_hold_every_row_once_in_order_with_equal_sizes(part_rows, per_shard):
    parts = list(enumerate(part_rows))
    plan = plan_shards(parts, per_shard)
    rows = [
        (task, offset + i)
        for shard in plan
        for task, offset, length in shard
        for i in range(length)
    ]
    assert rows == [(task, i) for task, n in parts for i in range(n)]
    sizes = [sum(length for _, _, length in shard) for shard in plan]
    total = sum(part_rows)
    assert len(plan) == max(1, -(-total // per_shard))
    assert max(sizes) <= per_shard and max(sizes) - min(sizes) <= 1


def test_tasks_run_off_the_main_thread_and_their_errors_reach_the_caller():
    assert (
        worker._on_helper_thread(lambda: threading.current_thread() is threading.main_thread())
        is False
    )

    def boom():
        raise KeyError("lost record")

    with pytest.raises(KeyError, match="lost record"):
        worker._on_helper_thread(boom)


def test_the_encode_cache_gives_fresh_ids_and_stays_within_its_budget(renderer, monkeypatch):
    monkeypatch.setattr(render, "ENCODE_CACHE_TOKENS", 64)
    fresh = render.ChatRenderer(renderer.tokenizer)
    texts = [f"def f{i}(x):\n    return x * {i}  # <|im_end|>\n" for i in range(40)]
    first = fresh.encode_many(texts)
    again = fresh.encode_many(texts[::-1])[::-1]
    expected = [
        np.asarray(e.ids) for e in renderer.backend.encode_batch(texts, add_special_tokens=False)
    ]
    for a, b, c in zip(first, again, expected):
        assert a.tolist() == b.tolist() == c.tolist()
    assert fresh._cached_tokens == sum(len(v) for v in fresh._encode_cache.values()) <= 64
    assert 0 < len(fresh._encode_cache) < len(texts)


def test_build_workers_collect_their_youngest_generation_less_often():
    """A worker's cyclic GC runs after ``GC_YOUNG_THRESHOLD`` allocations, not Python's
    700 (``worker_process_setup``: ~1.2% of a worker's CPU), and the older generations
    keep their thresholds."""
    import gc

    # The worker is forked from this process: its threshold must not be one it inherited,
    # whatever an earlier test in this process set (the gateway's command sets its own).
    before = gc.get_threshold()
    gc.set_threshold(worker.GC_YOUNG_THRESHOLD + 1, before[1], before[2])
    try:
        with worker.process_pool(1) as pool:
            young, older, oldest = pool.submit(gc.get_threshold).result()
    finally:
        gc.set_threshold(*before)
    assert young == worker.GC_YOUNG_THRESHOLD > 700
    assert (older, oldest) == before[1:]
