"""SWE-agent .traj and mini-swe-agent trajectories."""

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
