"""Summary audit: per-summary measures and AutoCompact's aggregate rates, and the
``seam judge`` / ``seam audit`` commands on files."""

from __future__ import annotations

import json

from judge.audit import aggregate, audit_rollout
from pipeline.cli import main
from tests.judge.rollouts import Story
from tests.judge.test_rules import GOOD_SUMMARY, TEST_CMD, explored

NO_NEXT = GOOD_SUMMARY.split("## Next step")[0]
OMITS_TEST = GOOD_SUMMARY.replace(
    "still fails: test_parse_iso raises KeyError", "still fails with KeyError"
)
CONTRADICTS = NO_NEXT + "## Next step\nNothing left: submit.\n"


def audited(summary: str) -> dict:
    (audit,) = audit_rollout(explored().compact(summary).build())
    return audit.as_struct()


def test_a_complete_summary_has_no_omission_and_a_concrete_next_step():
    audit = audited(GOOD_SUMMARY)
    assert audit["key_items"] == 5 and audit["omitted"] == [] and audit["has_next_step"] is True
    assert audit["words"] == len(GOOD_SUMMARY.split()) and audit["chars"] == len(GOOD_SUMMARY)


def test_each_known_defect_is_measured():
    assert audited(OMITS_TEST)["omitted"] == [{"kind": "test_name", "value": "test_parse_iso"}]
    assert audited(NO_NEXT)["has_next_step"] is False
    assert audited(CONTRADICTS)["contradictions"] == [
        "the state says a problem remains but the next step says to finish"
    ]


def test_aggregate_rates_are_shares_of_summaries():
    audits = [audited(s) for s in (GOOD_SUMMARY, OMITS_TEST, NO_NEXT, CONTRADICTS)]
    agg = aggregate(audits)
    assert agg["summaries"] == 4
    assert agg["key_state_omission_rate"] == 0.25
    assert agg["key_item_omission_rate"] == 0.05  # 1 of 4 × 5 key items
    assert agg["next_step_omission_rate"] == 0.25  # "submit" is a concrete (if contradictory) step
    assert agg["self_consistency_violation_rate"] == 0.25
    assert agg["omitted_by_kind"] == {"test_name": 1}
    assert agg["history_incomplete"] == 0
    sliced = [{**audits[0], "history_complete": False}, *audits[1:]]
    assert aggregate(sliced)["history_incomplete"] == 1


def test_a_summary_inserted_by_a_rewrite_is_audited_too():
    story = explored()
    story.compact(NO_NEXT)
    story.events = [
        e for e in story.events if getattr(e, "kind", None) != "summary"
    ]  # the harness wrote it
    (audit,) = audit_rollout(story.build())
    assert audit.call_index is None and audit.has_next_step is False


def test_seam_judge_and_seam_audit_run_on_rollout_files(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    rollouts = [explored().compact(s) for s in (GOOD_SUMMARY, NO_NEXT)]
    for n, story in enumerate(rollouts):  # two ids: a repeated id is quarantined, as in a build
        story.rollout_id = f"r{n}"
    path.write_text("\n".join(Story.build(r).model_dump_json() for r in rollouts) + "\n")
    out = tmp_path / "findings.jsonl"
    # The state checks are opt-in (below the precision bar on real labels, judge/measured.py).
    assert main(["judge", str(path), "--out", str(out)]) == 0
    assert out.read_text() == ""
    assert main(["judge", str(path), "--out", str(out), "--checks", "all"]) == 0
    findings = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(f["type"], f["verdict"]) for f in findings} == {("state", "missing_next_step")}
    capsys.readouterr()
    assert main(["audit", str(path), "--json"]) == 0
    agg = json.loads(capsys.readouterr().out)
    assert (agg["summaries"], agg["next_step_omission_rate"]) == (2, 0.5)


TRACEBACK = (
    "tests/test_dates.py F\n____ test_parse_iso ____\n    def parse_date(s):\n>       return FORMATS[s['tz']]\n"
    "E       KeyError: 'tz'\n\nsrc/dates.py:2: KeyError\n"
    "FAILED tests/test_dates.py::test_parse_iso - KeyError: 'tz'\n1 failed in 0.1s"
)


def test_a_full_suite_run_failing_on_the_recorded_test_needs_no_quote_of_its_own():
    story = (
        explored()
        .act(("bash", {"command": "python -m pytest -q"}, TRACEBACK))
        .compact(GOOD_SUMMARY)
    )
    (audit,) = audit_rollout(story.build())
    assert audit.omitted == []


def test_a_file_the_failure_points_at_and_the_agent_opened_is_key_state():
    story = (
        Story()
        .act(("read_file", {"path": "src/dates.py"}, "def parse_date(s): ..."))
        .act(("bash", {"command": "pytest tests/test_dates.py"}, TRACEBACK))
        .compact(
            "# Auto Context Summary\n`pytest tests/test_dates.py` fails: test_parse_iso, KeyError.\n"
            "## Next step\nFind where `parse_date` indexes the dict."
        )
    )
    (audit,) = audit_rollout(story.build())
    assert audit.omitted == [{"kind": "file_path", "value": "src/dates.py"}]


def test_a_heading_or_a_denial_is_not_an_open_problem():
    summary = (
        GOOD_SUMMARY.split("## Workspace")[0]
        + "## Unresolved errors\n- None: the last test run passed.\n"
        "## Next step\nSubmit the `parse_date` fix.\n"
    )
    story = explored().act(("bash", {"command": TEST_CMD}, "4 passed")).compact(summary)
    (audit,) = audit_rollout(story.build())
    assert audit.contradictions == []
