"""Claude Code session JSONL: one call per API response, compactions, sidechains, skips."""

from collections import Counter

import pytest

from schemas.rollout import Keep, MessageEvent, RewriteEvent, Rollout
from tests.readers.util import accounted, fixture, nonblank_lines, only, read, shape

SESSION = "5b1d6c2e-0000-4000-8000-00000000c0de"


def _validator_accepts_replaced_tool_results() -> bool:
    """Microcompaction needs a rewrite context to replace an already answered tool result."""
    events = [
        MessageEvent(id="u", role="user", content="x"),
        MessageEvent(
            id="a", role="assistant", tool_calls=[{"id": "c", "name": "f", "arguments": "{}"}]
        ),
        MessageEvent(id="t", role="tool", tool_call_id="c", content="long"),
        RewriteEvent(
            id="r",
            reason="compaction",
            trigger="budget",
            context=[
                Keep(id="u"),
                Keep(id="a"),
                MessageEvent(id="t2", role="tool", tool_call_id="c"),
            ],
        ),
        MessageEvent(id="b", role="assistant", content="done"),
    ]
    try:
        Rollout(rollout_id="x", task_id="x", source="test", events=events)
    except ValueError:
        return False
    return True


def test_records_of_one_api_response_become_one_call_with_parallel_tool_calls():
    rollout = only("claude-code", fixture("claude_code", "split_call_parallel_tools.jsonl"))
    assert shape(rollout) == [
        ("user", "u1", "List the files and show the README."),
        ("assistant", "msg_A", "Reading both.", ["toolu_ls", "toolu_cat"]),
        ("tool", "r1:toolu_ls", "README.md\na.txt", "toolu_ls"),
        ("tool", "r2:toolu_cat", "# Demo", "toolu_cat"),
        ("assistant", "msg_B", "The README says Demo.", []),
    ]
    first = rollout.calls()[0]
    assert first.reasoning == "Two reads in parallel."
    assert first.tool_calls[0].arguments == '{"command": "ls"}'
    assert [c.finish_reason for c in rollout.calls()] == ["tool_calls", "stop"]


def test_model_change_within_a_session_is_recorded():
    rollout = only("claude-code", fixture("claude_code", "split_call_parallel_tools.jsonl"))
    assert rollout.model == "claude-opus-4-5-20251101"
    assert rollout.meta["models"] == ["claude-opus-4-5-20251101", "claude-sonnet-4-5-20250929"]


def test_progress_record_between_blocks_is_skipped_not_a_fork():
    _, _, skipped = read("claude-code", fixture("claude_code", "split_call_parallel_tools.jsonl"))
    assert [(s.line, s.reason.split(" ")[0]) for s in skipped] == [(5, "progress")]


def test_auto_compact_boundary_and_summary_become_one_budget_compaction_to_the_summary():
    rollout = only("claude-code", fixture("claude_code", "compact_auto.jsonl"))
    rewrite = [e for e in rollout.events if e.type == "rewrite"]
    assert len(rewrite) == 1
    assert (rewrite[0].id, rewrite[0].reason, rewrite[0].trigger) == ("cb1", "compaction", "budget")
    assert [(m.role, m.id) for m in rewrite[0].context] == [("user", "s1")]
    assert rewrite[0].context[0].content.startswith("This session is being continued")
    assert rewrite[0].meta["pre_tokens"] == 155250
    assert [c.id for c in rollout.calls()] == ["msg_A", "msg_B", "msg_C"]
    assert all(c.call_kind == "action" for c in rollout.calls())


def test_manual_compact_is_a_manual_trigger_and_its_command_records_are_context_not_calls():
    rollout = only("claude-code", fixture("claude_code", "compact_manual.jsonl"))
    assert shape(rollout)[2] == (
        "rewrite",
        "compaction",
        "manual",
        [
            (
                "user",
                "s1",
                "This session is being continued from a previous conversation. Summary: utils.py refactored.",
            )
        ],
    )
    assert [c.id for c in rollout.calls()] == ["msg_A", "msg_B"]
    caveat = next(e for e in rollout.events if e.id == "c1")
    assert caveat.role == "user" and caveat.meta == {"is_meta": True}


@pytest.mark.xfail(
    not _validator_accepts_replaced_tool_results(),
    strict=True,
    reason="schemas/rollout.py rejects a rewrite context that replaces an answered tool result",
)
def test_microcompaction_rewrites_in_place_with_the_cleared_results_replaced():
    rollout = only("claude-code", fixture("claude_code", "microcompact.jsonl"))
    assert shape(rollout)[5] == (
        "rewrite",
        "edit",
        "budget",
        [
            ("keep", "u1"),
            ("keep", "msg_A"),
            ("tool", "r1:toolu_big~cleared", "[Old tool result content cleared]", "toolu_big"),
            ("keep", "msg_B"),
            ("keep", "r2:toolu_small"),
        ],
    )
    assert rollout.events[5].meta["kind"] == "microcompact"


def test_microcompaction_is_never_lost_silently():
    rollouts, rejected, _ = read("claude-code", fixture("claude_code", "microcompact.jsonl"))
    assert len(rollouts) + len(rejected) == 1
    assert rollouts or "more than one result" in rejected[0].reason


def test_sidechain_is_its_own_rollout_linked_to_the_session():
    rollouts, rejected, _ = read("claude-code", fixture("claude_code", "sidechain.jsonl"))
    assert not rejected
    main, side = rollouts
    assert (main.rollout_id, main.parent_rollout_id) == (SESSION, None)
    assert (side.rollout_id, side.parent_rollout_id) == (f"{SESSION}/agent-agent_7f3a", SESSION)
    assert side.task_id == SESSION and side.meta["agent_id"] == "agent_7f3a"
    assert [c.id for c in side.calls()] == ["msg_S1", "msg_S2"]
    assert [c.id for c in main.calls()] == ["msg_A", "msg_B"]


def test_slice_with_missing_first_parent_reads_and_skips_the_orphan_result():
    rollouts, rejected, skipped = read(
        "claude-code", fixture("claude_code", "sliced_missing_parent.jsonl")
    )
    assert not rejected and len(rollouts) == 1
    assert [(s.line, s.reason.split(" ")[0]) for s in skipped] == [(1, "tool_result")]
    assert [m[0] for m in shape(rollouts[0])] == ["assistant", "user", "assistant"]


def test_records_that_are_not_model_calls_are_skipped_with_their_reason():
    rollouts, rejected, skipped = read(
        "claude-code", fixture("claude_code", "non_call_records.jsonl")
    )
    assert not rejected
    assert [c.content for c in rollouts[0].calls()] == ["Fixed the login bug."]
    reasons = Counter(s.reason for s in skipped)
    assert reasons == Counter(
        {
            "session title record (for resume; not a compaction)": 1,
            "file-history-snapshot record (undo bookkeeping)": 1,
            "system/api_error record: not sent to the model": 1,
            "API error message (written by Claude Code, not a model call)": 1,
            "synthetic assistant record (written by Claude Code, not a model call)": 1,
            "'queue-operation' record: not a model message": 1,
            "'last-prompt' record: not a model message": 1,
        }
    )
    # The attachment (a todo reminder of Claude Code 2.0.76) reached the model: it is in the
    # context, rendered as 2.1.197 renders it and flagged as an unverified version.
    reminders = [e for e in rollouts[0].events if e.meta.get("attachment") == "todo_reminder"]
    assert len(reminders) == 1 and "TodoWrite tool hasn't been used" in reminders[0].content
    fidelity = {f["reason"]: f["detail"] for f in rollouts[0].meta["fidelity"]}
    assert "2.0.76" in fidelity["unverified_attachment"]


def test_unanswered_tool_call_gets_a_flagged_placeholder_result(tmp_path):
    lines = fixture("claude_code", "split_call_parallel_tools.jsonl").read_text().splitlines()
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(line for line in lines if '"uuid":"r2"' not in line) + "\n")
    rollout = only("claude-code", path)
    placeholder = next(
        e for e in rollout.events if e.type == "message" and e.tool_call_id == "toolu_cat"
    )
    assert placeholder.meta["synthesized"] and rollout.meta["synthesized_tool_results"] == 1


def test_a_bad_line_is_rejected_and_the_rest_still_reads(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(fixture("claude_code", "compact_auto.jsonl").read_text() + "{not json\n")
    rollouts, rejected, _ = read("claude-code", path)
    assert len(rollouts) == 1 and [r.line for r in rejected] == [8]


@pytest.mark.parametrize(
    "name",
    [
        "split_call_parallel_tools.jsonl",
        "compact_auto.jsonl",
        "compact_manual.jsonl",
        "microcompact.jsonl",
        "sidechain.jsonl",
        "sliced_missing_parent.jsonl",
        "non_call_records.jsonl",
        f"{SESSION}.jsonl",
    ],
)
def test_every_line_is_accounted_for(name):
    path = fixture("claude_code", name)
    assert accounted(path, "claude-code") == nonblank_lines(path)


def test_resumed_session_copies_are_context_not_calls():
    rollout = only("claude-code", fixture("claude_code", f"{SESSION}.jsonl"))
    assert shape(rollout) == [
        (
            "rewrite",
            "edit",
            "manual",
            [
                ("user", "o1", "Set up the project."),
                ("assistant", "msg_OLD", "Project set up.", []),
            ],
        ),
        ("user", "u1", "Now add CI."),
        ("assistant", "msg_NEW", "Added CI.", []),
    ]
    assert rollout.rollout_id == SESSION
    assert rollout.events[0].meta["resumed_from"] == "0a0a0a0a-0000-4000-8000-000000000001"
