"""The judge and the audit on Claude Code sessions: summaries a rewrite inserted are judged,
a microcompaction is never the summary, facts parse the way Claude Code writes them, and
rules apply only where they can (the harness decides compactions; read-before-edit; a
user message after the compaction overrides the summary's next step).

The fixture ``judge_compactions.jsonl`` is written in Claude Code's record format: a
session that reads files under dot-directories, shows a ``git diff`` quoting an error
class, fails ``mise run test`` (``is_error``), edits, is microcompacted and then
auto-compacted, re-reads a file to edit it, commits, is compacted by ``/compact``, gets a
new user request, and is saved while its last ``git commit`` is in flight.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from judge.audit import audit_rollout
from judge.facts import classify, located_paths_in, looks_failed, paths_in
from judge.history import compactions, summary_of
from judge.rules import ALL_CHECKS, judge_rollout, missed_triggers
from judge.summary import split_summary, summary_body
from judge.workspace import workspace_state
from pipeline.sft.filters import FilterOptions, rollout_filter, trim_dangling_call
from schemas.replay import replay
from schemas.rollout import RewriteEvent, ToolCall
from tests.readers.util import fixture, only

FIXTURE = fixture("claude_code", "judge_compactions.jsonl")
REAL = Path(os.environ["SEAM_REALWORLD_DIR"]) if os.environ.get("SEAM_REALWORLD_DIR") else None
needs_real = pytest.mark.skipif(
    REAL is None or not (REAL / "claude_code").is_dir(),
    reason="SEAM_REALWORLD_DIR is not set or has no claude_code folder",
)


def session(text_edit=None):
    if text_edit is None:
        return only("claude-code", FIXTURE)
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"judge-cc-{os.getpid()}.jsonl"
    path.write_text(text_edit(FIXTURE.read_text()))
    try:
        return only("claude-code", path)
    finally:
        path.unlink()


def test_summaries_are_the_inserted_messages_and_the_microcompaction_is_not_one():
    rollout = session()
    rewrites = [e for e in rollout.events if isinstance(e, RewriteEvent)]
    assert [r.meta.get("kind") for r in rewrites] == ["microcompact", None, None]
    assert summary_of(rewrites[0]) == ()
    comps = compactions(rollout, replay(rollout))
    assert [(c.message_id, c.trigger, c.summary_call) for c in comps] == [
        ("s1", "budget", None),
        ("s2", "manual", None),
    ]
    assert comps[0].summary.startswith("This session is being continued")
    assert "[Old tool result content cleared]" not in comps[0].summary
    assert [c.opens.index for c in comps] == [6, 11]
    assert not any(c.policy_chose for c in comps)


def test_the_audit_covers_both_summaries_with_the_first_call_each_opens():
    audits = audit_rollout(session())
    assert [(a.message_id, a.call_index, a.opens_call_index) for a in audits] == [
        ("s1", None, 6),
        ("s2", None, 11),
    ]
    first, second = audits
    assert (first.omitted, first.invented_paths, first.has_next_step) == ([], [], True)
    assert (second.next_step_none, second.has_next_step) == (True, True)


def test_paths_under_dot_directories_are_paths():
    text = "read /work/app/.claude/settings.json, .worktrees/x/cmd/a.go and .github/ci.yml."
    assert paths_in(text) == [
        "/work/app/.claude/settings.json",
        ".worktrees/x/cmd/a.go",
        ".github/ci.yml",
    ]


def test_an_error_class_in_output_is_not_a_failure_and_the_harness_flag_decides():
    assert not looks_failed("+type ShadowBranchConflictError struct{}")
    assert looks_failed("KeyError: 'tz'")
    comp = compactions(session(), replay(session()))[0]
    state = workspace_state(comp.history)
    # git diff quotes ShadowBranchConflictError; only `mise run test` failed (is_error).
    assert state.failing_commands == {"mise run test": []}
    assert state.errors == []


def test_test_log_lines_are_not_key_files_and_mise_run_test_is_a_test_run():
    assert located_paths_in("    hooks_test.go:196: expected a shadow branch") == []
    assert located_paths_in("./cmd/app/hooks.go:12:3: undefined: x") == ["cmd/app/hooks.go"]
    assert (
        classify(ToolCall(id="t", name="Bash", arguments='{"command": "mise run test"}')).kind
        == "test"
    )
    comp = compactions(session(), replay(session()))[0]
    assert [p.rsplit("/", 1)[-1] for p in workspace_state(comp.history).key_files] == ["hooks.go"]


def test_the_next_step_is_the_optional_next_step_section_not_pending_tasks():
    summary = summary_body(compactions(session(), replay(session()))[0].summary)
    _, step = split_summary(summary)
    assert step == "Run `mise run test` to check that `TestRunHook` passes now."
    assert "Re-run the tests" not in step
    assert "read the full transcript" not in summary and "Please continue" not in summary


def test_the_rule_judge_finds_nothing_wrong_in_the_session():
    assert judge_rollout(session(), ALL_CHECKS) == []


def test_trigger_rules_do_not_apply_when_the_harness_compacts():
    rollout = session()
    # settings.json is read twice with nothing written between: the unscoped rule fires...
    assert [f.verdict for f in missed_triggers(rollout, replay(rollout))] == ["missing_trigger"]
    # ... but in Claude Code the agent never decides to compact.
    assert not [f for f in judge_rollout(rollout, ALL_CHECKS) if f.type == "trigger"]


def test_a_reread_before_an_edit_is_not_a_redo():
    rollout = session(
        lambda t: t.replace(
            '"name": "Edit", "input": {"file_path": "/work/app/.claude',
            '"name": "Edit", "input": {"file_path": "/work/app/.claudx',
        )
    )
    # Without the edit of settings.json after it, the re-read repeats established work.
    found = [(f.type, f.verdict, f.call_index) for f in judge_rollout(rollout, ALL_CHECKS)]
    assert ("continuation", "redo", 6) in found


def test_a_user_message_after_the_compaction_overrides_the_next_step():
    step = json.dumps("None – the task is complete")[1:-1]  # as the JSONL spells it
    pending = "Watch the CI of PR #12 with `gh pr checks 12`"
    rollout = session(lambda t: t.replace(step, pending))
    assert not [f for f in judge_rollout(rollout, ALL_CHECKS) if f.type == "continuation"]
    silent = session(
        lambda t: t.replace(step, pending).replace("Now also document the hook", "<command-name>x")
    )
    assert [f.verdict for f in judge_rollout(silent, ALL_CHECKS) if f.type == "continuation"] == [
        "ignored_next_step"
    ]


def test_a_call_left_waiting_for_its_result_is_trimmed_not_a_malformed_rollout():
    rollout = session()
    assert rollout.calls()[-1].tool_calls[0].name == "Bash"
    trimmed = trim_dangling_call(rollout)
    assert len(trimmed.calls()) == len(rollout.calls()) - 1
    assert trim_dangling_call(trimmed) is None
    assert rollout_filter(trimmed, FilterOptions()) is None


# --- the real files ---------------------------------------------------------------------


@needs_real
def test_real_sessions_every_summary_is_audited_and_no_microcompaction_is():
    from collections import Counter

    from pipeline.cli.judge import iter_input_rollouts

    rollouts = list(iter_input_rollouts([str(REAL / "claude_code")], "auto", Counter()))
    audits = [a for r in rollouts for a in audit_rollout(r)]
    real = [a for a in audits if not a.rollout_id.startswith("ses_stage0")]
    # six compact_boundary + isCompactSummary pairs in the three real entireio files; the
    # microcompact_boundary of d5-99f72ee73a is none of them.
    assert len(real) == 6
    by_rollout = Counter(a.rollout_id[:8] for a in real)
    assert by_rollout == {"198393f2": 1, "0cf3db51": 2, "6113e919": 3}
    assert all(a.words > 1000 for a in real)
    # Every real summary has a "9. Optional Next Step" that is either concrete or says
    # that nothing is left (d2168b14: "No explicit next step requested").
    assert all(a.has_next_step for a in real)
    assert [a.message_id[:8] for a in real if a.next_step_none] == ["d2168b14"]
    # No harness-compacted session is judged for its trigger.
    findings = [f for r in rollouts for f in judge_rollout(r, ALL_CHECKS)]
    assert not [f for f in findings if f.type == "trigger"]


@needs_real
def test_real_paths_under_dot_directories_are_seen():
    rollout = only("claude-code", REAL / "claude_code" / "agentic-primer_agent-a0294d5.jsonl")
    seen = workspace_state(m for e in rollout.events if hasattr(e, "role") for m in [e]).seen_paths
    assert any(p.endswith(".github/workflows/issue-agent.yml") for p in seen)


def test_build_sft_carries_every_summary_audit_and_keeps_the_session(tmp_path):
    from pipeline.build.run import BuildConfig, run_build
    from pipeline.cli.judge import _audits_from_shards
    from pipeline.sft.stage import SftStage

    result = run_build(
        BuildConfig(
            inputs=[str(FIXTURE)],
            out=str(tmp_path / "out"),
            kind="sft",
            workers=1,
            progress=False,
            stage=SftStage(None, FilterOptions()),
        )
    )
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["counts"]["accepted"] == 1
    assert manifest["counts"]["trimmed_dangling_calls"] == 1
    from_shards = _audits_from_shards(result.out)
    from_raw = [{"rollout_id": a.rollout_id, **a.as_struct()} for a in audit_rollout(session())]
    assert [a["message_id"] for a in from_shards] == ["s1", "s2"]
    key = lambda a: {k: a[k] for k in ("message_id", "opens_call_index", "has_next_step")}  # noqa: E731
    assert [key(a) for a in from_shards] == [key(a) for a in from_raw]


def test_where_the_harness_flags_failures_an_unflagged_result_passed():
    from schemas.rollout import MessageEvent

    def run(call_id, command, output, **meta):
        return [
            MessageEvent(
                id=f"a{call_id}",
                role="assistant",
                tool_calls=[
                    ToolCall(id=call_id, name="Bash", arguments=json.dumps({"command": command}))
                ],
            ),
            MessageEvent(
                id=f"t{call_id}", role="tool", tool_call_id=call_id, content=output, meta=meta
            ),
        ]

    logged = "ERROR: connection refused (expected: the retry test logs it)\nok  app 0.1s"
    messages = run("c1", "go build ./...", "Exit code 1\nundefined: x", is_error=True)
    messages += run("c2", "mise run test", logged)
    assert workspace_state(messages).failing_commands == {"go build ./...": []}
    # With no flag anywhere, the text decides.
    assert list(workspace_state(run("c2", "mise run test", logged)).failing_commands) == [
        "mise run test"
    ]


def test_a_microcompaction_is_never_a_summary_even_if_it_inserts_a_message():
    from schemas.rollout import Keep, MessageEvent

    note = MessageEvent(id="n", role="user", content="[tool results cleared]")
    micro = RewriteEvent(
        id="m",
        reason="compaction",
        trigger="budget",
        context=[Keep(id="u"), note],
        meta={"kind": "microcompact"},
    )
    assert summary_of(micro) == ()
    assert summary_of(micro.model_copy(update={"meta": {}})) == (note,)


@needs_real
def test_real_slice_build_carries_the_audit_seam_audit_finds_in_the_raw_file(tmp_path):
    from pipeline.build.run import BuildConfig, run_build
    from pipeline.cli.judge import _audits_from_shards
    from pipeline.sft.stage import SftStage

    raw = REAL / "claude_code" / "entireio-cli_a6-e4c2a0fbd1_0_full.jsonl"
    result = run_build(
        BuildConfig(
            inputs=[str(raw)],
            out=str(tmp_path / "out"),
            kind="sft",
            workers=1,
            progress=False,
            stage=SftStage(None, FilterOptions()),
        )
    )
    from_raw = [a.as_struct() for a in audit_rollout(only("claude-code", raw))]
    from_shards = _audits_from_shards(result.out)
    assert len(from_raw) == len(from_shards) == 1
    assert from_shards[0]["message_id"] == from_raw[0]["message_id"]
    assert from_shards[0]["history_complete"] is False  # a slice: invented paths not judged
    assert from_shards[0]["invented_paths"] == []


@needs_real
def test_seam_audit_skips_damaged_logs_as_the_build_does(capsys):
    from pipeline.cli import main

    assert main(["audit", str(REAL / "claude_code"), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["summaries"] == 6  # the six real compactions
    assert "ses_stage0_small/sidechain-sys1: damaged log" in out.err
    assert main(["audit", str(REAL / "claude_code"), "--json", "--keep-damaged"]) == 0
    assert json.loads(capsys.readouterr().out)["summaries"] == 7
