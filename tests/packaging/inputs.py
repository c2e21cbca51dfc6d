"""A small canonical input for the packaging tests: two GRPO groups of hand-written
rollouts (0, 1 and 2 compactions, a summary call each), cheap to build."""

from __future__ import annotations

from pathlib import Path

from tests.judge.rollouts import Story

FAIL = "FAILED tests/test_dates.py::test_parse_iso - KeyError: 'tz'"
SUMMARY = (
    "# Auto Context Summary\nsrc/dates.py fails test_parse_iso.\n## Next step\nFix parse_date."
)


def _story(rollout_id: str, compactions: int) -> Story:
    story = Story(rollout_id).act(("bash", {"command": "pytest"}, FAIL))
    for n in range(compactions):
        story = story.compact(SUMMARY).act(("read_file", {"path": f"src/f{n}.py"}, "x = 1"))
    return story.say("Fixed.")


def write_rollouts(path: Path) -> Path:
    """Write 4 rollouts (tasks t1 and t2, rewards 1 and 0 in each) as JSONL at ``path``."""
    rollouts = [
        _story(f"r{n}", n % 3).build(reward=float(n % 2), resolved=bool(n % 2)) for n in range(4)
    ]
    rollouts = [r.model_copy(update={"task_id": f"t{n // 2 + 1}"}) for n, r in enumerate(rollouts)]
    path.write_text("".join(r.model_dump_json(exclude_none=True) + "\n" for r in rollouts))
    return path
