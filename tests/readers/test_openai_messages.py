"""openai-messages (a conversation per line) and chat-completions gateway logs (a call per line)."""

import json

from pipeline.readers.detect import detect_format
from tests.readers.util import fixture, only, read, shape


def test_one_conversation_per_line_with_tools_reward_and_task():
    rollouts, rejected, _ = read(
        "openai-messages", fixture("openai_messages", "conversations.jsonl")
    )
    first, second = rollouts
    assert shape(first) == [
        ("system", "L1.0", "You are helpful."),
        ("user", "L1.1", "ls"),
        ("assistant", "L1.2", "", ["t1"]),
        ("tool", "L1.3", "a.txt", "t1"),
        ("assistant", "L1.4", "There is a.txt.", []),
    ]
    assert (first.rollout_id, first.task_id, first.reward, first.model) == (
        "conv-1",
        "task-a",
        1.0,
        "qwen3-8b",
    )
    assert first.calls()[0].reasoning == "Run ls." and first.tools[0]["function"]["name"] == "bash"
    assert second.rollout_id == second.task_id and len(second.rollout_id) == 16
    assert [(r.line, r.reason) for r in rejected] == [
        (3, "tool message L3.1 answers no earlier tool call")
    ]


def test_calls_are_grouped_by_session_and_a_request_that_is_not_an_extension_is_a_rewrite():
    rollouts, rejected, _ = read(
        "chat-completions", fixture("chat_completions", "gateway_log.jsonl")
    )
    assert not rejected
    session, other = rollouts
    assert (session.rollout_id, other.rollout_id) == ("sess-1", "sess-2")
    assert shape(session)[7] == (
        "rewrite",
        "compaction",
        "budget",
        [
            ("keep", "L1.0"),
            ("user", "L5.1", "Fix the bug.\n\nPrevious work:\nSummary: the bug is in parse()."),
        ],
    )
    assert [m[1] for m in shape(session) if m[0] == "user"] == ["L1.1", "L3.3", "L4.5"]


def test_the_call_whose_output_becomes_the_new_context_is_the_summary_call():
    rollouts, _, _ = read("chat-completions", fixture("chat_completions", "gateway_log.jsonl"))
    assert [c.call_kind for c in rollouts[0].calls()] == ["action", "action", "summary", "action"]


def test_logged_token_ids_and_logprobs_are_kept():
    rollouts, _, _ = read("chat-completions", fixture("chat_completions", "gateway_log.jsonl"))
    call = rollouts[0].calls()[0]
    assert (call.prompt_ids, call.output_ids, call.logprobs) == ([1, 2, 3], [4, 5], [-0.1, -0.2])


def test_group_by_option_names_the_grouping_field():
    rollouts, _, _ = read(
        "chat-completions",
        fixture("chat_completions", "gateway_log.jsonl"),
        group_by="request.model",
    )
    assert [r.rollout_id for r in rollouts] == ["qwen3-8b"]
    assert sum(e.type == "rewrite" for e in rollouts[0].events) >= 1


def test_a_plain_json_list_of_chat_messages_is_one_conversation():
    path = fixture("openai_messages", "message_list.json")
    assert detect_format(path) == "openai-messages"
    rollout = only("openai-messages", path)
    raw = json.loads(path.read_text())
    assert [(m.role, m.content) for m in rollout.events] == [(m["role"], m["content"]) for m in raw]
    assert [c.id for c in rollout.calls()] == ["c0.2", "c0.4"]
    assert rollout.rollout_id.startswith("message_list-")


def test_a_pretty_printed_json_file_is_read_whole_not_split_into_line_records(tmp_path):
    conv = {
        "id": "conv-9",
        "task_id": "t",
        "reward": 1,
        "messages": [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi."},
        ],
    }
    one = tmp_path / "one.json"
    one.write_text(json.dumps(conv, indent=2))
    rollouts, rejected, _ = read("openai-messages", one)
    assert not rejected
    assert [(r.rollout_id, r.reward, len(r.calls())) for r in rollouts] == [("conv-9", 1.0, 1)]
    many = tmp_path / "many.json"
    many.write_text(json.dumps([conv, {**conv, "id": "conv-10"}], indent=2))
    assert detect_format(many) == "openai-messages"
    rollouts, rejected, _ = read("openai-messages", many)
    assert not rejected and [r.rollout_id for r in rollouts] == ["conv-9", "conv-10"]
