"""context_fidelity and reported_input_tokens: hand-checked rollouts through a real build."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from pipeline.build.run import BuildConfig, run_build
from pipeline.core.fidelity import segment_fidelity
from pipeline.core.segment import Segmenter
from pipeline.sources.canonical_io import rollout_to_json
from tests.core.test_segments_hand_checked import three_call_rollout


def _with(rollout, meta=None, **message_meta):
    """A copy with rollout meta and per-message meta (by message id) set."""
    data = json.loads(rollout_to_json(rollout))
    data["meta"] = {**data.get("meta", {}), **(meta or {})}
    for event in data["events"]:
        items = event.get("context", []) if event["type"] == "rewrite" else [event]
        for item in items:
            if item.get("id") in message_meta:
                item["meta"] = message_meta[item["id"]]
    return type(rollout).model_validate(data)


def _fidelity(renderer, rollout):
    return segment_fidelity(rollout, Segmenter(renderer).segments(rollout))


def test_a_rollout_without_entries_is_exact_in_every_segment(renderer):
    assert _fidelity(renderer, three_call_rollout()) == [["exact"], ["exact"]]


def test_an_entry_applies_from_its_event_on_and_a_null_event_to_every_segment(renderer):
    late = {"reason": "lost_records", "event_id": "rw", "detail": "line 9 undecodable"}
    whole = {"reason": "slice_start", "event_id": None, "detail": "first parent missing"}
    rollout = _with(three_call_rollout(), {"fidelity": [late]})
    assert _fidelity(renderer, rollout) == [["exact"], ["lost_records"]]
    rollout = _with(three_call_rollout(), {"fidelity": [late, whole]})
    assert _fidelity(renderer, rollout) == [["slice_start"], ["lost_records", "slice_start"]]


def test_an_opaque_item_flags_the_segments_whose_context_holds_it(renderer):
    rollout = _with(three_call_rollout(), res={"opaque": "encrypted remote compaction"})
    assert _fidelity(renderer, rollout) == [["exact"], ["opaque_summary"]]


def test_a_synthesized_call_flags_the_segment_that_holds_it_without_any_entry(renderer):
    """A call seam wrote (``meta.synthesized_call``) gives its reason to the segment whose
    spans hold it, even when the rollout's meta names no fidelity entry."""
    rollout = _with(three_call_rollout(), a3={"synthesized_call": "synthesized_summary_call"})
    assert _fidelity(renderer, rollout) == [["exact"], ["synthesized_summary_call"]]


def test_redacted_reasoning_flags_the_segments_that_train_or_see_the_call(renderer):
    """Segments [a1, a2] and [a3] (a compaction between): a call without its reasoning
    text flags the segment that trains it, and the segments whose context holds it."""
    redacted = {"redacted_reasoning": 1}
    assert _fidelity(renderer, _with(three_call_rollout(), a2=redacted)) == [
        ["redacted_reasoning"],
        ["exact"],
    ]
    # a1 is context of a2 (the segment's last call); the compaction drops it for a3.
    assert _fidelity(renderer, _with(three_call_rollout(), a1=redacted)) == [
        ["redacted_reasoning"],
        ["exact"],
    ]
    assert _fidelity(renderer, _with(three_call_rollout(), a3=redacted)) == [
        ["exact"],
        ["redacted_reasoning"],
    ]


def test_a_redacted_call_a_rewrite_put_into_the_context_flags_the_segments_that_see_it(renderer):
    """Codex's replacement history can hold an earlier response whose reasoning has no
    text: the segments whose context holds it say so, though no call of theirs does."""
    data = json.loads(rollout_to_json(three_call_rollout()))
    rewrite = next(e for e in data["events"] if e["type"] == "rewrite")
    rewrite["context"].insert(
        1,
        {
            "type": "message",
            "id": "old",
            "role": "assistant",
            "content": "Read a.py: x=1.",
            "meta": {"redacted_reasoning": 1},
        },
    )
    rollout = type(three_call_rollout()).model_validate(data)
    assert _fidelity(renderer, rollout) == [["exact"], ["redacted_reasoning"]]


def _build(tmp_path, rollouts, **options):
    tmp_path.mkdir(exist_ok=True)
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(rollout_to_json(r) for r in rollouts) + b"\n")
    out = tmp_path / "out"
    result = run_build(
        BuildConfig(inputs=[str(src)], out=str(out), progress=False, workers=1, **options)
    )
    rows = pq.read_table(out / result.shards[0]).to_pylist() if result.shards else []
    quarantine = [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]
    return result, rows, quarantine


def test_damaged_rollouts_are_quarantined_unless_kept_and_then_flagged(tmp_path):
    lost = {"reason": "lost_records", "event_id": "a3", "detail": "line 7: invalid JSON"}
    good = three_call_rollout(rollout_id="good")
    damaged = _with(three_call_rollout(rollout_id="bad"), {"fidelity": [lost]})
    result, rows, quarantine = _build(tmp_path, [good, damaged])
    assert {r["rollout_id"] for r in rows} == {"good"}
    assert [q["reason"] for q in quarantine] == [
        "rollout bad: damaged log (lost_records: line 7: invalid JSON); "
        "--keep-damaged keeps it, flagged"
    ]
    assert result.counts["fidelity_exact"] == 2
    result, rows, quarantine = _build(tmp_path / "kept", [good, damaged], keep_damaged=True)
    flags = {(r["rollout_id"], r["segment_index"]): r["context_fidelity"] for r in rows}
    assert flags == {
        ("good", 0): ["exact"],
        ("good", 1): ["exact"],
        ("bad", 0): ["exact"],
        ("bad", 1): ["lost_records"],
    }
    assert quarantine == []
    assert result.counts["fidelity_lost_records"] == 1 and result.counts["fidelity_exact"] == 3


def test_reported_input_tokens_are_aligned_with_the_call_spans(tmp_path):
    rollout = _with(
        three_call_rollout(), a1={"reported_input_tokens": 1234}, a3={"reported_input_tokens": 99}
    )
    _, rows, _ = _build(tmp_path, [rollout])
    assert [r["reported_input_tokens"] for r in rows] == [[1234, None], [99]]
    assert [len(r["call_spans"]) for r in rows] == [2, 1]
