"""RolloutBuilder: the pairing repairs every reader relies on, and context matching."""

from pipeline.readers.builder import RolloutBuilder, msg
from schemas.rollout import Keep


def call(call_id):
    return {"id": call_id, "name": "bash", "arguments": {"cmd": "ls"}}


def test_a_reused_tool_call_id_is_renamed_and_its_next_result_goes_to_the_newest_call():
    b = RolloutBuilder()
    b.append(msg("user", "go"))
    b.append(msg("assistant", "", tool_calls=[call("c1")]))
    b.append(msg("tool", "one", tool_call_id="c1"))
    b.append(msg("assistant", "", tool_calls=[call("c1")]))
    second = b.append(msg("tool", "two", tool_call_id="c1"))
    rollout = b.build(rollout_id="r", task_id="t", source="test")
    assert second.tool_call_id == "c1#2"
    assert rollout.meta["renamed_tool_call_ids"] == {"c1#2": "c1"}


def test_a_result_for_no_open_call_is_refused():
    b = RolloutBuilder()
    b.append(msg("user", "go"))
    assert b.append(msg("tool", "orphan", tool_call_id="nope")) is None
    assert b.live == ["m0"]


def test_missing_results_are_filled_before_the_next_message_but_not_for_the_final_call():
    b = RolloutBuilder(fill_missing_results=True)
    b.append(msg("user", "go"))
    b.append(msg("assistant", "", tool_calls=[call("c1"), call("c2")]))
    b.append(msg("tool", "ok", tool_call_id="c1"))
    b.append(msg("assistant", "", tool_calls=[call("c3")]))
    rollout = b.build(rollout_id="r", task_id="t", source="test")
    filled = [e for e in rollout.events if e.type == "message" and e.meta.get("synthesized")]
    assert [e.tool_call_id for e in filled] == ["c2"]
    assert rollout.meta["synthesized_tool_results"] == 1


def test_match_keeps_equal_messages_in_order_and_the_rest_are_new():
    b = RolloutBuilder()
    for text in ("system prompt", "task", "old answer"):
        b.append(msg("user" if text != "old answer" else "assistant", text))
    items = b.match(
        [msg("user", "system prompt"), msg("user", "summary"), msg("assistant", "old answer")]
    )
    assert [(type(i).__name__, getattr(i, "id", None)) for i in items] == [
        ("Keep", "m0"),
        ("Msg", None),
        ("Keep", "m2"),
    ]
    rewrite = b.rewrite("compaction", "budget", items)
    assert [c.id for c in rewrite.context] == ["m0", "m3", "m2"]
    assert isinstance(rewrite.context[0], Keep) and b.live == ["m0", "m3", "m2"]
