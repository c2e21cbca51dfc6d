"""Helpers for reader tests: read a fixture, and write rollouts as short comparable shapes."""

from __future__ import annotations

from pathlib import Path

from pipeline.readers import REGISTRY, Accepted, Rejected, Skipped
from schemas.rollout import Keep, MessageEvent, Rollout

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "raw"


def fixture(*parts: str) -> Path:
    return FIXTURES.joinpath(*parts)


def read(fmt: str, path: Path, **options) -> tuple[list[Rollout], list[Rejected], list[Skipped]]:
    items = list(REGISTRY[fmt].configure(**options).read(path))
    return (
        [i.rollout for i in items if isinstance(i, Accepted)],
        [i for i in items if isinstance(i, Rejected)],
        [i for i in items if isinstance(i, Skipped)],
    )


def only(fmt: str, path: Path, **options) -> Rollout:
    rollouts, rejected, _ = read(fmt, path, **options)
    assert not rejected, [r.reason for r in rejected]
    assert len(rollouts) == 1, [r.rollout_id for r in rollouts]
    return rollouts[0]


def _message(m: MessageEvent) -> tuple:
    if m.role == "assistant":
        return ("assistant", m.id, m.content, [c.id for c in m.tool_calls])
    if m.role == "tool":
        return ("tool", m.id, m.content, m.tool_call_id)
    return (m.role, m.id, m.content)


def shape(rollout: Rollout) -> list[tuple]:
    """Events as tuples: messages by role/id/content, rewrites with their context."""
    out = []
    for e in rollout.events:
        if isinstance(e, MessageEvent):
            out.append(_message(e))
        else:
            context = [("keep", i.id) if isinstance(i, Keep) else _message(i) for i in e.context]
            out.append(("rewrite", e.reason, e.trigger, context))
    return out


def rewrites(rollout: Rollout) -> list[tuple[str, str]]:
    return [(e.reason, e.trigger) for e in rollout.events if e.type == "rewrite"]


def accounted(path: Path, fmt: str) -> int:
    """Records the reader accounts for: lines in rollouts + rejected + skipped."""
    total = 0
    for item in REGISTRY[fmt].read(path):
        total += 1 if isinstance(item, Skipped) else item.records
    return total


def nonblank_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())
