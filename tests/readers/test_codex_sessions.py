"""Codex sessions over several files and sessions inside one file (issue 22): snapshots of
one session merged by what the model saw (redacted ciphertexts aside), forked sub-agents
read as their own rollout with the parent's history as context, and parallel tool calls
whose outputs all reach the next call. The real files (``$SEAM_REALWORLD_NEW_DIR/codex``)
are checked too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.readers import REGISTRY, Accepted, Rejected, Skipped
from pipeline.readers.common import REPEAT_REASON
from schemas.replay import replay
from schemas.rollout import MessageEvent, Rollout
from tests.readers.util import fixture, only

SNAPSHOTS = [fixture("codex", "snapshots", f"snapshot_{n}.jsonl") for n in (1, 2)]


def read_together(paths: list[Path]) -> tuple[list[Rollout], list[Rejected], list[Skipped]]:
    items = list(REGISTRY["codex"].read_files(paths))
    return (
        [i.rollout for i in items if isinstance(i, Accepted)],
        [i for i in items if isinstance(i, Rejected)],
        [i for i in items if isinstance(i, Skipped)],
    )


def _seen(m: MessageEvent) -> tuple:
    calls = tuple((c.id, c.name, c.arguments) for c in m.tool_calls)
    return m.role, m.content, m.reasoning, calls, m.tool_call_id


def as_seen(rollout: Rollout) -> list[tuple]:
    """Each call as the model saw it (its context) and what it produced, ids aside."""
    return [(tuple(_seen(m) for m in v.context), _seen(v.message)) for v in replay(rollout)]


# -- snapshots ---------------------------------------------------------------------------


def test_two_snapshots_read_together_are_exactly_the_newest_alone():
    rollouts, rejected, skipped = read_together(SNAPSHOTS)
    newest = only("codex", SNAPSHOTS[1])
    assert not rejected and len(rollouts) == 1
    assert as_seen(rollouts[0]) == as_seen(newest)
    # The older snapshot is read first; the 16 records the newer one repeats (ciphertexts
    # "REDACTED" in one, left out in the other; keys in another order) are counted.
    repeats = [s for s in skipped if s.reason == REPEAT_REASON]
    assert len(repeats) == 16 and {s.file for s in repeats} == {str(SNAPSHOTS[1])}
    assert max(s.line or 0 for s in repeats) == 16


def test_records_that_truly_repeat_stay_apart():
    """The same visible record twice in one file (two reasoning items of one response,
    written at the same millisecond, their ciphertexts redacted) stays two, and the same
    user message at two times stays two."""
    items = list(REGISTRY["codex"].read_files(SNAPSHOTS))
    (merged,) = [i for i in items if isinstance(i, Accepted)]
    alone = [i for i in REGISTRY["codex"].read(SNAPSHOTS[1]) if isinstance(i, Accepted)]
    assert merged.records == alone[0].records
    last = replay(merged.rollout)[-1].context
    assert [m.content for m in last if m.role == "user"].count("Count the Python files.") == 2


# -- the real files ----------------------------------------------------------------------

NEW = (
    Path(os.environ["SEAM_REALWORLD_NEW_DIR"]) if os.environ.get("SEAM_REALWORLD_NEW_DIR") else None
)


def _real(pattern: str) -> list[Path]:
    if NEW is None or not NEW.is_dir():
        pytest.skip("SEAM_REALWORLD_NEW_DIR is not set or is not a directory")
    return sorted(NEW.glob(f"codex/{pattern}"))


def test_real_snapshots_of_one_session_train_exactly_what_the_newest_trains():
    """Four snapshots of one real session (ciphertexts redacted in some, absent in
    others): read together they are the newest alone: the same calls, the same contexts,
    one compaction, and as many counted repeats as the older ones hold records (each is
    a prefix of the next)."""
    paths = _real("mise_*/*.jsonl")
    assert len(paths) == 4
    newest = max(paths, key=lambda p: p.stat().st_size)
    rollouts, rejected, skipped = read_together(paths)
    (alone,) = [i.rollout for i in REGISTRY["codex"].read(newest) if isinstance(i, Accepted)]
    assert not rejected and len(rollouts) == 1
    assert as_seen(rollouts[0]) == as_seen(alone)
    rewrites = [e.reason for e in rollouts[0].events if e.type == "rewrite"]
    assert rewrites == [e.reason for e in alone.events if e.type == "rewrite"] == ["compaction"]
    older = sum(len(p.read_text().splitlines()) for p in paths if p != newest)
    assert sum(s.reason == REPEAT_REASON for s in skipped) == older
