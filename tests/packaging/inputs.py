"""Small inputs for the packaging tests: two GRPO groups of hand-written canonical
rollouts (0, 1 and 2 compactions, a summary call each), cheap to build; a gateway-style
chat-completions log."""

from __future__ import annotations

import json
from pathlib import Path

import zstandard

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


def write_chat_completions_log(path: Path) -> Path:
    """A gateway-style log (docs/readers.md): one chat-completions call per line, request
    and response, ``metadata.trace_id`` naming the rollout; two rollouts of two calls
    each, zstd-compressed."""
    lines = []
    for trace in ("a", "b"):
        messages = [
            {"role": "system", "content": "You fix bugs."},
            {"role": "user", "content": f"Fix bug {trace}."},
        ]
        for reply in ("Looking at it.", "Fixed."):
            response = {"role": "assistant", "content": reply}
            lines.append(
                {
                    "metadata": {"trace_id": trace},
                    "request": {"model": "m", "messages": messages},
                    "response": {"choices": [{"index": 0, "message": response}]},
                }
            )
            messages = [*messages, response, {"role": "user", "content": "Go on."}]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    return path
