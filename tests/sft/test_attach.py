"""Attaching corrections: what fits is attached, everything else is rejected with an
exact reason."""

from __future__ import annotations

import json

from pipeline.sft.attach import CorrectionsFile, attach
from schemas.correction import Correction, executed_output_text
from tests.judge.rollouts import Story

SUMMARY = "# Auto Context Summary\nsrc/dates.py indexes s['tz'].\n## Next step\nFix `parse_date` in src/dates.py."


def story() -> Story:
    """calls: 0 read, 1 read, 2 summary, 3 read (first after compaction), 4 edit, 5 test, 6 test, 7 test."""
    s = (
        Story()
        .act(("read_file", {"path": "src/dates.py"}, "def parse_date(s): ..."))
        .act(("grep", {"pattern": "tz", "path": "src"}, "src/dates.py:2: s['tz']"))
        .compact(SUMMARY)
        .act(
            ("read_file", {"path": "src/dates.py"}, "def parse_date(s): ..."),
            content="Following the summary.",
        )
        .act(("edit_file", {"path": "src/dates.py", "old": "a", "new": "b"}, "edited"))
    )
    for _ in range(3):
        s.act(("bash", {"command": "pytest tests/test_dates.py"}, "4 passed"))
    return s


def correction(rollout, call_index: int, type_: str, **fields) -> Correction:
    executed = executed_output_text(rollout.calls()[call_index])
    base = dict(
        rollout_id=rollout.rollout_id,
        call_index=call_index,
        type=type_,
        verdict="omission",
        original="something else",
        replacement=executed,
    )
    return Correction(**{**base, **fields})


def reasons(rollout, *corrections) -> list[str]:
    _, rejected = attach(rollout, [(c, "test") for c in corrections])
    return [r.reason for r in rejected]


def test_executed_output_text_shows_content_then_tool_calls_as_chatml_writes_them():
    call = story().build().calls()[3]
    assert executed_output_text(call) == (
        'Following the summary.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "src/dates.py"}}\n</tool_call>'
    )


def test_a_matching_correction_is_attached():
    rollout = story().build()
    fits = [
        correction(rollout, 2, "state"),
        correction(rollout, 3, "continuation", verdict="redo"),
        correction(rollout, 1, "trigger", verdict="too_late"),
    ]
    attached, rejected = attach(rollout, [(c, "test") for c in fits])
    assert rejected == [] and attached.corrections == fits


def test_embedded_corrections_are_checked_like_file_ones():
    rollout = story().build()
    bad = correction(rollout, 2, "state", replacement="not what ran")
    attached, rejected = attach(rollout.model_copy(update={"corrections": [bad]}))
    assert attached.corrections == [] and rejected[0].origin == "embedded"


def test_a_replacement_that_is_not_the_executed_output_is_rejected():
    rollout = story().build()
    assert reasons(rollout, correction(rollout, 2, "state", replacement=SUMMARY + " (edited)")) == [
        f"replacement does not equal the executed output of call 2 (first difference at character {len(SUMMARY)})"
    ]


def test_a_correction_of_a_call_that_does_not_exist_is_rejected():
    rollout = story().build()
    assert reasons(
        rollout, correction(rollout, 0, "state").model_copy(update={"call_index": 8})
    ) == ["call 8 does not exist: the rollout has 8 calls"]


def test_a_state_correction_of_an_action_call_is_rejected():
    rollout = story().build()
    assert reasons(rollout, correction(rollout, 4, "state")) == [
        "type 'state' needs a summary call; call 4 is an action call"
    ]


def test_a_continuation_correction_far_from_a_compaction_is_rejected():
    rollout = story().build()
    assert reasons(rollout, correction(rollout, 6, "continuation", verdict="redo")) == [
        "type 'continuation' needs one of the first 3 calls after a compaction; call 6 is not"
    ]


def test_a_trigger_correction_far_from_any_compaction_is_rejected():
    rollout = story().build()
    assert reasons(rollout, correction(rollout, 7, "trigger", verdict="too_late")) == [
        "type 'trigger' needs a call at a compaction decision; call 7 does not compact, its original proposal "
        "does not compact, and no compaction follows within 3 calls"
    ]


def test_a_trigger_correction_whose_original_compacted_fits_any_call():
    rollout = story().build()
    original = '<tool_call>\n{"name": "compact", "arguments": {}}\n</tool_call>'
    assert (
        reasons(rollout, correction(rollout, 7, "trigger", verdict="too_early", original=original))
        == []
    )


def test_a_correction_that_changes_nothing_or_repeats_one_is_rejected():
    rollout = story().build()
    same = correction(rollout, 2, "state")
    same = same.model_copy(update={"original": same.replacement})
    assert reasons(
        rollout, same, correction(rollout, 2, "state"), correction(rollout, 2, "state")
    ) == [
        "original equals replacement at call 2: nothing was corrected",
        "duplicate: another state correction already names call 2",
    ]


def test_a_corrections_file_reports_bad_lines_and_rollouts_it_never_met(tmp_path):
    rollout = story().build()
    good = correction(rollout, 2, "state")
    stray = good.model_copy(update={"rollout_id": "nowhere"})
    path = tmp_path / "corrections.jsonl"
    path.write_text(
        "\n".join(
            [
                good.model_dump_json(),
                "{oops",
                json.dumps({"rollout_id": "r1"}),
                stray.model_dump_json(),
            ]
        )
    )
    loaded = CorrectionsFile(str(path))
    assert loaded.for_rollout("r1") == [(good, f"{path}:1")]
    assert [(r.origin, r.reason.split(":")[0]) for r in loaded.invalid] == [
        (f"{path}:2", "invalid JSON"),
        (f"{path}:3", "not a correction record"),
    ]
    assert [(r.origin, r.reason) for r in loaded.unclaimed({"r1"})] == [
        (f"{path}:4", "names rollout 'nowhere', which is not among the accepted input rollouts")
    ]
