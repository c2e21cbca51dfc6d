"""Precision first (issue 23, items 2 and 5): a rule check is on by default only where
its measured precision on the held-out real labels clears the bar; the others write
findings, never training targets."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from judge.measured import (
    BAR_FLAGS,
    BAR_PRECISION,
    MEASURED,
    UNMEASURED_ON_REAL,
    checks_report,
    default_checks,
    measured,
    opt_in_rule_correction,
    passes_bar,
)
from judge.rules import ALL_CHECKS, DEFAULT_CHECKS, OPT_IN_CHECKS, RULE_JUDGE
from pipeline.sft.attach import attach
from tests.judge.test_llm_summaries import renamed_settings
from tests.sft.test_attach import correction, story

ROOT = Path(__file__).resolve().parents[2]


def row(flags: int, tp: int) -> dict:
    return {"flags": flags, "tp": tp, "fp": flags - tp, "precision": tp / flags if flags else None}


@pytest.mark.parametrize(
    ("flags", "tp", "passes"),
    [(5, 4, True), (10, 8, True), (4, 4, False), (5, 3, False), (10, 7, False), (0, 0, False)],
)
def test_the_bar_is_precision_0_8_over_at_least_5_holdout_flags(flags, tp, passes):
    assert (BAR_PRECISION, BAR_FLAGS) == (0.8, 5)
    assert passes_bar(row(flags, tp)) is passes


def test_a_check_clearing_the_bar_on_holdout_is_on_and_tune_alone_is_not_enough():
    table = copy.deepcopy(measured())
    table["checks"]["state/omission"]["holdout"] = row(6, 5)
    table["checks"]["state/wrong_state"]["tune"] = row(9, 9)  # tuned on: does not count
    on = default_checks(ALL_CHECKS, table)
    assert "state/omission" in on and "state/wrong_state" not in on
    assert set(UNMEASURED_ON_REAL) <= set(on)  # harness logs cannot exercise them


def test_the_committed_table_decides_the_defaults_and_covers_every_check():
    table = json.loads(MEASURED.read_text())
    assert table["judge"] == RULE_JUDGE
    assert table["compactions"] == {"tune": 56, "holdout": 37}
    assert set(table["checks"]) == set(ALL_CHECKS)
    assert all(set(rows) == {"tune", "holdout"} for rows in table["checks"].values())
    assert default_checks(ALL_CHECKS, table) == DEFAULT_CHECKS
    for check in DEFAULT_CHECKS:
        assert check in UNMEASURED_ON_REAL or passes_bar(table["checks"][check]["holdout"])
    # Today: no state or continuation check clears the bar.
    assert DEFAULT_CHECKS == UNMEASURED_ON_REAL
    assert set(OPT_IN_CHECKS) == set(ALL_CHECKS) - set(UNMEASURED_ON_REAL)


def test_the_report_names_each_check_with_its_precision_and_says_no_state_check_is_on():
    lines = checks_report(ALL_CHECKS)
    omission = next(line for line in lines if " state/omission:" in line)
    assert omission.startswith("opt-in") and "holdout P " in omission and "tune P " in omission
    assert lines[0].startswith("on ") and "unmeasured on real data" in lines[0]
    assert lines[-1].startswith("no state check reaches precision >= 0.8 over >= 5 holdout flags")


def test_a_rule_correction_from_an_opt_in_check_is_quarantined_other_judges_are_not():
    rollout = story().build()
    from_rules = correction(rollout, 2, "state", judge_model=RULE_JUDGE)
    from_llm = correction(rollout, 2, "state", judge_model="qwen3-judge")
    attached, rejected = attach(rollout, [(from_rules, "f:1")])
    assert attached.corrections == []
    assert rejected[0].reason.startswith(
        "made by the rule judge's opt-in check state/omission (measured: holdout P "
    )
    attached, rejected = attach(rollout, [(from_llm, "f:2")])
    assert rejected == [] and attached.corrections == [from_llm]
    trigger = correction(rollout, 1, "trigger", verdict="too_late", judge_model=RULE_JUDGE)
    assert opt_in_rule_correction(RULE_JUDGE, "trigger", "too_late") is None  # on by default
    assert attach(rollout, [(trigger, "f:3")])[1] == []


def test_the_gateways_rule_judge_corrects_only_from_checks_on_by_default():
    from judge.loop_judge import RuleJudge

    rollout = renamed_settings()  # the second summary omits an uncommitted file (call 11)
    candidate = {"role": "assistant", "content": "Reading the settings."}
    outcome = RuleJudge()._review(rollout, 11, candidate)
    assert outcome.review is None  # state/omission is opt-in
    (omission,) = [f for f in outcome.findings if f["verdict"] == "omission"]
    assert omission["on_by_default"] is False
    # A judge told to correct from it does, and the correction keeps the check's evidence.
    review = RuleJudge(correcting=("state/omission",))._review(rollout, 11, candidate).review
    assert review is not None and (review.type, review.verdict) == ("state", "omission")
    assert review.evidence and all({"message_id", "quote"} == set(e) for e in review.evidence)
    assert "hooks_config.json" in review.replacement["content"]


def test_measure_checks_writes_the_table_per_split(tmp_path):
    from tests.judge.test_calibration import FIXTURE, SESSION, label

    labels = tmp_path / "labels.jsonl"
    labels.write_text(
        label("s1", session=SESSION, split="tune", omitted=["finding"]).model_dump_json()
        + "\n"
        + label("s2", session=SESSION, split="holdout").model_dump_json()
        + "\n"
    )
    out = tmp_path / "measured.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "measure_checks.py"), str(labels), str(FIXTURE)]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    table = json.loads(out.read_text())
    assert table["compactions"] == {"tune": 1, "holdout": 1}
    assert table["checks"]["state/omission"]["tune"]["fn"] == 1
    assert table["checks"]["state/omission"]["holdout"]["tn"] == 1
