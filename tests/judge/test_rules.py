"""The rule judge: for each rule, a hand-written rollout where it must fire and a near
miss where it must not."""

from __future__ import annotations

from judge.rules import ALL_CHECKS, DEFAULT_CHECKS, judge_rollout
from tests.judge.rollouts import Story

FAIL_OUT = "FAILED tests/test_dates.py::test_parse_iso - KeyError: 'tz'\n1 failed, 3 passed in 0.2s"
PASS_OUT = "tests/test_dates.py::test_parse_iso PASSED\n4 passed in 0.2s"
SRC = "def parse_date(s):\n    return FORMATS[s['tz']]\n"
TEST_CMD = "cd /repo && python -m pytest tests/test_dates.py -q"

GOOD_SUMMARY = """# Auto Context Summary
## Established
- `parse_date` in src/dates.py indexes FORMATS with s['tz'], which raises KeyError when tz is absent.
## Workspace
- Edited src/dates.py to use s.get('tz').
- `pytest tests/test_dates.py` still fails: test_parse_iso raises KeyError.
## Next step
Read src/formats.py to see which keys FORMATS defines, then fix `parse_date` and rerun tests/test_dates.py.
"""


def verdicts(story: Story) -> set[tuple[int, str, str]]:
    """Every check's findings (the rules are tested one by one; defaults are calibrated)."""
    return {(f.call_index, f.type, f.verdict) for f in judge_rollout(story.build(), ALL_CHECKS)}


def explored() -> Story:
    """grep, read, edit, failing test: a typical first window."""
    return (
        Story()
        .act(
            (
                "grep",
                {"pattern": "def parse_date", "path": "src"},
                "src/dates.py:1:def parse_date(s):",
            )
        )
        .act(("read_file", {"path": "src/dates.py"}, SRC))
        .act(
            (
                "edit_file",
                {"path": "src/dates.py", "old": "s['tz']", "new": "s.get('tz')"},
                "edited",
            )
        )
        .act(("bash", {"command": TEST_CMD}, FAIL_OUT))
    )


# (a) missed trigger ----------------------------------------------------------------------
def investigating() -> Story:
    """grep, read, failing test, and the same grep again: nothing was written in between."""
    return (
        Story()
        .act(
            (
                "grep",
                {"pattern": "def parse_date", "path": "src"},
                "src/dates.py:1:def parse_date(s):",
            )
        )
        .act(("read_file", {"path": "src/dates.py"}, SRC))
        .act(("bash", {"command": TEST_CMD}, FAIL_OUT))
        .act(
            (
                "grep",
                {"pattern": "def parse_date", "path": "src"},
                "src/dates.py:1:def parse_date(s):",
            )
        )
    )


def test_a_repeated_search_with_nothing_written_since_is_a_missing_trigger():
    assert (3, "trigger", "missing_trigger") in verdicts(investigating())


def test_a_repeat_in_a_window_that_later_compacts_is_too_late():
    assert (3, "trigger", "too_late") in verdicts(investigating().compact(GOOD_SUMMARY))


def test_a_near_miss_rereading_a_file_after_editing_it_is_not_flagged():
    story = (
        Story()
        .act(("read_file", {"path": "src/dates.py"}, SRC))
        .act(("edit_file", {"path": "src/dates.py", "old": "a", "new": "b"}, "edited"))
        .act(("read_file", {"path": "src/dates.py"}, SRC.replace("[", ".get(")))
    )
    assert not [v for v in verdicts(story) if v[1] == "trigger"]


def test_a_search_repeated_after_a_write_elsewhere_is_not_flagged():
    """A write can change what a repeated search finds (here a new definition in another
    file): the repeat is a fresh question, not established work."""
    grep = (
        "grep",
        {"pattern": "def parse_date", "path": "src"},
        "src/dates.py:1:def parse_date(s):",
    )
    story = (
        Story()
        .act(grep)
        .act(
            (
                "edit_file",
                {"path": "src/compat.py", "old": "a", "new": "def parse_date(s): ..."},
                "edited",
            )
        )
        .act(grep)
    )
    assert not [v for v in verdicts(story) if v[1] == "trigger"]
    # Without the write in between, the same repeat is flagged.
    again = Story().act(grep).act(("bash", {"command": "ls src"}, "dates.py")).act(grep)
    assert (2, "trigger", "missing_trigger") in verdicts(again)


# (b) too-early compaction ----------------------------------------------------------------
def test_b_compacting_right_after_an_untested_edit_is_too_early():
    story = (
        Story()
        .act(("read_file", {"path": "src/dates.py"}, SRC))
        .act(
            (
                "edit_file",
                {"path": "src/dates.py", "old": "s['tz']", "new": "s.get('tz')"},
                "edited",
            )
        )
        .compact(GOOD_SUMMARY)
    )
    assert (2, "trigger", "too_early") in verdicts(story)


def test_b_near_miss_edit_then_test_then_compaction_is_not_too_early():
    assert not [v for v in verdicts(explored().compact(GOOD_SUMMARY)) if v[2] == "too_early"]


def test_b_near_miss_a_budget_compaction_is_not_the_policy_s_decision():
    story = (
        Story()
        .act(
            (
                "edit_file",
                {"path": "src/dates.py", "old": "s['tz']", "new": "s.get('tz')"},
                "edited",
            )
        )
        .compact(GOOD_SUMMARY, trigger="budget")
    )
    assert not [v for v in verdicts(story) if v[2] == "too_early"]


# (c) summaries ---------------------------------------------------------------------------
def test_c_near_miss_a_summary_that_keeps_the_working_state_has_no_state_finding():
    assert not [v for v in verdicts(explored().compact(GOOD_SUMMARY)) if v[1] == "state"]


def test_c_a_summary_that_drops_the_failing_command_test_and_error_is_an_omission():
    summary = GOOD_SUMMARY.replace(
        "- `pytest tests/test_dates.py` still fails: test_parse_iso raises KeyError.\n", ""
    )
    summary = summary.replace("raises KeyError when", "fails when").split("## Next step")[0]
    summary += "## Next step\nFix `parse_date` in src/dates.py.\n"
    findings = judge_rollout(explored().compact(summary).build(), ALL_CHECKS)
    omission = next(f for f in findings if f.verdict == "omission")
    assert {(o.kind, o.value) for o in omission.omitted} == {
        ("failing_command", TEST_CMD),
        ("file_path", "tests/test_dates.py"),
        ("error_message", "KeyError"),
        ("test_name", "test_parse_iso"),
    }


def test_c_a_summary_naming_a_path_never_seen_invents_it():
    story = explored().compact(
        GOOD_SUMMARY.replace("Edited src/dates.py", "Edited src/dates.py and src/tz_utils.py")
    )
    assert (4, "state", "invented") in verdicts(story)


def test_checks_can_be_chosen():
    story = explored().compact(
        GOOD_SUMMARY.replace("Edited src/dates.py", "Edited src/dates.py and src/tz_utils.py")
    )
    only = judge_rollout(story.build(), ("state/invented",))
    assert {(f.type, f.verdict) for f in only} == {("state", "invented")}
    assert set(DEFAULT_CHECKS) <= set(ALL_CHECKS)
    assert (4, "state", "wrong_state") in verdicts(story)  # and it was never written


def test_c_a_vague_next_step_is_a_missing_next_step():
    summary = (
        GOOD_SUMMARY.split("## Next step")[0] + "## Next step\nContinue working on the task.\n"
    )
    assert (4, "state", "missing_next_step") in verdicts(explored().compact(summary))


def test_c_remaining_error_with_a_finish_next_step_is_a_contradiction():
    summary = (
        GOOD_SUMMARY.split("## Next step")[0] + "## Next step\nAll done: submit `parse_date` fix.\n"
    )
    assert (4, "state", "contradiction") in verdicts(explored().compact(summary))


def test_c_a_test_recorded_as_passing_whose_last_run_failed_is_wrong_state():
    summary = GOOD_SUMMARY.replace(
        "still fails: test_parse_iso raises KeyError",
        "passes: test_parse_iso is green; KeyError fixed",
    )
    assert (4, "state", "wrong_state") in verdicts(explored().compact(summary))


# (d) continuation ------------------------------------------------------------------------
def test_d_repeating_a_search_the_summary_records_as_done_is_a_redo():
    story = (
        Story()
        .act(
            (
                "grep",
                {"pattern": "def parse_date", "path": "src"},
                "src/dates.py:1:def parse_date(s):",
            )
        )
        .act(("read_file", {"path": "src/dates.py"}, SRC))
        .compact(
            "# Auto Context Summary\n`parse_date` is defined in src/dates.py and indexes s['tz'].\n"
            "## Next step\nRead tests/test_dates.py to see the expected behaviour.\n"
        )
        .act(
            (
                "grep",
                {"pattern": "def parse_date", "path": "src"},
                "src/dates.py:1:def parse_date(s):",
            )
        )
    )
    assert (3, "continuation", "redo") in verdicts(story)


def test_d_first_calls_that_touch_nothing_the_next_step_names_ignore_it():
    story = (
        explored()
        .compact(GOOD_SUMMARY)
        .act(("bash", {"command": "ls docs"}, "index.md"))
        .act(("read_file", {"path": "README.md"}, "# dates"))
    )
    assert (5, "continuation", "ignored_next_step") in verdicts(story)


def test_d_near_miss_reading_the_file_the_next_step_names_is_following_it():
    story = (
        explored()
        .compact(GOOD_SUMMARY)
        .act(("read_file", {"path": "src/formats.py"}, "FORMATS = {'utc': ...}"))
        .act(("read_file", {"path": "src/dates.py"}, SRC))
    )
    assert not [v for v in verdicts(story) if v[1] == "continuation"]
