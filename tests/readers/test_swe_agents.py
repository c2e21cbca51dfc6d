"""SWE-agent .traj and mini-swe-agent trajectories."""

import json
import os
from pathlib import Path

import pytest

from pipeline.core.segment import Segmenter
from pipeline.readers.common import content_text
from schemas.replay import replay
from tests.readers.util import fixture, only, read, shape


def test_swe_agent_history_becomes_calls_with_demonstrations_flagged_and_reused_call_ids_renamed():
    rollout = only("swe-agent", fixture("swe_agent", "function_calling.traj"))
    assert [m[:2] for m in shape(rollout)] == [
        ("system", "h0"),
        ("user", "h1"),
        ("assistant", "h2"),
        ("tool", "h3"),
        ("user", "h4"),
        ("assistant", "h5"),
        ("tool", "h6"),
        ("assistant", "h7"),
        ("tool", "h8"),
    ]
    demo, real = rollout.calls()[0], rollout.calls()[1]
    assert demo.meta["is_demo"] is True and "is_demo" not in real.meta
    assert [c.id for c in real.tool_calls] == ["call_demo#2"]
    assert rollout.events[6].tool_call_id == "call_demo#2"
    assert rollout.meta["renamed_tool_call_ids"] == {"call_demo#2": "call_demo"}


def test_swe_agent_outcome_task_and_model_come_from_info_and_replay_config():
    rollout = only("swe-agent", fixture("swe_agent", "function_calling.traj"))
    assert rollout.task_id == "demo__repo-1" and rollout.model == "gpt-4o"
    assert rollout.reward is None
    assert rollout.meta["outcome"] == {"exit_status": "submitted", "submitted": True}


def test_swe_agent_query_that_differs_from_the_history_is_an_edit_before_the_call():
    rollout = only("swe-agent", fixture("swe_agent", "history_processor_query.traj"))
    assert shape(rollout)[6] == (
        "rewrite",
        "edit",
        "budget",
        [
            ("keep", "h0"),
            ("keep", "h1"),
            ("keep", "h2"),
            ("user", "q2.3", "Old environment output: (200 lines omitted)"),
            ("keep", "h4"),
            ("keep", "h5"),
        ],
    )
    assert sum(e.type == "rewrite" for e in rollout.events) == 1


def test_mini_swe_agent_messages_are_the_rollout():
    rollout = only("mini-swe-agent", fixture("mini_swe_agent", "v1_append_only.json"))
    assert [m[0] for m in shape(rollout)] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert rollout.model == "claude-3-5-sonnet-20241022"
    assert rollout.meta["outcome"] == {"exit_status": "Submitted", "submitted": False}


def test_mini_swe_agent_v2_tool_calls_pair_and_the_exit_message_is_skipped():
    rollouts, rejected, skipped = read(
        "mini-swe-agent", fixture("mini_swe_agent", "v2_tool_calls_exit.json")
    )
    assert not rejected and [s.reason.split(" ")[0] for s in skipped] == ["role"]
    assert shape(rollouts[0])[2:] == [
        ("assistant", "m2", "", ["tc1"]),
        ("tool", "m3", "diff --git", "tc1"),
    ]


def test_swe_agent_final_step_only_in_trajectory_is_the_last_trained_call():
    rollout = only("swe-agent", fixture("swe_agent", "final_step_only_in_trajectory.traj"))
    calls = rollout.calls()
    assert [c.id for c in calls] == ["h2", "h4", "step2"]
    last = calls[-1]
    assert last.content == "The fix is in; submitting.\n```\nsubmit\n```"
    assert last.meta == {"from_trajectory_step": 2}
    # It was sampled from the whole history, final observation included.
    assert [m.id for m in replay(rollout)[-1].context] == ["h0", "h1", "h2", "h3", "h4", "h5"]


def test_swe_agent_final_function_call_submit_is_rebuilt_and_an_autosubmission_is_not_a_call(
    tmp_path,
):
    rollout = only("swe-agent", fixture("swe_agent", "function_calling_final_step.traj"))
    last = rollout.calls()[-1]
    assert (last.content, [(c.name, c.arguments) for c in last.tool_calls]) == (
        "Calling `submit` to submit.",
        [("submit", "{}")],
    )
    # SWE-agent's own autosubmission (no action) and a call it did not record.
    doc = json.loads(fixture("swe_agent", "function_calling_final_step.traj").read_text())
    doc["trajectory"][-1]["action"] = ""
    (tmp_path / "auto.traj").write_text(json.dumps(doc))
    assert [c.id for c in only("swe-agent", tmp_path / "auto.traj").calls()] == ["h2"]
    doc["trajectory"][-1]["action"] = "edit 3:3"
    (tmp_path / "edit.traj").write_text(json.dumps(doc))
    rollout = only("swe-agent", tmp_path / "edit.traj")
    assert [c.id for c in rollout.calls()] == ["h2"]
    assert rollout.meta["untrained_steps"] == [
        "trajectory[1]: function call of action 'edit' not recorded"
    ]


@pytest.mark.parametrize(
    ("fmt", "folder"), [("swe-agent", "swe_agent"), ("mini-swe-agent", "mini_swe_agent")]
)
def test_real_swe_agent_files_every_action_trained_once_every_observation_in_context(
    fmt, folder, renderer
):
    root = os.environ.get("SEAM_REALWORLD_DIR")
    if not root or not Path(root, folder).is_dir():
        pytest.skip("SEAM_REALWORLD_DIR is not set or has no such folder")
    for path in sorted(Path(root, folder).iterdir()):
        doc = json.loads(path.read_text())
        raw = doc["history"] if fmt == "swe-agent" else doc["messages"]
        rollout = only(fmt, path)
        views = replay(rollout)
        actions = [m for m in raw if m["role"] == "assistant"]
        if fmt == "swe-agent":  # the last step (submit) is trained even where history lacks it
            assert actions[-1]["action"] == doc["trajectory"][-1]["action"] == "submit"
        assert [v.message.content for v in views] == [content_text(m["content"]) for m in actions]
        # Every observation before the last action is in that action's context.
        last_action = max(i for i, m in enumerate(raw) if m["role"] == "assistant")
        observations = [
            content_text(m["content"]) for m in raw[:last_action] if m["role"] in ("user", "tool")
        ]
        context = [m.content for m in views[-1].context if m.role in ("user", "tool")]
        assert context == observations
        segs = Segmenter(renderer).segments(rollout)
        assert len(segs) == 1
        assert sorted(s.call_index for s in segs[0].spans) == list(range(len(views)))
