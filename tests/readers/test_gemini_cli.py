"""Gemini CLI: legacy session JSON and the JSONL upsert log with $set / $rewindTo."""

from tests.readers.util import accounted, fixture, nonblank_lines, only, read, shape


def test_legacy_session_tool_calls_carry_their_results_and_info_messages_are_skipped():
    rollouts, rejected, skipped = read("gemini-cli", fixture("gemini_cli", "legacy_session.json"))
    assert not rejected and [s.reason.split(" ")[0] for s in skipped] == ["'info'"]
    assert shape(rollouts[0]) == [
        ("user", "m1", "Create hello.txt."),
        ("assistant", "m3", "", ["write-1"]),
        ("tool", "m3:write-1", "Wrote hello.txt", "write-1"),
        ("assistant", "m4", "Created hello.txt.", []),
    ]
    assert rollouts[0].calls()[0].reasoning == "Plan: Write the file with a shell command."


def test_jsonl_log_replays_upserts_rewind_and_compression_in_order():
    rollout = only("gemini-cli", fixture("gemini_cli", "session_replay.jsonl"))
    assert shape(rollout) == [
        ("user", "u1", "List files."),
        ("assistant", "g1", "", ["ls-1"]),
        ("tool", "g1:ls-1", "a.txt", "ls-1"),
        ("assistant", "g2", "There is a.txt.", []),
        ("user", "u2", "Delete it."),
        ("assistant", "g3", "Deleting.", []),
        (
            "rewrite",
            "edit",
            "manual",
            [("keep", "u1"), ("keep", "g1"), ("keep", "g1:ls-1"), ("keep", "g2")],
        ),
        ("user", "u3", "Rename it instead."),
        (
            "rewrite",
            "compaction",
            "budget",
            [
                ("user", "s1", "<state_snapshot>files: a.txt</state_snapshot>"),
                ("assistant", "s2", "Got it. Thanks for the additional context!", []),
                ("keep", "u3"),
            ],
        ),
        ("assistant", "g4", "Renamed a.txt to b.txt.", []),
    ]


def test_every_jsonl_line_is_accounted_for():
    path = fixture("gemini_cli", "session_replay.jsonl")
    assert accounted(path, "gemini-cli") == nonblank_lines(path)
