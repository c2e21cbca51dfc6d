"""Real public rollout files (``$SEAM_REALWORLD_DIR``, not in this repository): every file
is detected, read and accounted for, and the compactions they contain are found."""

import os
from pathlib import Path

import pytest

from pipeline.readers.detect import detect_format
from tests.readers.util import accounted, nonblank_lines, read

ROOT = Path(os.environ["SEAM_REALWORLD_DIR"]) if os.environ.get("SEAM_REALWORLD_DIR") else None
if ROOT is not None and not ROOT.is_dir():
    ROOT = None
pytestmark = pytest.mark.skipif(
    ROOT is None, reason="SEAM_REALWORLD_DIR is not set or is not a directory"
)
FILES = (
    sorted(p for p in ROOT.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl", ".traj"))
    if ROOT
    else []
)


def fmt_of(path: Path) -> str:
    return path.relative_to(ROOT).parts[0].replace("_", "-")


def rewrites(rollouts, reason="compaction"):
    return [e for r in rollouts for e in r.events if e.type == "rewrite" and e.reason == reason]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_realworld_file_is_detected_and_ingests_with_nothing_lost(path):
    fmt = fmt_of(path)
    assert detect_format(path) == fmt
    rollouts, _, skipped = read(fmt, path)
    assert rollouts or skipped
    if path.suffix == ".jsonl":
        assert accounted(path, fmt) == nonblank_lines(path)


def test_claude_code_slice_has_exactly_one_compaction():
    (path,) = ROOT.glob("claude_code/entireio*.jsonl")
    (rollout,) = read("claude-code", path)[0]
    (rewrite,) = rewrites([rollout])
    assert (rewrite.trigger, rewrite.meta["pre_tokens"]) == ("budget", 155250)
    assert rewrite.context[0].content.startswith(
        "This session is being continued from a previous conversation"
    )
    assert len(rollout.calls()) == 12


def test_codex_fixture_has_six_compactions():
    (path,) = ROOT.glob("codex/agent-sessions*small.jsonl")
    rollouts, rejected, _ = read("codex", path)
    assert len(rewrites(rollouts)) == 6
    assert all("has no model call" in r.reason for r in rejected)


def test_atif_continuation_is_joined():
    (path,) = [p for p in ROOT.glob("atif/*.trajectory.json")]
    (rollout,) = read("atif", path)[0]
    assert len(rollout.meta["continuation_files"]) == 1
    (rewrite,) = rewrites([rollout])
    assert rewrite.meta["copied_steps"] == 4
    assert len(rollout.calls()) == 3 + 4
