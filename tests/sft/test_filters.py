"""SFT filters: each fires on its case, stays quiet on a near miss, and can be turned off."""

from __future__ import annotations

import difflib
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.sft.filters import (
    FilterOptions,
    over_length,
    rollout_filter,
    similarity_at_least,
    trim_dangling_call,
)
from schemas.rollout import MessageEvent, ToolCall
from tests.examples import examples
from tests.judge.rollouts import Story

SUMMARY = "# Auto Context Summary\nsrc/dates.py indexes s['tz'].\n## Next step\nFix `parse_date` in src/dates.py."


def clean() -> Story:
    return (
        Story()
        .act(("read_file", {"path": "src/dates.py"}, "code"))
        .compact(SUMMARY)
        .act(("read_file", {"path": "src/dates.py"}, "code"))
    )


def reason(story_or_rollout, **options):
    rollout = story_or_rollout.build() if isinstance(story_or_rollout, Story) else story_or_rollout
    found = rollout_filter(rollout, FilterOptions(**options))
    return found[0] if found else None


def test_a_clean_rollout_passes_every_filter():
    assert reason(clean()) is None


def test_unparsable_tool_arguments_are_a_malformed_request():
    story = clean()
    story.events.append(
        MessageEvent(
            id="bad",
            role="assistant",
            tool_calls=[ToolCall(id="x", name="read_file", arguments='{"path": "a.py"')],
        )
    )
    assert rollout_filter(story.build(), FilterOptions()) == (
        "malformed_request",
        "call 3: arguments of read_file are not a JSON object",
    )


def test_a_tool_the_rollout_does_not_define_is_a_malformed_request():
    assert reason(clean().act(("browser", {"url": "x"}, "page"))) == "malformed_request"


def test_a_rollout_ending_on_an_unanswered_tool_call_is_trimmed_but_one_ending_on_submit_is_not():
    story = clean()
    story.events.append(
        MessageEvent(
            id="end",
            role="assistant",
            tool_calls=[ToolCall(id="y", name="bash", arguments='{"command": "ls"}')],
        )
    )
    dangling = story.build()
    assert reason(dangling) is None  # saved mid-tool: not malformed
    trimmed = trim_dangling_call(dangling)
    assert [c.id for c in trimmed.calls()] == [c.id for c in dangling.calls()[:-1]]
    assert trimmed.events == dangling.events[:-1]
    story.events[-1] = MessageEvent(
        id="end", role="assistant", tool_calls=[ToolCall(id="y", name="submit", arguments="{}")]
    )
    assert trim_dangling_call(story.build()) is None
    only_call = Story()
    only_call.events.append(
        MessageEvent(
            id="a", role="assistant", tool_calls=[ToolCall(id="z", name="bash", arguments="{}")]
        )
    )
    assert trim_dangling_call(only_call.build()) is None  # nothing would be left to train


def test_a_compaction_right_after_a_compaction_is_a_summary_loop():
    assert (
        reason(clean().compact(SUMMARY.replace("Fix", "Repair")).compact(SUMMARY)) == "summary_loop"
    )


def test_near_identical_consecutive_summaries_are_a_summary_loop_and_different_ones_are_not():
    looped = clean().compact(SUMMARY + " ").act(("read_file", {"path": "src/dates.py"}, "code"))
    assert reason(looped) == "summary_loop"
    other = (
        "# Auto Context Summary\nEdited src/dates.py; tests/test_dates.py passes now.\n"
        "## Next step\nRun the full suite with `pytest`, then submit."
    )
    moved_on = clean().compact(other).act(("bash", {"command": "pytest"}, "9 passed"))
    assert reason(moved_on) is None


@st.composite
def edited_pairs(draw) -> tuple[str, str]:
    """A text and a copy with a few characters inserted, deleted or replaced and pieces
    moved (the same characters in another order: the quick bounds stay high while the
    ratio falls), from a small alphabet so characters repeat: ratios from 1.0 down
    through the loop threshold."""
    a = draw(st.text(alphabet="ab #\nxyz.", min_size=1, max_size=120))
    b = list(a)
    for _ in range(draw(st.integers(0, 12))):
        at = draw(st.integers(0, len(b)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "move"]))
        char = draw(st.sampled_from("ab #\nxyzQ"))
        if op == "insert":
            b.insert(at, char)
        elif op == "move":
            piece = b[at : at + draw(st.integers(1, 20))]
            del b[at : at + len(piece)]
            to = draw(st.integers(0, len(b)))
            b[to:to] = piece
        elif at < len(b):
            b[at : at + 1] = [char] if op == "replace" else []
    return a, "".join(b)


@settings(max_examples=examples(150, 500), deadline=None)
@given(edited_pairs(), st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.97, 0.99]))
def test_the_loop_similarity_shortcut_gives_the_full_ratios_verdict(pair, threshold):
    """The quick upper bounds only skip pairs the full ratio puts under the threshold."""
    a, b = pair
    ratio = difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    assert similarity_at_least(a, b, threshold) == (ratio if ratio >= threshold else None)


def test_first_calls_after_compaction_on_unseen_files_are_off_task():
    story = (
        Story()
        .act(("read_file", {"path": "src/dates.py"}, "code"))
        .compact(SUMMARY)
        .act(("read_file", {"path": "vendor/left_pad.js"}, "module.exports = ..."))
    )
    assert reason(story) == "off_task"
    assert reason(story, off_task=False) is None


def test_a_guessed_file_next_to_known_ones_is_not_off_task():
    story = (
        Story()
        .act(("read_file", {"path": "src/dates.py"}, "code"))
        .compact(SUMMARY)
        .act(("read_file", {"path": "src/time_utils.py"}, "No such file or directory"))
    )
    assert reason(story) is None


def test_resolved_only_drops_unresolved_and_unknown_outcomes():
    assert reason(clean().build(resolved=False), resolved_only=True) == "unresolved"
    assert reason(clean().build(), resolved_only=True) == "outcome_unknown"
    assert reason(clean().build(resolved=True), resolved_only=True) is None
    assert reason(clean().build(resolved=False)) is None


def test_over_length_applies_only_with_a_limit():
    assert over_length(10_000, FilterOptions(max_tokens=8192))
    assert not over_length(8192, FilterOptions(max_tokens=8192))
    assert not over_length(10**9, FilterOptions())


@pytest.mark.parametrize("switch", ["malformed", "summary_loops"])
def test_each_filter_can_be_turned_off(switch):
    cases = {
        "malformed": clean().act(("browser", {"url": "x"}, "page")),
        "summary_loops": clean().compact(SUMMARY.replace("Fix", "Repair")).compact(SUMMARY),
    }
    assert reason(cases[switch]) is not None
    assert (
        rollout_filter(cases[switch].build(), replace(FilterOptions(), **{switch: False})) is None
    )
