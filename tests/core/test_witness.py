"""The second witness (pipeline/core/witness.py): hand-checked arithmetic, a hand-made Claude
Code session whose usage agrees with seam's context (stays exact), the same session with
a record the model saw and seam did not (flagged, counted, verified), and the property:
a record deleted from or injected into a session with consistent usage is always
flagged, an untouched one never."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.build.run import BuildConfig, BuildError, run_build
from pipeline.core import witness
from pipeline.core.fidelity import REASONS, segment_fidelity, segment_witnesses
from pipeline.core.segment import Segmenter
from pipeline.inspect.verify import verify_build
from pipeline.sources.canonical_io import rollout_to_json
from schemas.rollout import Rollout

FIXTURE = (
    Path(__file__).parents[1] / "fixtures" / "raw" / "claude_code" / "witness_consistent.jsonl"
)


# -- the arithmetic, by hand ---------------------------------------------------------------
def test_a_pair_is_flagged_only_beyond_the_allowance():
    # gpt: factor 1.0. Rebuilt grows 500, reported 500 + 1000: excess 1000 = SLACK, kept.
    [pair] = witness.pairs([100, 600], [5000, 6500], "gpt-5.4")
    assert (pair.rebuilt_growth, pair.reported_growth, pair.excess) == (500, 1500, 1000)
    assert pair.allowed == witness.SLACK and not pair.flagged
    assert witness.pairs([100, 600], [5000, 6501], "gpt-5.4")[0].flagged
    # a large growth is allowed REL of itself: 10000 * 0.35 = 3500
    assert not witness.pairs([0, 10000], [0, 13500], "gpt-5.4")[0].flagged
    assert witness.pairs([0, 10000], [0, 13501], "gpt-5.4")[0].flagged
    # and the reverse: seam's context grew by more than the harness's
    assert witness.pairs([0, 10000], [0, 6499], "gpt-5.4")[0].flagged


def test_the_factor_is_per_model_and_unknown_models_get_one():
    assert witness.factor("claude-opus-4-6") == 1.18
    assert witness.factor("claude-opus-4-5-20251101") == 1.12
    assert witness.factor("gpt-5.3-codex") == 1.0
    assert witness.factor(None) == witness.factor("llama") == witness.DEFAULT_FACTOR == 1.0
    assert witness.pairs([0, 10000], [0, 10000], "llama")[0].excess == 0
    # 10000 rebuilt tokens are 11800 harness tokens for claude-opus-4-6: no excess
    assert witness.pairs([0, 10000], [0, 11800], "claude-opus-4-6")[0].excess == 0


def test_calls_without_a_count_are_not_witnessed_and_gap_tokens_sum_the_flagged():
    seen = witness.witness([0, 10, 20, 30, 40], [100, None, 120, 5130, 5140], "gpt")
    # pairs (2,3) and (3,4) only: 3 has +5010 for +10 rebuilt
    assert (seen.witnessed, seen.flagged, seen.gap_tokens) == (2, 1, 5000)
    assert witness.witness([0, 10], [None, 5], "gpt").gap_tokens is None  # none witnessed
    assert witness.witness([0, 10], [5, 15], "gpt").gap_tokens == 0


def test_the_gap_reason_is_in_the_one_vocabulary():
    assert witness.GAP_REASON in REASONS


# -- a hand-made Claude Code session whose usage agrees with seam's growth ------------------
def _build(tmp_path: Path, src: Path, **options):
    out = tmp_path / "out"
    result = run_build(
        BuildConfig(
            inputs=[str(src)], out=str(out), kind="sft", progress=False, workers=1, **options
        )
    )
    rows = [r for s in result.shards for r in pq.read_table(out / s).to_pylist()]
    return result, rows, out


def _with_hidden_record(tmp_path: Path, tokens: int, from_call: str) -> Path:
    """The fixture as if the model had seen ``tokens`` more from ``from_call`` on (a
    record the reader does not render, e.g. an attachment): usage grows, seam does not."""
    lines, seen = [], False
    for text in FIXTURE.read_text().splitlines():
        rec = json.loads(text)
        message = rec.get("message") or {}
        seen = seen or message.get("id") == from_call
        if rec["type"] == "assistant" and seen:
            message["usage"]["cache_creation_input_tokens"] += tokens
        lines.append(json.dumps(rec))
    path = tmp_path / FIXTURE.name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_session_whose_usage_agrees_stays_exact(tmp_path):
    result, rows, out = _build(tmp_path, FIXTURE)
    [row] = rows
    assert row["reported_input_tokens"] == [18032, 18368, 20561, 20669, 21079]
    assert row["context_gap_tokens"] == 0
    assert row["context_fidelity"] == ["missing_system_prompt", "missing_tool_schemas"]
    assert result.counts[witness.WITNESSED_CALLS] == 4
    assert result.counts[witness.GAP_TOKENS] == 0
    assert "fidelity_unexplained_context_gap" not in result.counts
    assert verify_build(out, "all").ok


def test_a_record_the_model_saw_and_seam_did_not_is_flagged_counted_and_verified(tmp_path):
    src = _with_hidden_record(tmp_path, 2500, "msg_w3")
    result, rows, out = _build(tmp_path, src)
    [row] = rows
    assert witness.GAP_REASON in row["context_fidelity"]
    assert row["context_gap_tokens"] == 2500  # only the pair w2 → w3 departs
    assert result.counts["fidelity_unexplained_context_gap"] == 1
    assert result.counts[witness.GAP_TOKENS] == 2500
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["fidelity_unexplained_context_gap"] == 1
    card = (out / "README.md").read_text()
    assert "Second witness: 4 of 5 calls had the harness's reported input tokens" in card
    assert "1 segment(s) depart by more than the threshold (`unexplained_context_gap`, 2500" in card
    assert verify_build(out, "all").ok


def test_verify_fails_a_row_that_says_exact_where_the_witness_shows_a_gap(tmp_path):
    src = _with_hidden_record(tmp_path, 2500, "msg_w3")
    result, _, out = _build(tmp_path, src)
    shard = out / result.shards[0]
    table = pq.read_table(shard)
    at = table.schema.get_field_index("context_fidelity")
    table = table.set_column(
        at, table.schema.field(at), pa.array([["exact"]], pa.list_(pa.string()))
    )
    pq.write_table(table, shard)
    found = verify_build(out, "all")
    assert not found.ok
    assert any(
        "context_fidelity says exact, but the harness's reported input tokens depart "
        "from the rebuilt context by 2500 tokens" in m.what
        for m in found.mismatches
    )


def test_excluded_segments_are_counted_and_their_rollout_keeps_its_vote(tmp_path):
    gap = _with_hidden_record(tmp_path, 2500, "msg_w3")
    result, rows, out = _build(tmp_path, gap, exclude_fidelity=(witness.GAP_REASON,))
    assert rows == []
    assert result.counts["excluded_segments"] == 1
    assert result.counts["excluded_fidelity_unexplained_context_gap"] == 1
    assert result.counts["rollouts_without_segments"] == 1  # accepted, in its group
    assert result.counts["accepted"] == 1
    assert verify_build(out, "all").ok
    with pytest.raises(BuildError, match="unknown reason.*'no_such_reason'"):
        _build(tmp_path / "bad", FIXTURE, exclude_fidelity=("no_such_reason",))


def test_excluding_one_segment_keeps_the_rollouts_other_segments_and_its_advantage(tmp_path):
    from tests.core.test_fidelity import _build as build_rl
    from tests.core.test_fidelity import _with
    from tests.core.test_segments_hand_checked import three_call_rollout

    lost = {"reason": "lost_records", "event_id": "rw", "detail": "line 9 undecodable"}
    damaged = _with(three_call_rollout(rollout_id="bad", reward=1.0), {"fidelity": [lost]})
    other = three_call_rollout(rollout_id="good", reward=0.0)
    _, every, _ = build_rl(tmp_path / "all", [damaged, other], keep_damaged=True)
    result, kept, _ = build_rl(
        tmp_path / "ex", [damaged, other], keep_damaged=True, exclude_fidelity=("lost_records",)
    )
    assert [(r["rollout_id"], r["segment_index"]) for r in every] == [
        ("bad", 0),
        ("bad", 1),
        ("good", 0),
        ("good", 1),
    ]
    # bad's second segment (lost_records) is gone; its first is renumbered as the only one
    [bad] = [r for r in kept if r["rollout_id"] == "bad"]
    assert (bad["segment_index"], bad["num_segments"], bad["loss_weight_per_rollout"]) == (
        0,
        1,
        1.0,
    )
    assert bad["trainable_tokens_after"] == 0 and bad["input_ids"] == every[0]["input_ids"]
    # both rollouts still vote in their group: the advantages are those of the full build
    advantages = {r["rollout_id"]: r["advantage"] for r in every}
    assert {r["rollout_id"]: r["advantage"] for r in kept} == advantages
    assert advantages["bad"] > 0 > advantages["good"]
    assert result.counts["excluded_segments"] == 1
    assert result.counts["excluded_fidelity_lost_records"] == 1
    card = (tmp_path / "ex" / "out" / "README.md").read_text()
    assert "Left out by `--exclude-fidelity`: 1 segment(s) (`lost_records` 1)." in card
    assert verify_build(tmp_path / "ex" / "out", "all").ok


# -- the property ---------------------------------------------------------------------------
WORDS = ["parser", "token", "state", "line", "value", "return", "error", "lexer", "index"]


def _session(results: list[str], extra: dict[int, str], model: str) -> Rollout:
    """A session of ``len(results) + 1`` calls; ``extra[i]`` is a user record that came
    after tool result ``i``."""
    events: list[dict] = [
        {"type": "message", "id": "s", "role": "system", "content": "You fix bugs."},
        {"type": "message", "id": "u", "role": "user", "content": "Fix the parser."},
    ]
    for i, text in enumerate(results):
        events.append(
            {
                "type": "message",
                "id": f"a{i}",
                "role": "assistant",
                "content": f"Step {i}.",
                "tool_calls": [{"id": f"c{i}", "name": "run", "arguments": json.dumps({"n": i})}],
            }
        )
        events.append(
            {
                "type": "message",
                "id": f"t{i}",
                "role": "tool",
                "tool_call_id": f"c{i}",
                "content": text,
            }
        )
        if i in extra:
            events.append({"type": "message", "id": f"x{i}", "role": "user", "content": extra[i]})
    events.append(
        {"type": "message", "id": f"a{len(results)}", "role": "assistant", "content": "Done."}
    )
    return Rollout.model_validate(
        {"rollout_id": "r", "task_id": "t", "source": "hand", "model": model, "events": events}
    )


def _reported_by(truth: Rollout, segmenter: Segmenter, noise: list[int]) -> dict[str, int]:
    """What the harness would report for each call of ``truth`` (seam's rebuilt input
    scaled by the model's factor, plus what seam never sees), give or take ``noise``."""
    f = witness.factor(truth.model)
    calls = truth.calls()
    return {
        calls[s.call_index].id: 15000 + round(f * s.start) + noise[s.call_index % len(noise)]
        for seg in segmenter.segments(truth)
        for s in seg.spans
    }


def _seen_by_seam(rollout: Rollout, reported: dict[str, int]) -> Rollout:
    data = json.loads(rollout_to_json(rollout))
    for event in data["events"]:
        if event.get("id") in reported:
            event["meta"] = {"reported_input_tokens": reported[event["id"]]}
    return Rollout.model_validate(data)


def _gaps(renderer, rollout: Rollout) -> list[list[str]]:
    return segment_fidelity(rollout, Segmenter(renderer).segments(rollout))


texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=60).map(" ".join)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    results=st.lists(texts, min_size=2, max_size=5),
    where=st.integers(0, 3),
    size=st.integers(2000, 3000),
    model=st.sampled_from(["claude-opus-4-6", "claude-sonnet-5", "claude-opus-4-5", "gpt-5.4"]),
    noise=st.lists(st.integers(-400, 400), min_size=1, max_size=4),
    inject=st.booleans(),
)
def test_a_deleted_or_injected_record_is_always_flagged_an_untouched_one_never(
    renderer, results, where, size, model, noise, inject
):
    where = where % len(results)
    record = {where: " ".join(WORDS[k % len(WORDS)] for k in range(size))}  # >= size tokens
    segmenter = Segmenter(renderer)
    with_record, without = _session(results, record, model), _session(results, {}, model)
    # The truth is what the model saw; seam sees the other one (a record it lost, or one
    # it added that the model never saw).
    truth, seam_view = (without, with_record) if inject else (with_record, without)
    reported = _reported_by(truth, segmenter, noise)
    assert _gaps(renderer, _seen_by_seam(truth, reported)) == [["exact"]]
    flagged = _gaps(renderer, _seen_by_seam(seam_view, reported))
    assert flagged == [[witness.GAP_REASON]]
    [seen] = segment_witnesses(_seen_by_seam(seam_view, reported), segmenter.segments(seam_view))
    assert seen.flagged == 1 and seen.gap_tokens >= size * witness.factor(model) - 800


def test_the_calibration_tool_measures_the_fixture_factor_and_its_clean_pairs(capsys):
    from tools.witness_calibration import main

    main([str(FIXTURE)])
    out = capsys.readouterr().out
    # 4 witnessed pairs, all clean (only tool results between the calls), measured at the
    # factor the fixture was written with (1.12), none flagged
    line = next(x for x in out.splitlines() if "claude-opus-4-5-20251101" in x)
    assert line.split()[2:5] == ["4", "1.120", "1.12"]
    assert "0/4" in line
    main([str(FIXTURE), "--per-file"])
    assert f"{FIXTURE.name} | 1 | 1 | 4/5 | 0 (0) |" in capsys.readouterr().out
