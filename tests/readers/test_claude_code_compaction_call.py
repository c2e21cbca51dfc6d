"""Claude Code's compaction call (``subagents/agent-acompact-*.jsonl``) is the summary
call of its compaction (issue 22, item 4): joined to the main session, its context is
the main history up to the boundary plus the prompt it records, ``kind: "summary"``,
trained once, and ``--synthesize-summary-calls`` adds none where it exists."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.build.run import BuildConfig, run_build
from pipeline.core.rows import RowOptions, masked_segments
from pipeline.core.segment import Segmenter
from pipeline.readers import REGISTRY, Accepted, Rejected, Skipped
from pipeline.sft.filters import FilterOptions
from pipeline.sft.stage import SftStage
from pipeline.sft.synthesize import load_prompt, synthesize_summary_calls
from schemas.replay import replay
from schemas.rollout import Rollout
from tests.readers.util import fixture, nonblank_lines, shape

SESSION = "7a90c3e1-0000-4000-8000-00000000ac01"
DIR = fixture("claude_code", "compaction_call")
MAIN = DIR / f"{SESSION}.jsonl"
SIDE = DIR / SESSION / "subagents" / "agent-acompact-5e1f0a.jsonl"


def _read(*paths: Path) -> list[Rollout]:
    items = list(REGISTRY["claude-code"].read_files(list(paths)))
    assert not [i.reason for i in items if isinstance(i, Rejected)]
    return [i.rollout for i in items if isinstance(i, Accepted)]


def test_the_compaction_call_is_the_summary_call_before_its_rewrite():
    (rollout,) = _read(MAIN, SIDE)  # one rollout: no agent-acompact sub-agent
    assert rollout.rollout_id == SESSION
    assert [s[:2] for s in shape(rollout)] == [
        ("user", "m-u1"),
        ("assistant", "msg_C1"),
        ("tool", "m-r1:toolu_ed"),
        # the hook's context, recorded only in the compaction call's file, where its
        # parent is: every later call saw it
        ("user", "k-h1"),
        ("assistant", "msg_C2"),
        ("tool", "m-r2:toolu_t"),
        ("user", "k-q1"),  # the compaction prompt
        ("assistant", "msg_K1"),  # the summary call
        ("rewrite", "compaction"),
        ("assistant", "msg_C3"),
    ]
    views = {v.message.id: v for v in replay(rollout)}
    summary = views["msg_K1"]
    assert summary.message.call_kind == "summary"
    assert [m.id for m in summary.context] == [
        "m-u1",
        "msg_C1",
        "m-r1:toolu_ed",
        "k-h1",
        "msg_C2",
        "m-r2:toolu_t",
        "k-q1",
    ]
    assert summary.context[-1].content.startswith("Your task is to create a detailed summary")
    assert summary.message.content.startswith("<analysis>")
    assert summary.message.meta["reported_input_tokens"] == 21800
    assert [m.id for m in views["msg_C2"].context][-1] == "k-h1"
    assert [m.id for m in views["msg_C3"].context] == ["m-s1"]  # after the rewrite


def test_it_is_trained_once_at_the_end_of_the_segment_it_closes(renderer):
    (rollout,) = _read(MAIN, SIDE)
    masked, _ = masked_segments(rollout, Segmenter(renderer), RowOptions(require_outcome=False))
    assert [[(s.call_index, s.kind) for s in m.segment.spans] for m in masked] == [
        [(0, "action"), (1, "action"), (2, "summary")],
        [(3, "action")],
    ]
    assert [m.segment.seam_kind for m in masked] == ["none", "compaction"]
    assert all(all(m.trained) for m in masked)


def test_without_its_file_there_is_no_summary_call_and_the_synthesized_one_is_added():
    (rollout,) = _read(MAIN)
    assert [c.call_kind for c in rollout.calls()] == ["action"] * 3
    assert synthesize_summary_calls(rollout, load_prompt(None))[1] == 1
    (joined,) = _read(MAIN, SIDE)
    assert synthesize_summary_calls(joined, load_prompt(None)) == (joined, 0)


def test_build_sft_synthesizes_no_call_where_the_real_one_is_joined(tmp_path):
    real = run_build(
        BuildConfig(
            inputs=[str(DIR)],
            out=str(tmp_path / "out"),
            kind="sft",
            workers=1,
            progress=False,
            stage=SftStage(None, FilterOptions(), load_prompt(None)),
        )
    )
    counts = json.loads((real.out / "manifest.json").read_text())["counts"]
    assert counts["synthesized_summary_calls"] == 0
    rows = pq.read_table(real.out / real.shards[0]).to_pylist()
    assert {r["rollout_id"] for r in rows} == {SESSION}
    kinds = [s["kind"] for r in rows for s in r["call_spans"]]
    assert kinds.count("summary") == 1
    not_logged = ["missing_system_prompt", "missing_tool_schemas"]
    assert [r["context_fidelity"] for r in rows] == [
        not_logged,  # the summary call's segment: no flag of its own
        sorted([*not_logged, "unlogged_post_compaction_context"]),  # 2.1.39: after it
    ]


def _copy(tmp_path: Path, main_lines: list[str] | None = None, side_lines: list[str] | None = None):
    """The fixture session in ``tmp_path`` with its files' lines replaced."""
    root = tmp_path / "s"
    shutil.copytree(DIR, root)
    main, side = root / MAIN.name, root / SIDE.relative_to(DIR)
    if main_lines is not None:
        main.write_text("".join(main_lines))
    if side_lines is not None:
        side.write_text("".join(side_lines))
    return main, side


TOOL = '{"type":"tool_use","id":"toolu_k","name":"Read","input":{"file_path":"a"}}'


@pytest.mark.parametrize(
    ("file", "old", "new"),
    [
        # an aborted compaction: the call was made, no boundary followed
        ("main", '"subtype":"compact_boundary"', '"subtype":"turn_duration"'),
        # a boundary that names another last message: not this call's compaction
        ("main", '"logicalParentUuid":"m-r2"', '"logicalParentUuid":"m-a2"'),
        # a history message placed after the boundary: not the history it summarized
        ("side", '"parentUuid":"m-r1"', '"parentUuid":"m-s1"'),
        # a tool result among the history messages: not a message this join places
        (
            "side",
            '"content":"<system-reminder>\\nPostToolUse:Edit hook additional context: ruff: All checks passed!\\n</system-reminder>"',
            '"content":[{"type":"tool_result","tool_use_id":"toolu_ed","content":"ok"}]',
        ),
        # a summary call never calls tools (Claude Code forks it for one turn)
        ("side", '"content":[{"type":"text"', '"content":[' + TOOL + ',{"type":"text"'),
    ],
)
def test_a_compaction_file_that_does_not_fit_stays_a_sub_agent(tmp_path, file, old, new):
    """What this join does not know is left as it was read: nothing moves into the main
    context, and the file is a sub-agent rollout of its session."""
    source = MAIN if file == "main" else SIDE
    lines = source.read_text().splitlines(keepends=True)
    changed = [x.replace(old, new) for x in lines]
    assert changed != lines
    main, side = _copy(tmp_path, **{f"{file}_lines": changed})
    rollouts = {r.rollout_id: r for r in _read(main, side)}
    assert set(rollouts) == {SESSION, f"{SESSION}/agent-acompact-5e1f0a"}
    assert "k-h1" not in [e.id for e in rollouts[SESSION].events]


def test_a_history_message_after_a_call_goes_after_the_call_s_results(tmp_path):
    """Claude Code sends a call's results right after it: a message recorded as
    following the call comes after them (else the pair would be cut and the call get a
    placeholder result)."""
    lines = [
        x.replace('"parentUuid":"m-r1"', '"parentUuid":"m-a2"')
        for x in SIDE.read_text().splitlines(keepends=True)
    ]
    main, side = _copy(tmp_path, side_lines=lines)
    (rollout,) = _read(main, side)
    ids = [e.id for e in rollout.events]
    assert ids[ids.index("msg_C2") :][:4] == ["msg_C2", "m-r2:toolu_t", "k-h1", "k-q1"]
    assert "synthesized_tool_results" not in rollout.meta


def test_every_record_of_both_files_is_accounted_for_once():
    items = list(REGISTRY["claude-code"].read_files([MAIN, SIDE]))
    records = sum(1 if isinstance(i, Skipped) else i.records for i in items)
    assert records == nonblank_lines(MAIN) + nonblank_lines(SIDE) == 12


def test_damage_noted_after_the_join_names_the_event_it_was_noted_at(tmp_path):
    """A lost record noted at an entry after the inserted ones still names that entry's
    event (the notes move with the entries)."""
    lines = [
        x.replace('"parentUuid":"m-s1"', '"parentUuid":"gone"')
        for x in MAIN.read_text().splitlines(keepends=True)
    ]
    main, side = _copy(tmp_path, lines)
    (rollout,) = _read(main, side)
    lost = [e for e in rollout.meta["fidelity"] if e["reason"] == "lost_records"]
    assert [e["event_id"] for e in lost] == ["msg_C3"]


REAL = os.environ.get("SEAM_REALWORLD_NEW_DIR")


@pytest.mark.skipif(not REAL, reason="SEAM_REALWORLD_NEW_DIR not set")
def test_the_real_compaction_call_is_rebuilt_from_the_whole_main_history(renderer):
    """spotter_258c7280: the harness reports 169,248 input tokens for the compaction call
    (it was rebuilt from 2,474 as a sub-agent). Joined, it grows from the last main call
    as the harness's count does (within the tokenizers' ratio)."""
    base = Path(str(REAL)) / "claude_code"
    paths = [base / "spotter_258c7280.jsonl", *sorted((base / "spotter_258c7280").rglob("*.jsonl"))]
    rollouts = {r.rollout_id.split("/")[-1]: r for r in _read(*paths)}
    assert not any("acompact" in k for k in rollouts)
    main = next(r for k, r in rollouts.items() if "/" not in k and not k.startswith("agent-"))
    masked, _ = masked_segments(main, Segmenter(renderer), RowOptions(require_outcome=False))
    calls = main.calls()
    spans = [s for m in masked for s in m.segment.spans]
    summary = [s for s in spans if s.kind == "summary"]
    assert len(summary) == 1
    at = spans.index(summary[0])
    before = spans[at - 1]
    reported = [calls[s.call_index].meta["reported_input_tokens"] for s in (before, summary[0])]
    assert reported == [166759, 169248]
    rebuilt_growth = summary[0].start - before.start
    assert 1.0 <= (reported[1] - reported[0]) / rebuilt_growth <= 1.3
    assert summary[0].start > 120_000


def _attachment_record() -> str:
    """A ``task_reminder`` attachment record of the fixture session (the kind newer
    versions write): its presence says the version logs what it attaches."""
    rec = {
        "parentUuid": "m-s1",
        "isSidechain": False,
        "userType": "external",
        "cwd": "/repo",
        "sessionId": SESSION,
        "version": "2.1.207",
        "gitBranch": "main",
        "type": "attachment",
        "attachment": {"type": "task_reminder", "content": [], "itemCount": 0},
        "uuid": "m-at1",
        "timestamp": "2026-02-20T14:01:11.500Z",
    }
    return json.dumps(rec, separators=(",", ":")) + "\n"


def test_a_compaction_in_a_log_without_attachments_flags_the_segments_after_it(tmp_path):
    """Claude Code re-attaches read files, the plan, skills and SessionStart hook output
    after a compaction; a version that writes no attachment record logs none of it, so
    the segments from the compaction on say so. A log that has attachment records holds
    them (rendered by claude_code_attachments): no flag."""
    (rollout,) = _read(MAIN, SIDE)
    flags = [
        e for e in rollout.meta["fidelity"] if e["reason"] == "unlogged_post_compaction_context"
    ]
    assert [e["event_id"] for e in flags] == ["m-cb"]
    assert flags[0]["detail"].startswith("Claude Code 2.1.39 re-attaches")
    lines = MAIN.read_text().splitlines(keepends=True)
    main, side = _copy(tmp_path, [*lines[:8], _attachment_record(), *lines[8:]])
    (rollout,) = _read(main, side)
    assert "unlogged_post_compaction_context" not in [e["reason"] for e in rollout.meta["fidelity"]]
