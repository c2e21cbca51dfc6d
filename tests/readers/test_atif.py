"""ATIF (Harbor / Terminus-2): steps, token ids, continuation files, context management."""

from tests.readers.util import fixture, only, read, shape


def test_agent_steps_are_calls_with_tool_results_and_token_truth():
    rollout = only("atif", fixture("atif", "tool_calls_token_ids.json"))
    assert shape(rollout) == [
        ("system", "step-1", "You are a terminal agent."),
        ("user", "step-2", "Count lines in a.txt."),
        ("assistant", "step-3", "", ["c1"]),
        ("tool", "step-3:c1", "3 a.txt", "c1"),
        ("assistant", "step-4", "a.txt has 3 lines.", []),
    ]
    first = rollout.calls()[0]
    assert (first.prompt_ids, first.output_ids, first.logprobs) == (
        [10, 11, 12, 13],
        [20, 21, 22],
        [-0.1, -0.2, -0.3],
    )
    assert (
        first.tool_calls[0].arguments == '{"cmd": "wc -l a.txt"}' and first.reasoning == "Use wc."
    )
    assert rollout.tools[0]["function"]["name"] == "bash"


def test_continuation_file_is_joined_and_its_copied_steps_are_context_not_calls():
    rollout = only("atif", fixture("atif", "linear_history", "agent", "trajectory.json"))
    events = shape(rollout)
    assert events[3] == (
        "rewrite",
        "compaction",
        "budget",
        [
            ("keep", "step-1"),
            (
                "user",
                "step-2#2",
                "You are picking up work from a previous AI agent. Summary: nothing created yet.",
            ),
            ("assistant", "step-3", "Is the directory empty?", []),
            ("user", "step-4", "Yes."),
        ],
    )
    assert [c.id for c in rollout.calls()] == ["step-2", "step-5"]
    assert rollout.meta["continuation_files"] == ["trajectory.cont-1.json"]
    assert (
        rollout.events[3].meta["subagent_refs"][0]["trajectory_path"]
        == "trajectory.summarization-1-summary.json"
    )


def test_reward_and_task_come_from_the_trial_result():
    rollout = only("atif", fixture("atif", "linear_history", "agent", "trajectory.json"))
    assert (rollout.reward, rollout.task_id, rollout.rollout_id) == (1.0, "hello-world", "trial-42")


def test_a_continuation_file_read_alone_is_skipped_because_its_parent_reads_it():
    rollouts, rejected, skipped = read(
        "atif", fixture("atif", "linear_history", "agent", "trajectory.cont-1.json")
    )
    assert not rollouts and not rejected
    assert (
        skipped[0].reason == "continuation file: read as part of the trajectory that references it"
    )


def test_replace_boundary_makes_the_summary_the_new_context_and_embedded_subagents_are_rollouts():
    rollouts, rejected, _ = read("atif", fixture("atif", "embedded_subagent.json"))
    main, sub = rollouts
    assert shape(main)[3] == (
        "rewrite",
        "compaction",
        "budget",
        [("user", "step-4:summary", "Summary: the repo is a CLI.")],
    )
    assert (sub.rollout_id, sub.parent_rollout_id) == ("run-7/compact-001", "run-7")


def test_summarization_subagent_file_links_its_parent_and_its_last_call_is_the_summary_call():
    rollout = only(
        "atif",
        fixture("atif", "linear_history", "agent", "trajectory.summarization-1-summary.json"),
    )
    assert (rollout.rollout_id, rollout.parent_rollout_id) == (
        "trial-42-summarization-1-summary",
        "trial-42",
    )
    assert [c.call_kind for c in rollout.calls()] == ["summary"]
