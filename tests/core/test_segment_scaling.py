"""Cutting one segment of many calls costs linear work and memory in the number of calls.

Measured as counts, not wall time: the Python function calls the profiler sees (every
per-message comparison of a quadratic loop is a generator step it counts) and the peak
of Python allocations (a copied context per call is O(calls²) references). 10× the calls
may cost at most ``RATIO`` × the work: a quadratic stage costs ~100×.
"""

from __future__ import annotations

import cProfile
import pstats
import tracemalloc

import pytest

from pipeline.core.rows import RowOptions, masked_segments
from schemas.replay import CallContext, replay
from schemas.rollout import Rollout

RATIO = 13  # linear work is ~10×, plus fixed costs that shrink the ratio; quadratic ≥ 50×


def many_calls(n: int) -> Rollout:
    """System, task, then ``n`` (tool call, tool result) steps with no rewrite: one segment."""
    events = [
        {"type": "message", "id": "s", "role": "system", "content": "You fix bugs."},
        {"type": "message", "id": "u", "role": "user", "content": "Fix the parser."},
    ]
    for i in range(n):
        events += [
            {
                "type": "message",
                "id": f"a{i}",
                "role": "assistant",
                "content": f"Step {i}.",
                "tool_calls": [{"id": f"c{i}", "name": "read", "arguments": f'{{"n": {i}}}'}],
            },
            {
                "type": "message",
                "id": f"t{i}",
                "role": "tool",
                "tool_call_id": f"c{i}",
                "content": f"line {i}: ok",
            },
        ]
    return Rollout.model_validate(
        {"rollout_id": f"r{n}", "task_id": "t", "source": "test", "reward": 1.0, "events": events}
    )


def cost(renderer, n: int) -> tuple[int, int]:
    """(Python function calls, peak traced bytes) of cutting and masking ``many_calls(n)``."""
    from pipeline.core.segment import Segmenter

    rollout = many_calls(n)
    segmenter = Segmenter(renderer)
    segmenter.renderer.forget()
    profile = cProfile.Profile()
    tracemalloc.start()
    profile.enable()
    (masked,), dropped = masked_segments(rollout, segmenter, RowOptions())
    profile.disable()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(masked.segment.spans) == n and dropped == 0
    return pstats.Stats(profile).total_calls, peak


@pytest.mark.slow
def test_ten_times_the_calls_in_one_segment_cost_about_ten_times_the_work(renderer):
    (calls_small, peak_small), (calls_big, peak_big) = cost(renderer, 200), cost(renderer, 2000)
    assert calls_big <= RATIO * calls_small, (calls_small, calls_big)
    assert peak_big <= RATIO * peak_small, (peak_small, peak_big)


def test_a_calls_context_is_a_view_of_the_live_messages_not_a_copy():
    views = replay(many_calls(3))
    assert [len(v.context) for v in views] == [2, 4, 6]
    last = views[-1].context
    assert isinstance(last, CallContext) and last.extends(views[0].context)
    assert [m.id for m in last] == ["s", "u", "a0", "t0", "a1", "t1"]
    assert last[-1].id == "t1" and [m.id for m in last[2:4]] == ["a0", "t0"]
    assert last == tuple(last) and tuple(last) == last and last != views[0].context
    assert [m.id for m in last + (views[-1].message,)] == [*(m.id for m in last), "a2"]


def verify_cost(tmp_path, n: int) -> int:
    """Python function calls of the sample audit (``seam verify``) of a build of
    ``many_calls(n)``; the audit must find nothing wrong."""
    from pipeline.build.run import BuildConfig, run_build
    from pipeline.inspect.verify import verify_build

    src, out = tmp_path / f"in-{n}.jsonl", tmp_path / f"out-{n}"
    src.write_text(many_calls(n).model_dump_json() + "\n")
    run_build(BuildConfig(inputs=[str(src)], out=str(out), workers=1, progress=False))
    profile = cProfile.Profile()
    profile.enable()
    result = verify_build(out, "sample")
    profile.disable()
    assert result.ok and result.totals()["spans"] == n, result.mismatches[:3]
    return pstats.Stats(profile).total_calls


@pytest.mark.slow
def test_the_sample_audit_of_ten_times_the_calls_costs_about_ten_times_the_work(tmp_path):
    small, big = verify_cost(tmp_path, 200), verify_cost(tmp_path, 2000)
    assert big <= RATIO * small, (small, big)


def test_the_sample_audit_checks_contexts_spread_over_a_long_row():
    from pipeline.inspect.verify import spread

    assert spread(5, None) == range(5) and spread(5, 8) == range(5)
    picked = spread(2000, 32)
    assert len(picked) == 32 and {0, 1999} <= picked
    assert max(b - a for a, b in zip(sorted(picked), sorted(picked)[1:])) <= 2000 // 31 + 1
