"""Real Claude Code files (SEAM_REALWORLD_DIR), asserted from their raw records: every
tool output is in the context of the next call (unless a compaction comes first), every generated piece (API response)
is trained exactly once, the segment count is exact, and snapshots of one session make
one rollout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.core.mask import MaskOptions, mask_segment
from pipeline.core.segment import Segmenter
from pipeline.readers import REGISTRY, Accepted, Rejected
from schemas.replay import replay

REAL = Path(os.environ.get("SEAM_REALWORLD_DIR", "/nonexistent")) / "claude_code"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason="SEAM_REALWORLD_DIR not set")

# file → (conversations, segments per conversation in file order, seam kinds after none)
FILES = {
    "real-entireio-cli_cd-95adddad32_0_full.jsonl": [["compaction"] * 3],
    "real-entireio-cli_44-785715c3f5_2_full.jsonl": [["compaction"] * 2],
    "entireio-cli_a6-e4c2a0fbd1_0_full.jsonl": [["compaction"]],
    "real-entireio-cli_d5-99f72ee73a_0_full.jsonl": [["edit"]],  # a microcompaction
    "agentic-primer_agent-a0294d5.jsonl": [[]],
    "agentic-primer_agent-a7c3dfb.jsonl": [[]],
}


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _responses(records: list[dict], sidechain: bool) -> set[str]:
    """API responses the model generated: distinct message ids of assistant records
    (Claude Code writes one record per content block), minus its own error records."""
    return {
        r["message"]["id"]
        for r in records
        if r.get("type") == "assistant"
        and bool(r.get("isSidechain")) == sidechain
        and not r.get("isApiErrorMessage")
        and r["message"].get("model") != "<synthetic>"
    }


def _answered(records: list[dict]) -> set[str]:
    """tool_use ids with a tool_result in the file (whose tool_use is in the file too)."""
    uses, results = set(), set()
    for r in records:
        content = (r.get("message") or {}).get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                uses.add(block["id"])
            if isinstance(block, dict) and block.get("type") == "tool_result":
                results.add(block["tool_use_id"])
    return uses & results


@pytest.mark.parametrize("name", sorted(FILES))
def test_real_session_calls_results_and_segments_match_the_raw_records(name, renderer):
    path = REAL / name
    records = _raw(path)
    items = list(REGISTRY["claude-code"].read(path))
    assert [i.reason for i in items if isinstance(i, Rejected)] == []
    rollouts = [i.rollout for i in items if isinstance(i, Accepted)]
    assert len(rollouts) == len(FILES[name])
    segmenter = Segmenter(renderer)
    for rollout, seams in zip(rollouts, FILES[name]):
        sidechain = rollout.parent_rollout_id is not None
        calls = rollout.calls()
        # every generated piece is one call ...
        assert {c.id for c in calls} == _responses(records, sidechain)
        segments = segmenter.segments(rollout)
        assert [s.seam_kind for s in segments] == ["none", *seams]
        # ... trained exactly once: its span appears in one segment, under the mask.
        spans = [(s.call_index, seg, s) for seg in segments for s in seg.spans]
        assert sorted(i for i, _, _ in spans) == list(range(len(calls)))
        trained = 0
        for seg in segments:
            masked = mask_segment(seg, MaskOptions(), renderer.eos_id, [False] * len(seg.spans))
            assert masked.loss_mask.sum() == sum(s.length for s in seg.spans)
            for s in seg.spans:
                assert masked.loss_mask[s.start : s.start + s.length].all()
            trained += int(masked.loss_mask.sum())
        assert trained == sum(s.length for _, _, s in spans)
        # every tool output recorded in the file is in the context of the next call
        views = replay(rollout)
        position = {e.id: i for i, e in enumerate(rollout.events)}
        call_pos = [position[v.message.id] for v in views]
        results = [
            e for e in rollout.events if e.type == "message" and e.role == "tool" and e.tool_call_id
        ]
        real = [e for e in results if "synthesized" not in e.meta]
        answered = _answered([r for r in records if bool(r.get("isSidechain")) == sidechain])
        assert {e.tool_call_id for e in real} == answered
        rewrites = [i for i, e in enumerate(rollout.events) if e.type == "rewrite"]
        for result in real:
            at = position[result.id]
            later = [(v, p) for v, p in zip(views, call_pos) if p > at]
            if not later:
                continue
            view, p = later[0]
            if any(at < w < p for w in rewrites):
                continue  # compacted before the next call: the summary call read it
            seen = {m.tool_call_id for m in view.context if m.role == "tool"}
            assert result.tool_call_id in seen, result.id


def test_microcompaction_is_a_context_edit_not_a_compaction():
    (item,) = [
        i
        for i in REGISTRY["claude-code"].read(REAL / "real-entireio-cli_d5-99f72ee73a_0_full.jsonl")
        if isinstance(i, Accepted)
    ]
    reasons = [e.reason for e in item.rollout.events if e.type == "rewrite"]
    assert reasons == ["edit"]
    cleared = [
        m
        for e in item.rollout.events
        if e.type == "rewrite"
        for m in e.context
        if m.type == "message"
    ]
    assert len(cleared) == 11  # the boundary's compactedToolIds


def test_slices_are_flagged_and_usage_is_reported_per_call():
    """The a6 file starts mid-session; its first call reports 152,294 input tokens
    (input + cache writes + cache reads, from the raw usage)."""
    path = REAL / "entireio-cli_a6-e4c2a0fbd1_0_full.jsonl"
    (item,) = [i for i in REGISTRY["claude-code"].read(path) if isinstance(i, Accepted)]
    assert "slice_start" in {f["reason"] for f in item.rollout.meta["fidelity"]}
    first = item.rollout.calls()[0]
    usage = next(
        r["message"]["usage"]
        for r in _raw(path)
        if r.get("type") == "assistant" and r["message"]["id"] == first.id
    )
    expected = (
        usage["input_tokens"]
        + usage["cache_creation_input_tokens"]
        + usage["cache_read_input_tokens"]
    )
    assert first.meta["reported_input_tokens"] == expected == 152294
    whole = REAL / "real-entireio-cli_cd-95adddad32_0_full.jsonl"
    (item,) = [i for i in REGISTRY["claude-code"].read(whole) if isinstance(i, Accepted)]
    assert "slice_start" not in {f["reason"] for f in item.rollout.meta["fidelity"]}


def test_snapshots_of_a_real_session_are_one_rollout_with_every_call_once(tmp_path):
    """Three overlapping snapshot files of the three-compaction session (first 60%, the
    whole file, the last half), given in any order: one rollout, 225 calls, 4 segments."""
    lines = (REAL / "real-entireio-cli_cd-95adddad32_0_full.jsonl").read_text().splitlines(True)
    n = len(lines)
    parts = {"late": lines[n // 2 :], "early": lines[: n * 6 // 10], "whole": lines}
    paths = []
    for name, part in parts.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "full.jsonl").write_text("".join(part))
        paths.append(tmp_path / name / "full.jsonl")
    items = list(REGISTRY["claude-code"].read_files(paths))
    (rollout,) = [i.rollout for i in items if isinstance(i, Accepted)]
    (whole,) = [
        i.rollout
        for i in REGISTRY["claude-code"].read(REAL / "real-entireio-cli_cd-95adddad32_0_full.jsonl")
        if isinstance(i, Accepted)
    ]
    assert [c.id for c in rollout.calls()] == [c.id for c in whole.calls()]
    assert len(rollout.calls()) == 225
    # Event for event the whole file's; a boundary names the snapshot file it was read from.
    for event in rollout.events:
        if event.type == "rewrite" and "boundary_file" in event.meta:
            assert Path(event.meta.pop("boundary_file")).parent.name in parts
    assert rollout.model_dump() == whole.model_dump()
