"""OpenHands V0 event lists and V1 events: calls, condensation views, token ids."""

from tests.readers.util import accounted, fixture, nonblank_lines, only, read, shape


def test_v0_condensation_replays_the_view_openhands_builds():
    rollouts, rejected, skipped = read("openhands", fixture("openhands", "v0_condensation.json"))
    assert not rejected
    events = shape(rollouts[0])
    assert events[6] == (
        "rewrite",
        "compaction",
        "budget",
        [
            ("keep", "event-0"),
            ("keep", "event-1"),
            ("user", "7:summary", "Summary: listed files; bug.py is the only file."),
            ("keep", "response-chatcmpl-2"),
            ("keep", "event-6"),
        ],
    )
    assert [c.id for c in rollouts[0].calls()] == [
        "response-chatcmpl-1",
        "response-chatcmpl-2",
        "response-chatcmpl-3",
    ]
    assert sorted(s.reason for s in skipped) == [
        "action 'recall' (not sent to the model)",
        "observation 'agent_state_changed' (not sent to the model)",
    ]
    assert rollouts[0].tools[0]["function"]["name"] == "execute_bash"


def test_v0_actions_of_one_model_response_are_one_call():
    rollout = only("openhands", fixture("openhands", "v0_parallel_calls.json"))
    assert shape(rollout)[2:5] == [
        ("assistant", "response-chatcmpl-9", "Listing both.", ["call_x", "call_y"]),
        ("tool", "event-4", "main.py", "call_x"),
        ("tool", "event-5", "test_main.py", "call_y"),
    ]
    assert rollout.calls()[0].tool_calls[1].arguments == '{"command":"ls tests"}'


def test_v1_condensation_forgets_events_and_token_events_attach_to_their_calls():
    rollout = only("openhands", fixture("openhands", "v1_events.jsonl"))
    assert shape(rollout) == [
        ("system", "event-e0", "You are an agent."),
        ("user", "event-e1", "Count the files."),
        ("assistant", "response-resp-1", "Two commands.", ["tc-1", "tc-2"]),
        ("tool", "event-e6", "3", "tc-1"),
        ("tool", "event-e7", "/work", "tc-2"),
        (
            "rewrite",
            "compaction",
            "budget",
            [
                ("keep", "event-e0"),
                ("keep", "event-e1"),
                ("user", "e8:summary", "Summary: there are 3 files in /work."),
            ],
        ),
        ("assistant", "event-e9", "There are 3 files.", []),
    ]
    first, second = rollout.calls()
    assert (first.prompt_ids, first.output_ids) == ([1, 2, 3], [7, 8, 9])
    assert (second.prompt_ids, second.output_ids) == ([1, 2, 3, 4], [11, 12])
    assert first.reasoning == "I will run two commands."


def test_every_v1_line_is_accounted_for():
    path = fixture("openhands", "v1_events.jsonl")
    assert accounted(path, "openhands") == nonblank_lines(path)


def test_eval_output_lines_with_a_history_are_one_rollout_each(tmp_path):
    import json

    events = json.loads(fixture("openhands", "v0_parallel_calls.json").read_text())
    path = tmp_path / "output.jsonl"
    path.write_text(
        "\n".join(json.dumps({"instance_id": f"repo__{i}", "history": events}) for i in range(2))
        + "\n"
    )
    rollouts, rejected, skipped = read("openhands", path)
    assert (
        [r.rollout_id for r in rollouts] == ["repo__0", "repo__1"] and not rejected and not skipped
    )
