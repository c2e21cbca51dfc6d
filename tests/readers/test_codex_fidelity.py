"""Codex logs exactly as the model saw them (issue 12): developer messages inside a call,
resumed Desktop sessions, compactions that are exactly ``replacement_history``, opaque
remote summaries and web search results, freeform tools, provider-reported input sizes.
The real files (``$SEAM_REALWORLD_DIR/codex``) are checked against their raw records."""

import json
import os
from pathlib import Path

import pytest

from pipeline.core.fidelity import segment_fidelity
from pipeline.core.segment import Segmenter
from pipeline.readers.builder import MISSING_RESULT
from pipeline.readers.codex import (
    ENCRYPTED_SUMMARY,
    WEB_SEARCH_RESULTS,
    rollouts_from_records,
)
from pipeline.readers.common import iter_json_records
from pipeline.sft.filters import FilterOptions, rollout_filter
from schemas.replay import replay
from schemas.rollout import MessageEvent
from tests.readers.util import accounted, fixture, nonblank_lines, only, read, shape

BASE = ("system", "base_instructions", "You are Codex, a coding agent.")


def test_a_developer_message_between_a_call_and_its_output_keeps_that_order_and_the_pairing():
    rollout = only("codex", fixture("codex", "developer_inside_call.jsonl"))
    assert shape(rollout)[3:6] == [
        ("assistant", "L6", "", ["call_rm"]),
        ("system", "L9", "Approved command prefix saved: rm -rf build"),
        ("tool", "L10", "removed build/", "call_rm"),
    ]
    assert "synthesized_tool_results" not in rollout.meta
    # The next call saw call → developer message → output, in that order.
    after = replay(rollout)[1].context
    assert [m.id for m in after[-3:]] == ["L6", "L9", "L10"]


def test_an_interrupted_call_gets_its_placeholder_right_after_it_and_a_late_output_is_kept():
    rollout = only("codex", fixture("codex", "interrupted_call.jsonl"))
    assert shape(rollout)[2:] == [
        ("assistant", "L4", "", ["call_ls", "call_srv"]),
        ("tool", "L7", "serve.py", "call_ls"),
        ("tool", "call_srv:no-result", MISSING_RESULT, "call_srv"),
        ("user", "L9", "Stop, run the tests instead."),
        ("assistant", "L11", "", ["call_test"]),
        ("user", "L13", "Also lint afterwards."),
        ("tool", "L14", "3 passed", "call_test"),
        ("assistant", "L16", "Tests pass; linting next.", []),
        # The live context kept that order too: undoing the last turn keeps it.
        (
            "rewrite",
            "edit",
            "manual",
            [
                ("keep", i)
                for i in ["base_instructions", "L2", "L4", "L7", "call_srv:no-result", "L9", "L11"]
            ],
        ),
    ]
    assert rollout.meta["synthesized_tool_results"] == 1
    # The next call saw the placeholder where Codex puts it: with the call's results.
    assert [m.id for m in replay(rollout)[1].context][2:] == [
        "L4",
        "L7",
        "call_srv:no-result",
        "L9",
    ]


def test_a_session_meta_repeated_on_a_resumed_turn_continues_the_same_rollout():
    rollouts, rejected, _ = read("codex", fixture("codex", "developer_inside_call.jsonl"))
    assert not rejected and len(rollouts) == 1
    (rollout,) = rollouts
    assert rollout.rollout_id == "019c9000-0000-7000-8000-0000000d0e50"
    assert rollout.meta["resumed"] == 1
    # The resumed turn's call sees the whole earlier history.
    last = replay(rollout)[-1]
    assert {"L6", "L10", "L12"} <= {m.id for m in last.context}


def test_records_of_one_session_from_several_files_make_one_rollout():
    path = fixture("codex", "developer_inside_call.jsonl")
    records = list(iter_json_records(path))
    second = next(i for i, r in enumerate(records) if i and r[1]["type"] == "session_meta")
    # Two "files": the first turn, then the resumed turn (given in order).
    items = list(rollouts_from_records(records[:second] + records[second:], "x"))
    (rollout,) = [i.rollout for i in items if hasattr(i, "rollout")]
    assert shape(rollout) == shape(only("codex", path))


def test_token_count_gives_each_call_its_reported_input_tokens():
    rollout = only("codex", fixture("codex", "developer_inside_call.jsonl"))
    assert [c.meta.get("reported_input_tokens") for c in rollout.calls()] == [
        1200,
        1300,
        1400,
        1450,
    ]


def test_a_compaction_is_exactly_replacement_history_without_reasoning_it_dropped():
    rollout = only("codex", fixture("codex", "compacted_drops_reasoning.jsonl"))
    assert rollout.calls()[0].reasoning == "Private plan: read a.py first."
    rewrite = shape(rollout)[4]
    assert rewrite == (
        "rewrite",
        "compaction",
        "budget",
        [
            ("keep", "base_instructions"),
            ("keep", "L2"),
            ("assistant", "L9.1", "a.py sets x.", []),
            ("keep", "L7"),
        ],
    )
    after = replay(rollout)[-1].context
    assert [m.reasoning for m in after if m.role == "assistant"] == [None]


def test_two_remote_compactions_are_two_distinct_opaque_items_and_not_a_summary_loop():
    rollout = only("codex", fixture("codex", "compacted_remote_twice.jsonl"))
    rewrites = [e for e in rollout.events if e.type == "rewrite"]
    opaque = [rw.context[-1] for rw in rewrites]
    assert [(m.id, m.content, m.meta["encrypted_content"]) for m in opaque] == [
        ("L7.1", ENCRYPTED_SUMMARY, "gAAAA-summary-1"),
        ("L12.1", ENCRYPTED_SUMMARY, "gAAAA-summary-2"),
    ]
    assert all(rw.meta["remote"] is True for rw in rewrites)
    assert [f["reason"] for f in rollout.meta["fidelity"]] == ["missing_tool_schemas"] + [
        "opaque_summary"
    ] * 2
    # No empty user turn anywhere in any context.
    for view in replay(rollout):
        assert all(m.content.strip() for m in view.context if m.role == "user")
    assert rollout_filter(rollout, FilterOptions()) is None


def test_a_web_search_is_trained_as_a_call_and_its_unrecorded_results_are_opaque():
    rollout = only("codex", fixture("codex", "web_search.jsonl"))
    assert shape(rollout)[2:5] == [
        ("assistant", "L4", "", ["ws_1"]),
        ("tool", "L5:results", WEB_SEARCH_RESULTS, "ws_1"),
        ("assistant", "L6", "Python 3.14 is current.", []),
    ]
    search = rollout.calls()[0]
    assert (search.tool_calls[0].name, json.loads(search.tool_calls[0].arguments)) == (
        "web_search",
        {"type": "search", "query": "latest python release"},
    )
    assert search.meta["tool_kinds"] == {"ws_1": "builtin"}
    assert "builtin_calls" not in search.meta
    assert rollout.meta["fidelity"][1:] == [
        {
            "reason": "opaque_tool_result",
            "event_id": "L5:results",
            "detail": "web search ws_1: its results are not in the log",
        }
    ]
    # The later turn sees the search as the model did.
    assert [m.id for m in replay(rollout)[-1].context][2:5] == ["L4", "L5:results", "L6"]


def test_a_custom_tool_input_is_raw_text_and_not_a_malformed_request():
    rollout = only("codex", fixture("codex", "custom_tool.jsonl"))
    call = rollout.calls()[0]
    assert call.tool_calls[0].arguments.startswith("*** Begin Patch\n*** Update File: a.py")
    assert call.meta["tool_kinds"] == {"call_patch": "custom"}
    assert rollout_filter(rollout, FilterOptions()) is None
    # The same raw text on a plain function tool is still malformed.
    plain = rollout.model_copy(deep=True)
    plain.calls()[0].meta.pop("tool_kinds")
    assert rollout_filter(plain, FilterOptions())[0] == "malformed_request"


@pytest.mark.parametrize(
    "name",
    [
        "developer_inside_call.jsonl",
        "web_search.jsonl",
        "custom_tool.jsonl",
        "compacted_remote_twice.jsonl",
        "compacted_drops_reasoning.jsonl",
        "interrupted_call.jsonl",
    ],
)
def test_every_line_of_the_new_fixtures_is_accounted_for(name):
    path = fixture("codex", name)
    assert accounted(path, "codex") == nonblank_lines(path)


# -- the real files ----------------------------------------------------------------------

ROOT = Path(os.environ["SEAM_REALWORLD_DIR"]) if os.environ.get("SEAM_REALWORLD_DIR") else None
REAL = {
    # file prefix: (calls, segments)
    "localpush_rollout-2026-02-23T12-47-42": (83, 1),
    "agentv_rollout-00-34f597b72d-1": (180, 3),
}
OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output")
CALL_TYPES = ("function_call", "custom_tool_call")


def _real(prefix: str) -> Path:
    if ROOT is None or not ROOT.is_dir():
        pytest.skip("SEAM_REALWORLD_DIR is not set or is not a directory")
    (path,) = ROOT.glob(f"codex/{prefix}*.jsonl")
    return path


def _raw(path: Path) -> tuple[list[dict], dict[str, str], set[str]]:
    """Response items; text outputs by call id; outputs fed only to a compaction (the
    inputs between the last model output and a ``compacted`` record)."""
    items, outputs, only_compaction, since_output = [], {}, set(), []
    for _, rec, _, _ in iter_json_records(path):
        if rec["type"] == "compacted":
            only_compaction.update(since_output)
        if rec["type"] != "response_item":
            continue
        item = rec["payload"]
        items.append(item)
        if item["type"] in OUTPUT_TYPES:
            outputs[item["call_id"]] = item["output"]
            since_output.append(item["call_id"])
        elif item["type"] in CALL_TYPES or item.get("role") == "assistant":
            since_output = []
    return items, outputs, only_compaction


@pytest.mark.parametrize("prefix", sorted(REAL))
def test_real_codex_session_every_output_in_context_every_piece_trained_once(prefix, renderer):
    path = _real(prefix)
    rollouts, rejected, _ = read("codex", path)
    assert not rejected and len(rollouts) == 1
    (rollout,) = rollouts
    items, outputs, only_compaction = _raw(path)
    views = replay(rollout)
    calls, segments = REAL[prefix]
    assert len(views) == calls

    # Every text tool output is in the context of a later call exactly as logged, except
    # the ones only the (remote) compaction request read.
    seen = {
        m.tool_call_id: m.content
        for v in views
        for m in v.context
        if m.role == "tool" and not m.meta.get("synthesized")
    }
    for call_id, text in outputs.items():
        if call_id in only_compaction:
            continue
        assert seen.get(call_id) == text, call_id
    assert len(only_compaction) <= sum(1 for e in rollout.events if e.type == "rewrite")

    # Every generated call is in exactly one call, and no real output was synthesized.
    generated = [i["call_id"] for i in items if i["type"] in CALL_TYPES]
    in_calls = [c.id for v in views for c in v.message.tool_calls]
    assert sorted(in_calls) == sorted(generated)
    synthesized = [
        e.tool_call_id
        for e in rollout.events
        if isinstance(e, MessageEvent) and e.meta.get("synthesized")
    ]
    assert not set(synthesized) & set(outputs)
    final = {c.id for c in views[-1].message.tool_calls}
    assert set(synthesized) | (final - set(outputs)) == set(generated) - set(outputs)
    # Every assistant text is in a call (several message items of one response are one
    # call, joined by a blank line).
    texts = [
        part["text"]
        for i in items
        if i["type"] == "message" and i["role"] == "assistant"
        for part in i["content"]
    ]
    joined = "\n\n".join(v.message.content for v in views if v.message.content)
    assert joined == "\n\n".join(texts)

    # Each call is trained exactly once, and the segment count is exact.
    segs = Segmenter(renderer).segments(rollout)
    assert len(segs) == segments
    assert sorted(s.call_index for seg in segs for s in seg.spans) == list(range(calls))


def test_real_desktop_session_keeps_developer_messages_inside_calls():
    path = _real("localpush_rollout-2026-02-23T12-47-42")
    rollout = only("codex", path)
    assert rollout.meta["originator"] == "Codex Desktop"
    ids = [e.id for e in rollout.events]
    # Line 809 is a developer message between the call of lines 804-807 and its output.
    assert ids.index("L804") < ids.index("L809") < ids.index("L810")
    assert all("reported_input_tokens" in c.meta for c in rollout.calls())


def test_real_remote_compactions_are_opaque_and_custom_tools_pass_the_filter():
    path = _real("agentv_rollout-00-34f597b72d-1")
    rollout = only("codex", path)
    rewrites = [e for e in rollout.events if e.type == "rewrite"]
    assert [rw.meta["remote"] for rw in rewrites] == [True, True]
    for rw in rewrites:
        assert rw.context[-1].content == ENCRYPTED_SUMMARY
        assert rw.context[-1].meta["opaque"] == "encrypted_compaction"
    # Newer Codex writes token_count after the outputs of the response's calls.
    assert all("reported_input_tokens" in c.meta for c in rollout.calls())
    kinds = [k for c in rollout.calls() for k in (c.meta.get("tool_kinds") or {}).values()]
    assert kinds.count("custom") == 16
    assert rollout_filter(rollout, FilterOptions(off_task=False)) is None


def test_segments_after_a_web_search_say_a_tool_result_is_not_in_the_log(renderer):
    rollout = only("codex", fixture("codex", "web_search.jsonl"))
    segments = Segmenter(renderer).segments(rollout)
    tools = "missing_tool_schemas"
    assert segment_fidelity(rollout, segments) == [[tools, "opaque_tool_result"]] * len(segments)
    remote = only("codex", fixture("codex", "compacted_remote_twice.jsonl"))
    segments = Segmenter(renderer).segments(remote)
    assert segment_fidelity(remote, segments) == [[tools]] + [[tools, "opaque_summary"]] * (
        len(segments) - 1
    )


def test_every_codex_rollout_says_its_tool_schemas_are_not_in_the_log():
    rollout = only("codex", fixture("codex", "custom_tool.jsonl"))
    assert rollout.meta["fidelity"] == [
        {
            "reason": "missing_tool_schemas",
            "event_id": None,
            "detail": "Codex does not log the tools it sends",
        }
    ]
