"""Which rule checks are on by default: the ones whose measured precision clears the bar.

``judge/labels/measured.json`` holds each check's scores on the two parts of the
labelled real compactions (``judge/labels/real_compactions.jsonl``, docs/labels.md):
``tune`` (the rules were adjusted on it) and ``holdout`` (never looked at while
adjusting them). ``tools/measure_checks.py`` writes it from ``seam judge --eval``'s
scoring (docs/sft.md, "Calibration" says how to regenerate it).

The bar (issue 23): a check is on by default only where its precision on the holdout
part is at least ``BAR_PRECISION`` with at least ``BAR_FLAGS`` flags, precision =
TP / (TP + FP). The trigger checks are the exception: they ask whether the *policy*
chose the right moment to compact, which a harness log (Claude Code, Codex: the harness
compacts at its budget, the user with ``/compact``) never records, so they cannot fire
on real sessions and are unmeasured there; they stay on, with the behaviour measured
on simulated data (docs/sft.md). Every other check is opt-in (``--checks``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

MEASURED = Path(__file__).parent / "labels" / "measured.json"
BAR_PRECISION = 0.8
BAR_FLAGS = 5
BAR_SPLIT = "holdout"
# Checks of the policy's own decision to compact: never asked of harness logs.
UNMEASURED_ON_REAL = ("trigger/missing_trigger", "trigger/too_late", "trigger/too_early")


@cache
def measured() -> dict:
    """The committed measurements (``{"checks": {check: {"tune": row, "holdout": row}}}``,
    a row as ``Score.as_dict``)."""
    return json.loads(MEASURED.read_text())


def passes_bar(row: dict | None) -> bool:
    """A holdout row clears the bar: precision >= 0.8 over at least 5 flags."""
    if not row:
        return False
    precision = row.get("precision")
    return row.get("flags", 0) >= BAR_FLAGS and precision is not None and precision >= BAR_PRECISION


def default_checks(all_checks: tuple[str, ...], table: dict | None = None) -> tuple[str, ...]:
    """The checks on by default, in ``all_checks`` order: the unmeasured trigger checks and
    every check whose holdout row clears the bar."""
    rows = (table or measured())["checks"]
    return tuple(
        c
        for c in all_checks
        if c in UNMEASURED_ON_REAL or passes_bar(rows.get(c, {}).get(BAR_SPLIT))
    )


def describe(check: str) -> str:
    """One line on a check's measured precision: "holdout P 0.17 (1/6), tune P 0.10 (2/20)",
    "unmeasured on real data (harness logs)", or "not measured"."""
    if check in UNMEASURED_ON_REAL:
        return "unmeasured on real data (the harness decides when to compact)"
    row = measured()["checks"].get(check)
    if not row:
        return "not measured"
    return ", ".join(f"{split} {_precision(row[split])}" for split in ("holdout", "tune"))


def checks_report(ran: tuple[str, ...]) -> list[str]:
    """What a summary prints about the rule checks: each check that ran with its measured
    precision, and plainly whether any state check cleared the bar."""
    from judge.rules import ALL_CHECKS, DEFAULT_CHECKS

    lines = [f"{'on ' if c in DEFAULT_CHECKS else 'opt-in'} {c}: {describe(c)}" for c in ran]
    state_on = [c for c in DEFAULT_CHECKS if c.startswith("state/")]
    if not state_on:
        best = max(
            (c for c in ALL_CHECKS if c.startswith("state/")),
            key=lambda c: measured()["checks"][c][BAR_SPLIT]["tp"],
        )
        lines.append(
            f"no state check reaches precision >= {BAR_PRECISION} over >= {BAR_FLAGS} "
            f"{BAR_SPLIT} flags (best: {best}, {describe(best)}): no rule-based state "
            "correction is written by default"
        )
    return lines


RULE_JUDGE_PREFIX = "seam-rules/"  # judge_model of every version of seam's rule judge
OPT_IN_REASON = "made by the rule judge's opt-in check"


def opt_in_rule_correction(judge_model: str, type_: str, verdict: str) -> str | None:
    """Why a correction that seam's rule judge made (``judge_model`` ``seam-rules/N``) is
    not a training target — its check is opt-in, below the bar — or None (another judge,
    or a check on by default). The build quarantines such a correction with this reason."""
    from judge.rules import DEFAULT_CHECKS

    check = f"{type_}/{verdict}"
    if not judge_model.startswith(RULE_JUDGE_PREFIX) or check in DEFAULT_CHECKS:
        return None
    return (
        f"{OPT_IN_REASON} {check} (measured: {describe(check)}; the bar is "
        f"precision >= {BAR_PRECISION} over >= {BAR_FLAGS} {BAR_SPLIT} flags): a finding, "
        "not a training target"
    )


def _precision(row: dict) -> str:
    if not row["flags"]:
        return "no flags"
    return f"P {row['precision']:.2f} ({row['tp']}/{row['flags']})"
