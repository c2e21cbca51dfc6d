"""The build's finalize stage (``pipeline/build/finalize.py``): its steps, each with its own
counters. Hand-checked on task results made by hand (no build), then on one small build:
the steps run in order and count what they did."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from pipeline.build.finalize import DropCrossTaskDuplicates, Finalizing, final_steps
from pipeline.build.run import BuildConfig, run_build
from pipeline.build.worker import TaskResult
from tests.robustness.records import good_record


def _task(index: int, file: str, rollouts: list[tuple[str, int]]) -> TaskResult:
    """A task that accepted ``rollouts`` (id, line), each with 2 segments of 10 tokens."""
    own = {"accepted": 1, "segments": 2, "tokens": 20}
    n = len(rollouts)
    return TaskResult(
        task=index,
        file=file,
        format="canonical",
        rows=2 * n,
        counts={"read": n, "accepted": n, "quarantined": 0, "segments": 2 * n, "tokens": 20 * n},
        skipped={},
        seams={"none": n, "compaction": n},
        groups={},
        rollouts=[[rid, file, line, own, {"none": 1, "compaction": 1}] for rid, line in rollouts],
    )


def test_a_later_copy_of_an_id_is_taken_back_out_by_hand(tmp_path):
    results = [
        _task(0, "a.jsonl", [("x", 1), ("y", 2)]),
        _task(1, "b.jsonl", [("z", 1), ("x", 2)]),  # x again, in another task
        _task(2, "b.jsonl", [("x", 3)]),  # and again
    ]
    f = Finalizing(BuildConfig(inputs=[], out=str(tmp_path)), tmp_path, [0, 1, 2], results, {})
    step = DropCrossTaskDuplicates()
    step.run(f)
    assert (step.stats.seen, step.stats.passed, step.stats.quarantined) == (5, 3, 2)
    assert f.excluded == {1: {1}, 2: {0}}
    # 5 accepted, two copies taken back out: 3 accepted, 2 quarantined, their tokens gone
    assert f.stats.counts == Counter(read=5, accepted=3, quarantined=2, segments=6, tokens=60)
    assert f.stats.seams == Counter(none=3, compaction=3)
    assert f.stats.per_file["a.jsonl"] == dict(
        format="canonical", read=2, accepted=2, quarantined=0, skipped=0
    )
    assert f.stats.per_file["b.jsonl"] == dict(
        format="canonical", read=3, accepted=1, quarantined=2, skipped=0
    )
    entries = [json.loads(e) for e in f.duplicate_entries]
    assert [(e["file"], e["line"]) for e in entries] == [("b.jsonl", 2), ("b.jsonl", 3)]
    assert entries[1]["reason"] == (
        "duplicate rollout_id 'x': first at a.jsonl:1, again at b.jsonl:3 (the first is kept)"
    )


def test_a_build_runs_the_final_steps_in_order_and_counts_them(tmp_path):
    rng = random.Random(3)
    records = [good_record(rng, f"r{i}", f"t{i % 2}") for i in range(4)]
    for i, r in enumerate(records):
        r["reward"] = float(i % 2)
    src = tmp_path / "in.jsonl"
    lines = [json.dumps(r) + "\n" for r in records]
    src.write_text("".join([*lines, lines[0]]))  # r0 twice: the second copy a duplicate
    config = BuildConfig(
        inputs=[str(src)], out=str(tmp_path / "out"), workers=1, progress=False, chunk_bytes=1
    )
    result = run_build(config)
    assert [s.name for s in final_steps(config)] == list(result.finalize_stats.steps)
    steps = result.finalize_stats.steps
    assert list(steps) == ["duplicates", "advantages+shards", "quarantine", "card+manifest"]
    assert (steps["duplicates"].seen, steps["duplicates"].quarantined) == (5, 1)
    assert steps["advantages+shards"].counts["shards"] == len(result.shards) == 1
    assert steps["quarantine"].counts == Counter(written=1, not_written=0)
    assert result.counts["quarantined"] == 1 and result.counts["accepted"] == 4
    assert Path(config.out, "manifest.json").exists()
