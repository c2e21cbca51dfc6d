"""Claude Code attachments as the model saw them: each fixture in tests/fixtures/claude_code_cli
is a session file written by the real Claude Code 2.1.197 CLI (run offline against a
stand-in model server on 127.0.0.1) and the last request that CLI sent. Seam's context
of the last call must be that request's messages, block for block (the system prompt, the
tool schemas and Claude Code's ``currentDate`` context block are not in the log)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.core.fidelity import segment_fidelity
from pipeline.core.segment import Segmenter
from pipeline.readers import REGISTRY, Accepted, Skipped
from pipeline.readers.claude_code_placement import result_text
from schemas.replay import replay

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "claude_code_cli"
NOT_LOGGED = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context:"
)


def _request_blocks(messages: list[dict]) -> list[tuple[str, str]]:
    """(role, text) per block of an Anthropic request, as seam's messages hold them."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            out.append((m["role"], content))
        elif m["role"] == "assistant":
            out.append(("assistant", "".join(b.get("text", "") for b in content)))
        else:
            for b in content:
                if b["type"] == "tool_result":
                    out.append(("tool", result_text(b.get("content"))))
                elif b["type"] == "image":
                    out.append((m["role"], "[image]"))
                else:
                    out.append((m["role"], b["text"]))
    return [(r, t.strip()) for r, t in out if not t.startswith(NOT_LOGGED)]


def _read(name: str):
    items = list(REGISTRY["claude-code"].read(CAPTURES / name / "session.jsonl"))
    (rollout,) = [i.rollout for i in items if isinstance(i, Accepted)]
    return rollout, items


@pytest.mark.parametrize(
    "name",
    ["mentions", "hooks", "tool_reference_and_image", "task_reminder", "plan_mode", "system_mode"],
)
def test_the_last_call_sees_exactly_what_claude_code_sent(name):
    rollout, _ = _read(name)
    request = json.loads((CAPTURES / name / "request.json").read_text())
    last = replay(rollout)[-1]
    seen = [(m.role, m.content.strip()) for m in last.context]
    assert seen == _request_blocks(request["messages"])


def test_attachment_kinds_claude_code_never_sends_are_skipped_with_that_reason():
    _, items = _read("hooks")
    skipped = [i.reason for i in items if isinstance(i, Skipped)]
    # the PostToolUse hook's own success record: Claude Code renders it to nothing
    assert (
        skipped.count("attachment 'hook_success': Claude Code sends nothing to the model for it")
        == 1
    )


REAL_NEW = Path(os.environ.get("SEAM_REALWORLD_NEW_DIR", "/nonexistent")) / "claude_code"
ATTACHED = REAL_NEW / "wakil_32340547b1ec32_0_full.jsonl"  # Claude Code 2.1.207–2.1.215


def _growth_pairs(path: Path, renderer) -> list[tuple[int, int, set[str]]]:
    """(reported growth, rebuilt growth, attachment kinds between) per pair of consecutive
    calls of a segment. Each side leaves out the earlier call's own output (the harness
    reports its output tokens; seam has its span), so thinking the log keeps only as a
    signature does not count against the attachments."""
    raw = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    output: dict[str, int] = {}
    between: dict[str, set[str]] = {}
    kinds: set[str] = set()
    for rec in raw:
        if rec.get("type") == "attachment":
            kinds.add(rec["attachment"]["type"])
        elif rec.get("type") == "assistant":
            mid = rec["message"]["id"]
            used = rec["message"].get("usage") or {}
            output[mid] = max(output.get(mid, 0), used.get("output_tokens") or 0)
            if mid not in between:
                between[mid], kinds = kinds, set()
    (rollout,) = [i.rollout for i in REGISTRY["claude-code"].read(path) if isinstance(i, Accepted)]
    calls = rollout.calls()
    pairs = []
    for seg in Segmenter(renderer).segments(rollout):
        for a, b in zip(seg.spans, seg.spans[1:]):
            first, second = calls[a.call_index], calls[b.call_index]
            rep = second.meta["reported_input_tokens"] - first.meta["reported_input_tokens"]
            pairs.append((rep - output[first.id], b.start - a.start - a.length, between[second.id]))
    return pairs


@pytest.mark.skipif(not ATTACHED.is_file(), reason="SEAM_REALWORLD_NEW_DIR not set")
def test_attachments_explain_the_reported_growth_of_a_real_session(renderer):
    """Real session with file, directory, plan-mode, task-reminder ... attachments: the
    harness counts ``k`` of its tokens per seam token on pairs with nothing attached (its
    tokenizer is not seam's); over the pairs with attachments between them, seam's rebuilt
    growth times ``k`` is the reported growth within 10% (it was 1.73x before attachments
    were rendered: a file mention alone was 3.2k tokens unexplained)."""
    pairs = _growth_pairs(ATTACHED, renderer)
    clean = [(rep, reb) for rep, reb, kinds in pairs if not kinds]
    k = sum(rep for rep, _ in clean) / sum(reb for _, reb in clean)
    attached = [(rep, reb) for rep, reb, kinds in pairs if kinds]
    assert len(attached) == 14
    ratio = sum(rep for rep, _ in attached) / (k * sum(reb for _, reb in attached))
    assert 0.9 <= ratio <= 1.1
    for rep, reb in attached:  # no single pair is left thousands of tokens short
        assert rep - k * reb < 800


def _with_attachment(tmp_path: Path, attachment: dict, version: str = "2.1.197") -> Path:
    """The ``hooks`` capture with one more attachment record before its last call."""
    records = [
        json.loads(x) for x in (CAPTURES / "hooks" / "session.jsonl").read_text().splitlines()
    ]
    last_call = max(i for i, r in enumerate(records) if r["type"] == "assistant")
    extra = {**records[last_call - 1], "type": "attachment", "uuid": "a-extra", "version": version}
    extra.pop("message", None)
    extra.pop("toolUseResult", None)
    extra["attachment"] = attachment
    records.insert(last_call, extra)
    path = tmp_path / "session.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _fidelity(path: Path) -> dict[str, str]:
    (rollout,) = [i.rollout for i in REGISTRY["claude-code"].read(path) if isinstance(i, Accepted)]
    return {f["reason"]: f["detail"] for f in rollout.meta["fidelity"]}


def test_an_attachment_seam_cannot_render_is_flagged_by_its_type(tmp_path, renderer):
    path = _with_attachment(tmp_path, {"type": "silent_turn_reminder", "text": "x"})
    fidelity = _fidelity(path)
    assert "'silent_turn_reminder'" in fidelity["unrendered_attachment"]
    (rollout,) = [i.rollout for i in REGISTRY["claude-code"].read(path) if isinstance(i, Accepted)]
    segments = Segmenter(renderer).segments(rollout)
    assert "unrendered_attachment" in segment_fidelity(rollout, segments)[-1]


def test_a_known_kind_of_an_unobserved_version_is_rendered_and_flagged(tmp_path):
    path = _with_attachment(
        tmp_path, {"type": "date_change", "newDate": "2026-12-02"}, version="2.1.150"
    )
    assert "2.1.150" in _fidelity(path)["unverified_attachment"]
    (rollout,) = [i.rollout for i in REGISTRY["claude-code"].read(path) if isinstance(i, Accepted)]
    # written after a tool result: folded into it, as Claude Code sends it
    (result,) = [e for e in rollout.events if e.type == "message" and e.role == "tool"]
    assert result.content == (
        "hi\n\n<system-reminder>\nThe date has changed. Today's date is now 2026-12-02. DO NOT "
        "mention this to the user explicitly because they are already aware.\n</system-reminder>"
    )
    assert "unverified_attachment" not in _fidelity(
        _with_attachment(tmp_path, {"type": "date_change", "newDate": "d"})
    )


def test_a_pasted_image_keeps_a_placeholder_and_is_counted(tmp_path):
    records = [
        json.loads(x) for x in (CAPTURES / "hooks" / "session.jsonl").read_text().splitlines()
    ]
    prompt = next(r for r in records if r["type"] == "user")
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    prompt["message"]["content"] = [image, image, {"type": "text", "text": "what is this?"}]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "2 image(s)" in _fidelity(path)["image_content"]
    (rollout,) = [i.rollout for i in REGISTRY["claude-code"].read(path) if isinstance(i, Accepted)]
    assert any(
        e.content == "[image]\n[image]\nwhat is this?"
        for e in rollout.events
        if e.type == "message"
    )


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("mentions", {"image_content": "1 image(s) attached"}),
        (
            "tool_reference_and_image",
            {
                "image_content": "1 image(s) in a tool result",
                "unrendered_tool_reference": "WebFetch",
            },
        ),
        ("hooks", {}),
        ("task_reminder", {}),
        ("plan_mode", {}),
        ("system_mode", {}),
    ],
)
def test_captures_are_flagged_exactly_where_seam_cannot_reproduce_the_request(name, flags):
    fidelity = _fidelity(CAPTURES / name / "session.jsonl")
    fidelity.pop("missing_system_prompt")
    fidelity.pop("missing_tool_schemas")
    assert set(fidelity) == set(flags)
    for reason, part in flags.items():
        assert part in fidelity[reason]


def test_system_mode_attachments_right_after_a_call_are_a_user_message(tmp_path):
    """Claude Code sends gathered system text as a ``system`` message only after a user
    message; right after a call it wraps it in a user message. The system_mode capture
    without its "read @notes.md" prompt: the mention's text follows the call directly."""
    records = [
        json.loads(x) for x in (CAPTURES / "system_mode" / "session.jsonl").read_text().splitlines()
    ]
    prompt = next(r for r in records if r.get("message", {}).get("content") == "read @notes.md")
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records if r is not prompt))
    (rollout,) = [i.rollout for i in REGISTRY["claude-code"].read(path) if isinstance(i, Accepted)]
    context = replay(rollout)[2].context
    assert [m.role for m in context[-2:]] == ["assistant", "user"]
    assert context[-1].content.startswith("<system-reminder>\nCalled the Read tool")


def test_tool_input_fields_claude_code_injects_are_neither_trained_nor_context(tmp_path):
    """Claude Code writes the plan it read from disk into ExitPlanMode's input (the model
    sent ``{}``) and strips it when it sends the history; an Edit with ``edits`` gets the
    first edit's strings copied up. The call's arguments are what the model produced."""
    records = [
        json.loads(x) for x in (CAPTURES / "hooks" / "session.jsonl").read_text().splitlines()
    ]
    call = next(r for r in records if r["type"] == "assistant")
    plan = {"plan": "# Plan\n\nStep one.", "planFilePath": "/home/dev/.claude/plans/p.md"}
    edit = {"file_path": "a.py", "edits": [{"old_string": "a", "new_string": "b"}]}
    call["message"]["content"] = [
        {"type": "tool_use", "id": "toolu_plan", "name": "ExitPlanMode", "input": plan},
        {
            "type": "tool_use",
            "id": "toolu_edit",
            "name": "Edit",
            "input": {**edit, "old_string": "a", "new_string": "b"},
        },
        {
            "type": "tool_use",
            "id": "toolu_bash",
            "name": "Bash",
            "input": {"command": "ls", "plan": "x"},
        },
        {
            "type": "tool_use",
            "id": "toolu_one",
            "name": "Edit",
            "input": {"old_string": "a", "new_string": "b"},
        },
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (rollout,) = [i.rollout for i in REGISTRY["claude-code"].read(path) if isinstance(i, Accepted)]
    (first, *_) = rollout.calls()
    assert [json.loads(c.arguments) for c in first.tool_calls] == [
        {},
        edit,
        {"command": "ls", "plan": "x"},
        {"old_string": "a", "new_string": "b"},  # a plain Edit: the model's own strings
    ]
