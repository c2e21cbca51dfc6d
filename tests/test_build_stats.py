"""``BuildStats`` (pipeline/build/stats.py): the tasks' counts added up for the manifest, and
``StepStats``/``PipelineStats`` (pipeline/build/steps.py): a step's counters, merged per task.
Merging is associative and keeps zero counts, so the manifest does not depend on how the
tasks are grouped."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.build.stats import BuildStats
from pipeline.build.steps import PipelineStats, StepStats
from pipeline.build.worker import TaskResult

KEYS = st.sampled_from(["read", "accepted", "quarantined", "tokens", "dropped_truncated_segments"])
COUNTS = st.dictionaries(KEYS, st.integers(0, 5))
FILES = st.sampled_from(["a.jsonl", "b.jsonl"])


@st.composite
def task_results(draw) -> list[TaskResult]:
    return [
        TaskResult(
            task=i,
            file=draw(FILES),
            format="canonical",
            rows=0,
            counts=draw(COUNTS),
            skipped=draw(st.dictionaries(st.sampled_from(["title", "hook"]), st.integers(1, 3))),
            seams=draw(st.dictionaries(st.sampled_from(["none", "compaction"]), st.integers(0, 3))),
            groups={},
            rollouts=[],
        )
        for i in range(draw(st.integers(0, 6)))
    ]


def _fold(results) -> BuildStats:
    stats = BuildStats()
    for r in results:
        stats.merge(BuildStats.of_task(r))
    return stats


# a loaded CI machine draws slowly; the examples are small
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_results(), st.integers(0, 6))
def test_merging_in_any_grouping_gives_the_same_stats(results, cut):
    whole = _fold(results)
    halves = _fold(results[:cut]).merge(_fold(results[cut:]))
    assert halves == whole
    # what the manifest lists: every key a task reported, zeros included
    assert set(whole.counts) == {k for r in results for k in r.counts}
    for name in ("read", "accepted", "quarantined"):
        assert whole.counts.get(name, 0) == sum(r.counts.get(name, 0) for r in results)
        assert sum(f[name] for f in whole.per_file.values()) == whole.counts.get(name, 0)
    assert sum(f["skipped"] for f in whole.per_file.values()) == sum(whole.skipped.values())


def test_a_zero_count_is_kept_and_per_file_counts_add_up_by_hand():
    one = TaskResult(
        0,
        "a.jsonl",
        "canonical",
        1,
        {"read": 2, "dropped_truncated_segments": 0},
        {"title": 1},
        {},
        {},
        [],
    )
    two = TaskResult(1, "a.jsonl", "canonical", 1, {"read": 3, "quarantined": 1}, {}, {}, {}, [])
    stats = BuildStats.of_task(one).merge(BuildStats.of_task(two))
    assert stats.counts == Counter(read=5, quarantined=1, dropped_truncated_segments=0)
    assert "dropped_truncated_segments" in stats.counts
    assert stats.per_file == {
        "a.jsonl": {"format": "canonical", "read": 5, "accepted": 0, "quarantined": 1, "skipped": 1}
    }


def test_step_stats_merge_per_step():
    a = PipelineStats({"read": StepStats("read", seen=2, passed=1, quarantined=1)})
    b = PipelineStats(
        {
            "read": StepStats("read", seen=3, passed=3, skipped=Counter(title=2)),
            "rewards": StepStats("rewards", 3, 3, counts=Counter(rewards_matched=3)),
        }
    )
    merged = a.merge(b)
    assert merged.steps["read"] == StepStats("read", 5, 4, 1, Counter(title=2))
    assert merged.counts() == Counter(rewards_matched=3)
    assert merged.quarantined() == 1
