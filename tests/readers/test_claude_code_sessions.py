"""Claude Code sessions spread over several files, slices and damaged files.

One session in several files (snapshots that repeat each other's records, disjoint
slices, sub-agent transcripts) is one rollout per conversation, each record read once;
a lone slice is kept and flagged ``slice_start``; a lost or undecodable record makes the
rollout damaged (``lost_records``): quarantined unless ``--keep-damaged``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.build.run import BuildConfig, run_build
from pipeline.readers import REGISTRY, Accepted, Rejected, Skipped
from pipeline.readers.common import REPEAT_REASON
from pipeline.sources.files import plan_tasks
from tests.readers.util import fixture, read, shape

READER = REGISTRY["claude-code"]
SESSION = "5b1d6c2e-0000-4000-8000-00000000c0de"


def _lines(name: str) -> list[str]:
    return fixture("claude_code", name).read_text().splitlines(keepends=True)


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    return path


def _reasons(rollout) -> list[str]:
    return sorted(f["reason"] for f in rollout.meta["fidelity"])


def _items(paths):
    items = list(READER.read_files(paths))
    return (
        [i for i in items if isinstance(i, Accepted)],
        [i for i in items if isinstance(i, Rejected)],
        [i for i in items if isinstance(i, Skipped)],
    )


def test_every_claude_code_rollout_says_what_the_log_does_not_hold():
    (rollout,), _, _ = read("claude-code", fixture("claude_code", "compact_auto.jsonl"))
    assert _reasons(rollout) == [
        "missing_system_prompt",
        "missing_tool_schemas",
        # 2.0.76 writes no attachment records: what it re-attached after the compaction
        "unlogged_post_compaction_context",
    ]


def test_snapshots_and_slices_of_one_session_read_as_the_whole_file(tmp_path):
    """Slice 2–7 (starts mid-session), snapshot 1–4, snapshot 1–6, given out of order:
    one rollout, event for event the whole file's, each repeat skipped and counted."""
    lines = _lines("compact_auto.jsonl")
    late = _write(tmp_path / "c" / "s.jsonl", lines[1:])
    early = _write(tmp_path / "a" / "s.jsonl", lines[:4])
    middle = _write(tmp_path / "b" / "s.jsonl", lines[:6])
    (whole,), _, _ = read("claude-code", fixture("claude_code", "compact_auto.jsonl"))
    accepted, rejected, skipped = _items([late, early, middle])
    assert rejected == []
    assert [shape(a.rollout) for a in accepted] == [shape(whole)]
    assert accepted[0].rollout.meta["fidelity"] == whole.meta["fidelity"]
    repeats = [s for s in skipped if s.reason == REPEAT_REASON]
    # early: 4 new; middle: lines 5-6 new; late: line 7 new, lines 2-6 repeat.
    assert len(repeats) == 4 + 5 and all(s.file for s in repeats)
    assert sorted((Path(s.file).parent.name, s.line) for s in repeats) == sorted(
        [("b", n) for n in (1, 2, 3, 4)] + [("c", n) for n in (1, 2, 3, 4, 5)]
    )


def test_the_planner_makes_one_task_of_a_sessions_files_and_the_build_one_rollout(tmp_path):
    lines = _lines("compact_auto.jsonl")
    files = [
        _write(tmp_path / "in" / "x" / "full.jsonl", lines[:4]),
        _write(tmp_path / "in" / "y" / "full.jsonl", lines[3:]),
        _write(tmp_path / "in" / "z" / "other.jsonl", [ln.replace(SESSION, "s2") for ln in lines]),
    ]
    tasks = plan_tasks(files, "auto", 1 << 20)
    assert [(Path(t.path).parent.name, [Path(p).parent.name for p in t.paths]) for t in tasks] == [
        ("x", ["y"]),
        ("z", []),
    ]
    rewards = _write(tmp_path / "r.csv", [f"session_id,reward\n{SESSION},1\ns2,0\n"])
    out = tmp_path / "out"
    result = run_build(
        BuildConfig(
            inputs=[str(tmp_path / "in")],
            out=str(out),
            rewards=str(rewards),
            progress=False,
            workers=1,
        )
    )
    rows = pq.read_table(out / result.shards[0]).to_pylist()
    assert sorted({r["rollout_id"] for r in rows}) == [SESSION, "s2"]
    # Each generated piece once: the whole file has 3 calls, one rollout each session.
    assert sum(r["num_calls"] for r in rows if r["rollout_id"] == SESSION) == 3
    assert result.skipped[REPEAT_REASON] == 1
    first = str(tmp_path / "in" / "x" / "full.jsonl")
    assert result.per_file[first]["session_files"] == [str(tmp_path / "in" / "y" / "full.jsonl")]
    assert all("slice_start" not in r["context_fidelity"] for r in rows)
    # seam verify re-reads the inputs as the build planned them: the same one rollout.
    from pipeline.inspect.verify import verify_build

    assert verify_build(out).mismatches == []


def test_a_lone_slice_is_kept_and_flagged_and_joined_it_is_not(tmp_path):
    lines = _lines("compact_auto.jsonl")
    head, tail = _write(tmp_path / "a.jsonl", lines[:2]), _write(tmp_path / "b.jsonl", lines[2:])
    (alone,), rejected, _ = read("claude-code", tail)
    assert rejected == []
    assert _reasons(alone) == [
        "missing_system_prompt",
        "missing_tool_schemas",
        "slice_start",
        "unlogged_post_compaction_context",
    ]
    [entry] = [f for f in alone.meta["fidelity"] if f["reason"] == "slice_start"]
    assert entry == {
        "reason": "slice_start",
        "event_id": None,
        "detail": "line 1: parentUuid a1 is in none of the given files",
    }
    (joined,), _, _ = _items([tail, head])
    assert _reasons(joined.rollout) == [
        "missing_system_prompt",
        "missing_tool_schemas",
        "unlogged_post_compaction_context",
    ]


@pytest.mark.parametrize(
    "drop, event_id, detail",
    [
        # the assistant line with the tool call: its result (now an orphan, skipped) has
        # no parent, so the first event affected is the next call
        (2, "msg_B", "line 2: parentUuid a1 (the record before it) is missing"),
        # a tool result line: the next assistant record's parent is gone (and the call
        # gets the placeholder result Claude Code would send)
        (3, "toolu_1:no-result", "line 3: parentUuid r1 (the record before it) is missing"),
    ],
)
def test_a_lost_line_is_named_from_the_first_event_it_affects(tmp_path, drop, event_id, detail):
    lines = _lines("compact_auto.jsonl")
    damaged = _write(tmp_path / "s.jsonl", lines[: drop - 1] + lines[drop:])
    (rollout,), _, _ = read("claude-code", damaged)
    lost = [f for f in rollout.meta["fidelity"] if f["reason"] == "lost_records"]
    assert lost == [{"reason": "lost_records", "event_id": event_id, "detail": detail}]


def test_a_file_cut_in_half_is_damaged(tmp_path):
    lines = _lines("compact_auto.jsonl")
    cut = _write(tmp_path / "s.jsonl", lines[:5] + [lines[5][:40]])
    (rollout,), rejected, _ = read("claude-code", cut)
    assert [r.line for r in rejected] == [6]
    [lost] = [f for f in rollout.meta["fidelity"] if f["reason"] == "lost_records"]
    assert lost["event_id"] is None and lost["detail"].startswith("line 6: invalid JSON")


def _build(tmp_path, src, **options):
    rewards = _write(tmp_path / "r.csv", [f"session_id,reward\n{SESSION},1\n"])
    out = tmp_path / "out"
    result = run_build(
        BuildConfig(
            inputs=[str(src)],
            out=str(out),
            rewards=str(rewards),
            progress=False,
            workers=1,
            **options,
        )
    )
    rows = pq.read_table(out / result.shards[0]).to_pylist() if result.shards else []
    quarantine = [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]
    return rows, quarantine


def test_a_damaged_session_is_quarantined_by_default_and_kept_flagged_on_request(tmp_path):
    lines = _lines("compact_auto.jsonl")
    src = _write(tmp_path / "s.jsonl", lines[:1] + lines[2:])
    rows, quarantine = _build(tmp_path / "default", src)
    assert rows == []
    assert [(q["line"], q["reason"]) for q in quarantine] == [
        (
            1,
            f"rollout {SESSION}: damaged log (lost_records: line 2: parentUuid a1 (the record "
            "before it) is missing); --keep-damaged keeps it, flagged",
        )
    ]
    rows, quarantine = _build(tmp_path / "kept", src, keep_damaged=True)
    assert quarantine == []
    damaged = ["lost_records", "missing_system_prompt", "missing_tool_schemas"]
    # the second segment opens after the compaction: what 2.0.76 re-attached is not logged
    assert [r["context_fidelity"] for r in rows] == [
        damaged,
        [*damaged, "unlogged_post_compaction_context"],
    ]


def test_reported_input_tokens_are_the_billed_input_with_cache(tmp_path):
    """usage: 10 uncached + 0 cache writes + 0 cache reads in the fixture; a record
    without usage (or all zeros) reports nothing."""
    (rollout,), _, _ = read("claude-code", fixture("claude_code", "compact_auto.jsonl"))
    assert [c.meta.get("reported_input_tokens") for c in rollout.calls()] == [10, 10, 10]
    lines = _lines("compact_auto.jsonl")
    record = json.loads(lines[1])
    record["message"]["usage"] = {
        "input_tokens": 3,
        "cache_creation_input_tokens": 2761,
        "cache_read_input_tokens": 18976,
        "output_tokens": 7,
    }
    lines[1] = json.dumps(record) + "\n"
    record = json.loads(lines[3])
    record["message"]["usage"] = {"input_tokens": 0, "output_tokens": 0}
    lines[3] = json.dumps(record) + "\n"
    (rollout,), _, _ = read("claude-code", _write(tmp_path / "s.jsonl", lines))
    assert [c.meta.get("reported_input_tokens") for c in rollout.calls()] == [21740, None, 10]


def test_a_codex_session_in_two_files_is_one_rollout_as_the_whole_file(tmp_path):
    """The Codex hook of the same mechanism: files grouped by their session_meta id;
    the second file starts with the first's session_meta line and one more of its lines,
    verbatim (each read once, the repeats counted)."""
    name = "developer_inside_call.jsonl"
    lines = fixture("codex", name).read_text().splitlines(keepends=True)
    first = _write(tmp_path / "in" / "rollout-a.jsonl", lines[:12])
    second = _write(tmp_path / "in" / "rollout-b.jsonl", [lines[0], *lines[11:]])
    tasks = plan_tasks([first, second], "auto", 1 << 20)
    assert [(t.format, t.paths) for t in tasks] == [("codex", (str(second),))]
    (whole,), _, _ = read("codex", fixture("codex", name))
    items = list(REGISTRY["codex"].read_files([second, first]))
    accepted = [i.rollout for i in items if isinstance(i, Accepted)]
    # Codex message ids are record positions, which differ in a merged stream.
    assert [_without_ids(shape(r)) for r in accepted] == [_without_ids(shape(whole))]
    repeats = [i for i in items if isinstance(i, Skipped) and i.reason == REPEAT_REASON]
    assert [(Path(i.file).name, i.line) for i in repeats] == [
        ("rollout-b.jsonl", 1),
        ("rollout-b.jsonl", 2),
    ]


def _without_ids(events: list[tuple]) -> list[tuple]:
    return [e if e[0] == "rewrite" else (e[0], *e[2:]) for e in events]


def test_two_records_glued_on_one_line_are_both_read_not_damage(tmp_path):
    """Real snapshot files hold lines with two whole records back to back (a write
    race): both are read, nothing is lost; a line cut in the middle stays damage."""
    lines = _lines("compact_auto.jsonl")
    glued = _write(tmp_path / "s.jsonl", [*lines[:2], lines[2].rstrip("\n") + lines[3], *lines[4:]])
    (rollout,), rejected, _ = read("claude-code", glued)
    (whole,), _, _ = read("claude-code", fixture("claude_code", "compact_auto.jsonl"))
    assert rejected == [] and shape(rollout) == shape(whole)
    assert rollout.meta["fidelity"] == whole.meta["fidelity"]


def test_the_session_of_a_file_is_found_past_a_long_first_record(tmp_path):
    """Planning reads a 64 KiB head; a file-history snapshot can be longer than that."""
    from pipeline.readers.common import read_head

    snapshot = json.dumps({"type": "file-history-snapshot", "snapshot": {"x": "y" * 100_000}})
    path = _write(tmp_path / "full.jsonl", [snapshot + "\n", *_lines("compact_auto.jsonl")])
    assert b"sessionId" not in read_head(path)
    assert READER.session_key(path, read_head(path)) == SESSION


# The hooks capture with a cut progress record and two records run together (the
# raw fixtures are all whole JSON lines; this one is not, by design).
RUN_TOGETHER = fixture("..", "claude_code_cli", "run_together", "session.jsonl")


def test_run_together_records_are_split_and_a_lost_progress_record_is_not_damage():
    """Line 2: a ``progress`` record cut mid-write, then the user's prompt; line 6: the
    tool call and its result back to back. Every whole record is read (the rollout is
    the one of the intact file), and the cut record, a type Claude Code never sends to
    the model, is skipped with that reason: no ``lost_records``."""
    intact = fixture("..", "claude_code_cli", "hooks", "session.jsonl")
    (rollout,), rejected, skipped = read("claude-code", RUN_TOGETHER)
    (whole,), _, _ = read("claude-code", intact)
    assert not rejected
    assert [e.model_dump() for e in rollout.events] == [e.model_dump() for e in whole.events]
    assert "lost_records" not in {f["reason"] for f in rollout.meta["fidelity"]}
    (cut,) = [s for s in skipped if "progress" in s.reason]
    assert cut.line == 2 and "never sent to the model" in cut.reason


def test_a_cut_record_that_may_have_reached_the_model_flags_lost_records(tmp_path):
    """The same line with the cut record's type not readable (cut before it): the whole
    prompt record after it is still read, and the session says ``lost_records``."""
    lines = RUN_TOGETHER.read_text().splitlines(True)
    cut, rest = lines[1].split('"type":"progress"', 1)
    lines[1] = cut + rest[rest.index('{"parentUuid"') :]
    path = _write(tmp_path / "s.jsonl", lines)
    rollouts, rejected, _ = read("claude-code", path)
    assert [r.line for r in rejected] == [2]
    (rollout,) = rollouts
    assert "lost_records" in {f["reason"] for f in rollout.meta["fidelity"]}
    assert any(e.type == "message" and e.content == "run echo" for e in rollout.events)


def test_a_record_whose_parent_is_a_lost_progress_record_further_up_is_not_damage(tmp_path):
    """A progress record cut only at its last brace (its ``uuid``, written last, is
    readable) on a line of its own, an attachment, then the prompt naming it as parent:
    no ``lost_records``; the same with the uuid unreadable is damage."""
    lines = RUN_TOGETHER.read_text().splitlines(True)
    at = lines[1].index('{"parentUuid"', 1)
    prompt = json.loads(lines[1][at:])
    progress = {
        "parentUuid": "7f99bfaa-0000-4000-8000-000000000000",
        "type": "progress",
        "data": {"type": "hook_progress", "hookEvent": "UserPromptSubmit"},
        "uuid": prompt["parentUuid"],
    }
    cut = json.dumps(progress)[:-1]
    path = _write(tmp_path / "s.jsonl", [lines[0], cut + "\n", lines[2], lines[1][at:], *lines[3:]])
    (rollout,), rejected, _ = read("claude-code", path)
    assert not rejected
    assert "lost_records" not in {f["reason"] for f in rollout.meta["fidelity"]}
    unreadable = cut[: cut.index('"uuid"')] + '"uu\n'
    path = _write(tmp_path / "t.jsonl", [lines[0], unreadable, lines[2], lines[1][at:], *lines[3:]])
    (rollout,), _, _ = read("claude-code", path)
    assert "lost_records" in {f["reason"] for f in rollout.meta["fidelity"]}
