"""Codex rollout JSONL: response items, compactions (local, remote, legacy), rollbacks."""

import gzip

import pytest
import zstandard

from pipeline.readers.codex import ENCRYPTED_SUMMARY
from tests.readers.util import accounted, fixture, nonblank_lines, only, read, shape

BASE = ("system", "base_instructions", "You are Codex, a coding agent.")


def test_response_items_become_calls_and_event_msg_duplicates_are_skipped():
    rollouts, rejected, skipped = read("codex", fixture("codex", "calls_and_duplicates.jsonl"))
    assert not rejected
    assert shape(rollouts[0]) == [
        BASE,
        ("system", "L2", "<permissions instructions>workspace-write</permissions instructions>"),
        ("user", "L4", "Run the tests."),
        ("assistant", "L9", "Running the suite.", ["call_1"]),
        ("tool", "L16", "3 passed", "call_1"),
        ("assistant", "L17", "All 3 tests pass.", []),
    ]
    call = rollouts[0].calls()[0]
    assert call.reasoning == "Running pytest." and call.meta["encrypted_reasoning"] is True
    assert rollouts[0].model == "gpt-5.3-codex"
    assert all(s.reason.startswith("event_msg/") for s in skipped)
    assert sum("token_count" in s.reason for s in skipped) == 4


def test_compacted_replaces_history_with_replacement_history_keeping_copies_by_id():
    rollout = only("codex", fixture("codex", "compacted_local.jsonl"))
    rewrite = shape(rollout)[6]
    assert rewrite == (
        "rewrite",
        "compaction",
        "budget",
        [
            ("keep", "base_instructions"),
            ("keep", "L2"),
            ("keep", "L9"),
            ("user", "L11.2", "Summary: tests were run; 3 pass; next: add a test for parse()."),
        ],
    )
    assert [c.id for c in rollout.calls()] == ["L4", "L7", "L14", "L17"]


def test_remote_compaction_keeps_the_encrypted_summary_as_an_opaque_flagged_message():
    rollout = only("codex", fixture("codex", "compacted_remote.jsonl"))
    rewrite = next(e for e in rollout.events if e.type == "rewrite")
    opaque = rewrite.context[-1]
    assert opaque.role == "user" and opaque.content == ENCRYPTED_SUMMARY
    assert opaque.meta == {
        "opaque": "encrypted_compaction",
        "codex_item": "compaction",
        "encrypted_content": "gAAAAB-remote-summary",
    }
    assert rewrite.meta["remote"] is True and rewrite.meta["window_id"] == "w-2"
    assert rollout.meta["fidelity"][1:] == [
        {
            "reason": "opaque_summary",
            "event_id": rewrite.id,
            "detail": "remote compaction: the summary is encrypted by the provider",
        }
    ]


def test_legacy_compaction_without_replacement_history_is_rebuilt_from_user_messages_and_summary():
    rollout = only("codex", fixture("codex", "compacted_legacy.jsonl"))
    assert shape(rollout)[3] == (
        "rewrite",
        "compaction",
        "budget",
        [("keep", "base_instructions"), ("keep", "L2"), ("user", "L6", "Summary: cli.py written.")],
    )


def test_thread_rollback_drops_the_last_user_turn():
    rollout = only("codex", fixture("codex", "rollback.jsonl"))
    assert shape(rollout)[5:] == [
        (
            "rewrite",
            "edit",
            "manual",
            [("keep", "base_instructions"), ("keep", "L2"), ("keep", "L4")],
        ),
        ("user", "L11", "Also add a test for logging."),
        ("assistant", "L13", "Added the test.", []),
    ]


def test_each_session_meta_starts_a_rollout_and_a_fork_links_its_parent():
    rollouts, _, _ = read("codex", fixture("codex", "two_sessions.jsonl"))
    first, fork = rollouts
    assert fork.parent_rollout_id == first.rollout_id == first.task_id
    assert (first.model, fork.model) == ("gpt-5.3-codex", "gpt-5.2")


@pytest.mark.parametrize("compress", ["gz", "zst"])
def test_compressed_rollouts_read_transparently(tmp_path, compress):
    data = fixture("codex", "compacted_local.jsonl").read_bytes()
    path = tmp_path / f"rollout.jsonl.{compress}"
    path.write_bytes(
        gzip.compress(data) if compress == "gz" else zstandard.ZstdCompressor().compress(data)
    )
    assert shape(only("codex", path)) == shape(
        only("codex", fixture("codex", "compacted_local.jsonl"))
    )


@pytest.mark.parametrize(
    "name",
    [
        "calls_and_duplicates.jsonl",
        "compacted_local.jsonl",
        "compacted_remote.jsonl",
        "compacted_legacy.jsonl",
        "rollback.jsonl",
        "two_sessions.jsonl",
    ],
)
def test_every_line_is_accounted_for(name):
    path = fixture("codex", name)
    assert accounted(path, "codex") == nonblank_lines(path)
