"""build-sft end to end: the lead's build with the SFT stage, on hand-written rollouts."""

from __future__ import annotations

import json

import datasets
import pyarrow.parquet as pq
import pytest

from judge.rules import RULE_JUDGE
from pipeline.build.run import BuildConfig, run_build
from pipeline.core.render import template_message
from pipeline.sft.filters import FilterOptions
from pipeline.sft.stage import SftStage
from schemas.correction import Correction, executed_output_text
from tests.judge.rollouts import Story

SUMMARY = (
    "# Auto Context Summary\nsrc/dates.py indexes s['tz']; `pytest tests/test_dates.py` fails with KeyError "
    "in test_parse_iso.\n## Next step\nFix `parse_date` in src/dates.py."
)
PROPOSED_SUMMARY = (
    "# Auto Context Summary\nWorking on dates. PROPOSED-ONLY\n## Next step\nContinue."
)
PROPOSED_ACTION = (
    '<tool_call>\n{"name": "grep", "arguments": {"pattern": "PROPOSED-ONLY"}}\n</tool_call>'
)
FAIL = "FAILED tests/test_dates.py::test_parse_iso - KeyError: 'tz'\n1 failed"


def corrected() -> Story:
    """calls: 0 read, 1 test, 2 summary (corrected: state), 3 edit (corrected: continuation), 4 test, 5 submit."""
    return (
        Story("good")
        .act(("read_file", {"path": "src/dates.py"}, "def parse_date(s): return s['tz']"))
        .act(("bash", {"command": "pytest tests/test_dates.py"}, FAIL))
        .compact(SUMMARY)
        .act(
            (
                "edit_file",
                {"path": "src/dates.py", "old": "s['tz']", "new": "s.get('tz')"},
                "edited",
            )
        )
        .act(("bash", {"command": "pytest tests/test_dates.py"}, "4 passed"))
        .act(("submit", {}, "submitted"))
    )


def looping() -> Story:
    story = Story("loop").act(("read_file", {"path": "src/dates.py"}, "x")).compact(SUMMARY)
    return story.compact(SUMMARY)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft")
    good = corrected().build(reward=1.0, resolved=True)
    calls = good.calls()
    embedded = [
        Correction(
            rollout_id="good",
            call_index=2,
            type="state",
            verdict="omission",
            original=PROPOSED_SUMMARY,
            replacement=executed_output_text(calls[2]),
            rationale="dropped the failing test",
        )
    ]
    good = good.model_copy(update={"corrections": embedded})
    (tmp / "in.jsonl").write_text(
        "\n".join(
            r.model_dump_json(exclude_none=True)
            for r in (good, looping().build(reward=0.0, resolved=False))
        )
        + "\n"
    )
    in_file = [
        Correction(
            rollout_id="good",
            call_index=3,
            type="continuation",
            verdict="redo",
            original=PROPOSED_ACTION,
            replacement=executed_output_text(calls[3]),
        ),
        Correction(
            rollout_id="good",
            call_index=4,
            type="state",
            verdict="omission",
            original="x",
            replacement=executed_output_text(calls[4]),
        ),
        Correction(  # seam's rule judge, from a check below the precision bar
            rollout_id="good",
            call_index=2,
            type="state",
            verdict="missing_next_step",
            original=PROPOSED_SUMMARY,
            replacement=executed_output_text(calls[2]),
            judge_model=RULE_JUDGE,
        ),
        Correction(
            rollout_id="ghost",
            call_index=0,
            type="state",
            verdict="omission",
            original="x",
            replacement="y",
        ),
    ]
    (tmp / "corrections.jsonl").write_text("\n".join(c.model_dump_json() for c in in_file) + "\n")
    config = BuildConfig(
        inputs=[str(tmp / "in.jsonl")],
        out=str(tmp / "out"),
        kind="sft",
        workers=1,
        progress=False,
        stage=SftStage(str(tmp / "corrections.jsonl"), FilterOptions()),
    )
    return run_build(config), good


def test_corrected_calls_are_trained_and_decode_to_the_executed_output(built, renderer):
    result, rollout = built
    rows = pq.read_table(result.out / result.shards[0]).to_pylist()
    calls = rollout.calls()
    trained = {}
    for row in rows:
        for span in row["call_spans"]:
            ids = row["input_ids"][span["start"] : span["start"] + span["length"]]
            assert all(row["loss_mask"][span["start"] : span["start"] + span["length"]])
            expected, _ = renderer.output_text(template_message(calls[span["call_index"]]), None)
            assert renderer.decode(ids) == expected
            trained[span["call_index"]] = row["corrections"]
    assert {c["call_index"] for cs in trained.values() for c in cs} == {2, 3}


def test_original_proposals_are_never_in_a_training_sequence(built, renderer):
    result, _ = built
    for row in pq.read_table(result.out / result.shards[0]).to_pylist():
        assert "PROPOSED-ONLY" not in renderer.decode(row["input_ids"])
        assert "PROPOSED-ONLY" not in row["messages"]


def test_sft_columns_carry_messages_corrections_and_the_summary_audit(built):
    result, _ = built
    ds = datasets.load_dataset(
        str(result.out), split="train", cache_dir=str(result.out.parent / "hf")
    )
    first = ds[0]
    messages = json.loads(first["messages"])
    assert messages[-1]["role"] == "assistant" and messages[-1]["train"] is True
    assert [c["type"] for c in first["corrections"]] == ["state"]
    assert (
        first["summary_audit"][0]["call_index"] == 2
        and first["summary_audit"][0]["has_next_step"] is True
    )


def test_pairs_hold_context_chosen_executed_and_rejected_original(built):
    result, rollout = built
    pairs = datasets.load_dataset(
        str(result.out / "pairs"), split="train", cache_dir=str(result.out.parent / "hf")
    )
    assert pairs["call_index"] == [2, 3]
    state = pairs[0]
    assert state["chosen"] == [
        {"role": "assistant", "content": executed_output_text(rollout.calls()[2])}
    ]
    assert state["rejected"] == [{"role": "assistant", "content": PROPOSED_SUMMARY}]
    assert state["prompt"][-1]["content"].startswith(
        "Context is nearly full"
    )  # q_sum: what the policy saw last


def test_unfit_corrections_and_filtered_rollouts_are_quarantined_and_counted(built):
    result, _ = built
    entries = [
        json.loads(line) for line in (result.out / "quarantine.jsonl").read_text().splitlines()
    ]
    reasons = sorted(e["reason"] for e in entries)
    opt_in = reasons.pop(1)
    assert opt_in.startswith(
        "made by the rule judge's opt-in check state/missing_next_step (measured: holdout "
    )
    assert reasons == [
        "filtered (summary_loop): compaction at s9 follows s5 with no action between",
        "names rollout 'ghost', which is not among the accepted input rollouts",
        "type 'state' needs a summary call; call 4 is an action call",
    ]
    counts = result.counts
    assert (counts["read"], counts["accepted"], counts["quarantined"]) == (2, 1, 1)
    assert (
        counts["corrections_attached"],
        counts["corrections_quarantined"],
        counts["preference_pairs"],
    ) == (2, 3, 2)
    assert counts["corrections_quarantined_opt_in_check"] == 1
    assert counts["filtered_summary_loop"] == 1


def test_the_summary_says_which_rule_checks_may_correct_and_their_precision(capsys):
    from pipeline.cli.build_sft import print_sft_counts

    print_sft_counts({"corrections_attached": 2, "corrections_quarantined_opt_in_check": 1})
    out = capsys.readouterr().out
    assert "rule judge corrections are kept only from checks on by default" in out
    assert "opt-in state/omission: holdout P " in out
    assert "no rule-based state correction is written by default" in out
    assert "corrections quarantined opt in check" in out
