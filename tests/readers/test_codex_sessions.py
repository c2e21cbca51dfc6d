"""Codex sessions over several files and sessions inside one file (issue 22): snapshots of
one session merged by what the model saw (redacted ciphertexts aside), forked sub-agents
read as their own rollout with the parent's history as context, and parallel tool calls
whose outputs all reach the next call. The real files (``$SEAM_REALWORLD_NEW_DIR/codex``)
are checked too."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.readers import REGISTRY, Accepted, Rejected, Skipped
from pipeline.readers.builder import MISSING_RESULT
from pipeline.readers.codex import rollouts_from_records
from pipeline.readers.common import REPEAT_REASON
from schemas.replay import replay
from schemas.rollout import MessageEvent, Rollout
from tests.readers.util import accounted, fixture, nonblank_lines, only, shape

SNAPSHOTS = [fixture("codex", "snapshots", f"snapshot_{n}.jsonl") for n in (1, 2)]


def read_together(paths: list[Path]) -> tuple[list[Rollout], list[Rejected], list[Skipped]]:
    items = list(REGISTRY["codex"].read_files(paths))
    return (
        [i.rollout for i in items if isinstance(i, Accepted)],
        [i for i in items if isinstance(i, Rejected)],
        [i for i in items if isinstance(i, Skipped)],
    )


def _seen(m: MessageEvent) -> tuple:
    calls = tuple((c.id, c.name, c.arguments) for c in m.tool_calls)
    return m.role, m.content, m.reasoning, calls, m.tool_call_id


def as_seen(rollout: Rollout) -> list[tuple]:
    """Each call as the model saw it (its context) and what it produced, ids aside."""
    return [(tuple(_seen(m) for m in v.context), _seen(v.message)) for v in replay(rollout)]


# -- snapshots ---------------------------------------------------------------------------


def test_two_snapshots_read_together_are_exactly_the_newest_alone():
    rollouts, rejected, skipped = read_together(SNAPSHOTS)
    newest = only("codex", SNAPSHOTS[1])
    assert not rejected and len(rollouts) == 1
    assert as_seen(rollouts[0]) == as_seen(newest)
    # The older snapshot is read first; the 16 records the newer one repeats (ciphertexts
    # "REDACTED" in one, left out in the other; keys in another order) are counted.
    repeats = [s for s in skipped if s.reason == REPEAT_REASON]
    assert len(repeats) == 16 and {s.file for s in repeats} == {str(SNAPSHOTS[1])}
    assert max(s.line or 0 for s in repeats) == 16


def test_records_that_truly_repeat_stay_apart():
    """The same visible record twice in one file (two reasoning items of one response,
    written at the same millisecond, their ciphertexts redacted) stays two, and the same
    user message at two times stays two."""
    items = list(REGISTRY["codex"].read_files(SNAPSHOTS))
    (merged,) = [i for i in items if isinstance(i, Accepted)]
    alone = [i for i in REGISTRY["codex"].read(SNAPSHOTS[1]) if isinstance(i, Accepted)]
    assert merged.records == alone[0].records
    last = replay(merged.rollout)[-1].context
    assert [m.content for m in last if m.role == "user"].count("Count the Python files.") == 2


# -- the real files ----------------------------------------------------------------------

NEW = (
    Path(os.environ["SEAM_REALWORLD_NEW_DIR"]) if os.environ.get("SEAM_REALWORLD_NEW_DIR") else None
)


def _real(pattern: str) -> list[Path]:
    if NEW is None or not NEW.is_dir():
        pytest.skip("SEAM_REALWORLD_NEW_DIR is not set or is not a directory")
    return sorted(NEW.glob(f"codex/{pattern}"))


def test_real_snapshots_of_one_session_train_exactly_what_the_newest_trains():
    """Four snapshots of one real session (ciphertexts redacted in some, absent in
    others): read together they are the newest alone: the same calls, the same contexts,
    one compaction, and as many counted repeats as the older ones hold records (each is
    a prefix of the next)."""
    paths = _real("mise_*/*.jsonl")
    assert len(paths) == 4
    newest = max(paths, key=lambda p: p.stat().st_size)
    rollouts, rejected, skipped = read_together(paths)
    (alone,) = [i.rollout for i in REGISTRY["codex"].read(newest) if isinstance(i, Accepted)]
    assert not rejected and len(rollouts) == 1
    assert as_seen(rollouts[0]) == as_seen(alone)
    rewrites = [e.reason for e in rollouts[0].events if e.type == "rewrite"]
    assert rewrites == [e.reason for e in alone.events if e.type == "rewrite"] == ["compaction"]
    older = sum(len(p.read_text().splitlines()) for p in paths if p != newest)
    assert sum(s.reason == REPEAT_REASON for s in skipped) == older


# -- forked sub-agents -------------------------------------------------------------------

PARENT, FORK = "019d1000-0000-7000-8000-0000000000a1", "019d1000-0500-7000-8000-0000000000b2"


def test_a_forked_sub_agent_is_its_own_rollout_with_the_parent_history_as_context():
    path = fixture("codex", "fork_subagent.jsonl")
    rollouts, rejected, _ = read_together([path])
    assert not rejected
    (fork,) = rollouts
    assert (fork.rollout_id, fork.parent_rollout_id) == (FORK, PARENT)
    assert fork.meta["forked"] == {"from": PARENT, "copied_records": 11, "copied_messages": 6}
    # Only its own work is trained: one call with a tool call, one answer.
    assert [c.content for c in fork.calls()] == [
        "",
        "Missing cases: empty input and a trailing comma.",
    ]
    # Its first call saw its own system prompt, the parent's history as the parent left
    # it (the spawn call answered by Codex's fork notice), then its task.
    first = replay(fork)[0].context
    assert [m.role for m in first] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "user",
    ]
    assert first[0].id == "base_instructions"
    assert first[4].content == "src:\nparser.py\n\ntests:\ntest_parser.py"
    assert first[6].content.startswith("You are the newly spawned agent.")
    assert first[-1].content == "Review tests/ for missing cases"
    rewrite = next(e for e in fork.events if e.type == "rewrite")
    assert (rewrite.id, rewrite.reason, rewrite.meta["forked_from"]) == ("forked", "edit", PARENT)


def test_the_parent_and_its_fork_build_two_linked_rollouts_that_vote_together(tmp_path):
    """Both files in one RL build: no duplicate rollout id, nothing quarantined, the
    fork votes with its parent (rewards for the parent and another session of the
    task: +1 and -1; the fork gets its parent's +1 and group size 2)."""
    import pyarrow.parquet as pq

    from pipeline.cli import main

    other = fixture("codex", "calls_and_duplicates.jsonl")
    (rival,) = read_together([other])[0]
    rewards = tmp_path / "rewards.csv"
    rewards.write_text(f"rollout_id,reward,task_id\n{PARENT},1,t\n{rival.rollout_id},0,t\n")
    out = tmp_path / "out"
    paths = [str(fixture("codex", n)) for n in ("fork_parent.jsonl", "fork_subagent.jsonl")]
    args = ["build-rl", *paths, str(other), "--out", str(out), "--rewards", str(rewards)]
    assert main([*args, "--no-progress", "--workers", "1", "--verify", "none"]) == 0
    assert (out / "quarantine.jsonl").read_text() == ""
    rows = [r for shard in sorted(out.glob("*.parquet")) for r in pq.read_table(shard).to_pylist()]
    got = {
        (r["rollout_id"], r["parent_rollout_id"], round(r["advantage"], 4), r["group_size"])
        for r in rows
    }
    assert got == {
        (PARENT, None, 1.0, 2),
        (FORK, PARENT, 1.0, 2),
        (rival.rollout_id, None, -1.0, 2),
    }


def test_a_fork_without_a_call_of_its_own_says_so_truly(tmp_path):
    lines = fixture("codex", "fork_subagent.jsonl").read_text().splitlines()
    path = tmp_path / "fork.jsonl"
    path.write_text("\n".join(lines[:18]) + "\n")  # the copy and its first own records
    rollouts, rejected, _ = read_together([path])
    assert not rollouts
    assert [r.reason for r in rejected] == [
        f"session {FORK}, a fork of {PARENT}, has no model call of its own "
        "(13 records, 11 of them its copy of the parent's history)"
    ]


def test_a_fork_of_a_fork_starts_with_both_copied_histories(tmp_path):
    """The parent was itself forked from G: its copy holds G's header and history before
    its own turns; each copy ends at the first turn of the thread that copied it."""
    grand = "019d0f00-0000-7000-8000-0000000000c3"
    lines = fixture("codex", "fork_subagent.jsonl").read_text().splitlines()
    parent = json.loads(lines[1])
    parent["payload"]["forked_from_id"] = grand
    stamp = parent["timestamp"]
    nested = [
        {**parent, "payload": {**parent["payload"], "id": grand, "forked_from_id": None}},
        {
            "timestamp": stamp,
            "type": "turn_context",
            "payload": {"turn_id": "019d0f00-0100-7000-8000-000000000009"},
        },
        {
            "timestamp": stamp,
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Plan the parser."}],
            },
        },
        {
            "timestamp": stamp,
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Plan: a recursive descent parser."}],
            },
        },
    ]
    path = tmp_path / "fork.jsonl"
    path.write_text(
        "\n".join([lines[0], json.dumps(parent), *map(json.dumps, nested), *lines[2:]]) + "\n"
    )
    (fork,) = read_together([path])[0]
    assert [c.content for c in fork.calls()][
        -1
    ] == "Missing cases: empty input and a trailing comma."
    assert len(fork.calls()) == 2
    first = [m.content for m in replay(fork)[0].context]
    assert first[1:3] == ["Plan the parser.", "Plan: a recursive descent parser."]
    assert first[-1] == "Review tests/ for missing cases"


@pytest.mark.parametrize(
    ("turn_id", "stamp", "own"),
    [
        ("019d1000-0600-7000-8000-000000000002", "2026-04-01T12:00:20.002Z", True),
        ("019d1000-0100-7000-8000-000000000001", "2026-04-01T12:09:00.000Z", False),
        # Turn ids that are not UUIDv7: the copy is the burst written at the fork.
        ("3", "2026-04-01T12:00:20.900Z", False),
        ("3", "2026-04-01T12:00:21.500Z", True),
        (None, "not a time", False),
    ],
)
def test_the_copy_ends_at_the_first_turn_the_fork_started_itself(turn_id, stamp, own):
    from pipeline.readers.codex_sessions import own_turn_start

    start = {"timestamp": stamp, "type": "turn_context", "payload": {"turn_id": turn_id}}
    assert own_turn_start(FORK, "2026-04-01T12:00:20.001Z", start) is own
    event = {"timestamp": stamp, "type": "event_msg", "payload": {"type": "task_started"}}
    event["payload"]["turn_id"] = turn_id
    assert own_turn_start(FORK, "2026-04-01T12:00:20.001Z", event) is own
    message = {"timestamp": stamp, "type": "response_item", "payload": {"turn_id": turn_id}}
    assert own_turn_start(FORK, "2026-04-01T12:00:20.001Z", message) is False


def test_real_forked_sub_agent_trains_only_its_own_calls_and_states_no_untrue_reason():
    """A real sub-agent forked from its parent (0.118): before, its header made an empty
    session quarantined as "has no model call" and the copied history a second rollout
    of the parent. Now: one rollout, linked to the parent, nothing rejected, and its calls
    are exactly the model calls written after the copy (an independent split: the copy
    is written within a second of the file's first record)."""
    (path,) = _real("git-sync_*.jsonl")
    items = list(REGISTRY["codex"].read(path))
    assert not [i for i in items if isinstance(i, Rejected)]
    (accepted,) = [i for i in items if isinstance(i, Accepted)]
    fork = accepted.rollout
    header = json.loads(path.read_text().splitlines()[0])
    assert fork.rollout_id == header["payload"]["id"]
    assert fork.parent_rollout_id == header["payload"]["forked_from_id"]
    start = datetime.fromisoformat(header["timestamp"].replace("Z", "+00:00"))
    own, copied = set(), set()
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        kind = rec["payload"].get("type") if rec["type"] == "response_item" else None
        if kind in ("function_call", "custom_tool_call"):
            at = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00"))
            (own if (at - start).total_seconds() > 1 else copied).add(rec["payload"]["call_id"])
    # (a web search has no call id in the log: seam names it after its line)
    trained = {t.id for c in fork.calls() for t in c.tool_calls if "@" not in t.id}
    assert trained == own and copied and not trained & copied
    assert len(fork.calls()) == 33
    # The parent's web search in the copied history still says its results are unknown.
    searches = [f for f in fork.meta["fidelity"] if f["reason"] == "opaque_tool_result"]
    assert len(searches) == 2
    assert sum(i.records if not isinstance(i, Skipped) else 1 for i in items) == len(
        path.read_text().splitlines()
    )


def test_a_call_the_copy_left_unanswered_gets_the_placeholder_codex_sends(tmp_path):
    lines = fixture("codex", "fork_subagent.jsonl").read_text().splitlines()
    path = tmp_path / "fork.jsonl"
    path.write_text("\n".join(lines[:15] + lines[16:]) + "\n")  # no output for the spawn
    (fork,) = read_together([path])[0]
    first = replay(fork)[0].context
    assert [(m.role, m.content) for m in first[5:7]] == [
        ("assistant", "Spawning a reviewer for the tests while I read the parser."),
        ("tool", MISSING_RESULT),
    ]


def test_a_parent_header_repeated_inside_the_copy_continues_the_copy(tmp_path):
    """Codex Desktop writes a session's header again on each resumed turn; a copy of such
    a history holds it too, and the copy goes on."""
    lines = fixture("codex", "fork_subagent.jsonl").read_text().splitlines()
    path = tmp_path / "fork.jsonl"
    path.write_text("\n".join(lines[:9] + [lines[1]] + lines[9:]) + "\n")
    (fork,) = read_together([path])[0]
    (alone,) = read_together([fixture("codex", "fork_subagent.jsonl")])[0]
    assert as_seen(fork) == as_seen(alone)
    assert fork.meta["forked"]["copied_records"] == alone.meta["forked"]["copied_records"] + 1


def test_another_session_after_the_copy_ends_it(tmp_path):
    lines = fixture("codex", "fork_subagent.jsonl").read_text().splitlines()
    # Another session, later: its turn start must not be taken for the fork's own.
    other = [
        line.replace("2026-02-23T12:00:", "2026-04-01T12:05:")
        for line in fixture("codex", "two_sessions.jsonl").read_text().splitlines()[:5]
    ]
    path = tmp_path / "fork.jsonl"
    path.write_text("\n".join(lines[:15] + other) + "\n")
    rollouts, rejected, _ = read_together([path])
    assert [r.rollout_id for r in rollouts] == ["019c8a70-0000-7000-8000-00000000c0de"]
    assert [r.reason.split(",")[1] for r in rejected] == [f" a fork of {PARENT}"]


# -- parallel tool calls -----------------------------------------------------------------


def test_interleaved_outputs_of_one_response_are_one_call_whose_outputs_all_reach_the_next():
    """Codex 0.46 writes a response's token count, then its items with each call's
    output right after the call: three parallel calls are one call of the model, and
    the next call sees all three outputs, in call order (flagged: the log had them
    between the calls)."""
    rollout = only("codex", fixture("codex", "parallel_interleaved.jsonl"))
    assert shape(rollout)[3:8] == [
        ("assistant", "L10", "", ["call_cfg", "call_log", "call_git"]),
        ("tool", "L12", "[tool:pytest]\naddopts = -q", "call_cfg"),
        ("tool", "L15", "FAILED tests/test_io.py::test_read", "call_log"),
        ("tool", "L17", " M io.py", "call_git"),
        ("assistant", "L21", "Reading the failing test.", ["call_test"]),
    ]
    first = rollout.calls()[0]
    assert first.reasoning == "Look at the config and the log\n\nAnd the state of the tree"
    after = replay(rollout)[1].context
    assert [m.tool_call_id for m in after if m.role == "tool"] == [
        "call_cfg",
        "call_log",
        "call_git",
    ]
    assert [f for f in rollout.meta["fidelity"] if f["reason"] == "interleaved_tool_outputs"] == [
        {
            "reason": "interleaved_tool_outputs",
            "event_id": "L12",
            "detail": "3 tool outputs written between the calls of one response; "
            "the context has them after its calls",
        }
    ]
    assert "synthesized_tool_results" not in rollout.meta


def test_a_count_written_before_its_response_is_that_response_s():
    """Codex 0.46 streams a response's text as events, writes the response's count, then
    its items: a message announced before a count and written after it shows the order,
    and each call gets the count written before it (not the next one)."""
    rollout = only("codex", fixture("codex", "parallel_interleaved.jsonl"))
    assert [c.meta.get("reported_input_tokens") for c in rollout.calls()] == [1000, 1400, 1700]


def test_the_same_text_in_two_responses_does_not_reorder_their_counts():
    """Newer Codex announces a message (an event) next to its item, both before the count:
    two responses saying the same thing keep their own counts."""
    records = [
        _record(0, "session_meta", {"id": "019a3000-0000-7000-8000-000000000002"}),
        _record(0, "response_item", {"type": "message", "role": "user", "content": "Go."}),
    ]
    for n in (1, 2):
        text = [{"type": "output_text", "text": "Working on it."}]
        records.append(
            _record(10 * n, "event_msg", {"type": "agent_message", "message": "Working on it."})
        )
        records.append(
            _record(
                10 * n, "response_item", {"type": "message", "role": "assistant", "content": text}
            )
        )
        records.append(_count(10 * n + 1, n))
    rows = [(i + 1, r, None, json.dumps(r)) for i, r in enumerate(records)]
    (rollout,) = [i.rollout for i in rollouts_from_records(rows, "x") if isinstance(i, Accepted)]
    assert [c.meta.get("reported_input_tokens") for c in rollout.calls()] == [1000, 2000]


@pytest.mark.parametrize(
    "rewrite",
    [
        ("event_msg", {"type": "thread_rolled_back", "num_turns": 1}),
        ("compacted", {"message": "", "replacement_history": []}),
    ],
)
def test_a_count_after_a_rewrite_is_the_next_call_s_alone(rewrite):
    """An interrupted response gets no count; after a rollback or a compaction, the next
    response's count is its own (not shared with the interrupted one, so not dropped)."""
    say = [{"type": "output_text", "text": "Partial."}]
    records = [
        _record(0, "session_meta", {"id": "019a3000-0000-7000-8000-000000000003"}),
        _record(1, "response_item", {"type": "message", "role": "user", "content": "Go."}),
        _record(2, "response_item", {"type": "message", "role": "assistant", "content": say}),
        _record(3, *rewrite),
        _record(4, "response_item", {"type": "message", "role": "user", "content": "Again."}),
        _record(5, "response_item", {"type": "message", "role": "assistant", "content": say}),
        _count(6, 1),
    ]
    rows = [(i + 1, r, None, json.dumps(r)) for i, r in enumerate(records)]
    (rollout,) = [i.rollout for i in rollouts_from_records(rows, "x") if isinstance(i, Accepted)]
    assert [c.meta.get("reported_input_tokens") for c in rollout.calls()] == [None, 1000]


def test_outputs_written_after_the_response_follow_it_and_a_retried_response_stays_apart():
    """Newer Codex: the calls, an approval notice while they run, the outputs, then the
    count. A response retried after a dropped stream (no count, written seconds after the
    output it saw) is a call of its own."""
    rollout = only("codex", fixture("codex", "parallel_batched.jsonl"))
    assert [[c.id for c in call.tool_calls] for call in rollout.calls()] == [
        ["call_api", "call_db"],
        [],
        ["call_restart"],
        ["call_status"],
        [],
    ]
    after = replay(rollout)[1].context
    assert [m.id for m in after[-4:]] == ["L7", "L10", "L11", "L12"]
    assert "interleaved_tool_outputs" not in {f["reason"] for f in rollout.meta["fidelity"]}
    # (the count after the retry covers two calls since the last count: not given to either)
    assert [c.meta.get("reported_input_tokens") for c in rollout.calls()] == [
        3000, 3300, None, None, 3900,
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["parallel_interleaved.jsonl", "parallel_batched.jsonl"])
def test_every_line_of_the_parallel_fixtures_is_accounted_for(name):
    path = fixture("codex", name)
    assert accounted(path, "codex") == nonblank_lines(path)


def _record(at: float, kind: str, payload: dict) -> dict:
    stamp = datetime.fromtimestamp(1_760_000_000 + at, tz=timezone.utc)
    return {"timestamp": stamp.isoformat(timespec="milliseconds"), "type": kind, "payload": payload}


def _count(at: float, n: int) -> dict:
    usage = {"input_tokens": 1000 * n, "output_tokens": 10}
    info = {"last_token_usage": usage, "total_token_usage": {**usage, "n": n}}
    return _record(at, "event_msg", {"type": "token_count", "info": info})


@st.composite
def parallel_sessions(draw):
    """A session of responses with 1-4 calls each, recorded the old way (count first,
    then each call followed by its output, all at once) or the new way (items as they
    come, outputs after the response, then the count; a dropped stream leaves the count
    out), reasoning items between some calls."""
    old = draw(st.booleans())
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    think = draw(st.lists(st.booleans(), min_size=20, max_size=20))
    dropped = draw(st.lists(st.booleans(), min_size=5, max_size=5))
    meta = {"id": "019a3000-0000-7000-8000-000000000001", "cli_version": "0.46.0"}
    records = [
        _record(0, "session_meta", meta),
        _record(0, "response_item", {"type": "message", "role": "user", "content": "Go."}),
        _record(0, "turn_context", {"model": "gpt-5-codex"}),
        _record(0.1, "event_msg", {"type": "token_count", "info": None}),
    ]

    def item(at, kind, **fields):
        records.append(_record(at, "response_item", {"type": kind, **fields}))

    for r, size in enumerate(sizes):
        t = 10.0 * (r + 1)
        if old:
            records.append(_count(t, r + 1))
        for j in range(size):
            call_id = f"c{r}_{j}"
            if think[(r * 4 + j) % 20]:
                item(t if old else t + 0.1 * j, "reasoning", summary=[], content=None)
            arguments = json.dumps({"cmd": f"step {r} {j}"})
            item(
                t if old else t + 0.1 * j + 0.05,
                "function_call",
                call_id=call_id,
                name="sh",
                arguments=arguments,
            )
            if old:
                item(t, "function_call_output", call_id=call_id, output=f"out {r} {j}")
        if not old:
            for j in range(size):
                item(
                    t + 2 + 0.1 * j,
                    "function_call_output",
                    call_id=f"c{r}_{j}",
                    output=f"out {r} {j}",
                )
            if not dropped[r]:
                records.append(_count(t + 3, r + 1))
    end = 10.0 * (len(sizes) + 1)
    if old:
        records.append(_count(end, len(sizes) + 1))
    item(end, "message", role="assistant", content=[{"type": "output_text", "text": "Done."}])
    return old, sizes, records


@settings(max_examples=60, deadline=None)
@given(parallel_sessions())
def test_every_output_of_a_response_reaches_the_next_call_in_call_order(case):
    """Property: whichever way Codex recorded a response's parallel calls, each response
    is one call with exactly its calls, and the next call sees all of its outputs right
    after it, in call order; only the interleaved recording is flagged."""
    old, sizes, records = case
    rows = [(i + 1, r, None, json.dumps(r)) for i, r in enumerate(records)]
    (rollout,) = [i.rollout for i in rollouts_from_records(rows, "x") if isinstance(i, Accepted)]
    views = replay(rollout)
    assert len(views) == len(sizes) + 1
    for r, size in enumerate(sizes):
        call = views[r].message
        assert [c.id for c in call.tool_calls] == [f"c{r}_{j}" for j in range(size)]
        context = views[r + 1].context
        at = [m.id for m in context].index(call.id)
        following = context[at + 1 : at + 1 + size]
        assert [(m.tool_call_id, m.content) for m in following] == [
            (f"c{r}_{j}", f"out {r} {j}") for j in range(size)
        ]
    flagged = "interleaved_tool_outputs" in {f["reason"] for f in rollout.meta["fidelity"]}
    assert flagged == (old and max(sizes) > 1)
    assert "synthesized_tool_results" not in rollout.meta


def test_without_token_counts_outputs_between_calls_end_the_call(tmp_path):
    """A log without any token count cannot tell one response whose outputs were written
    between its calls from calls that each saw the outputs before them: it is read the
    second way, as before (a record per call, nothing flagged)."""
    lines = fixture("codex", "parallel_interleaved.jsonl").read_text().splitlines()
    path = tmp_path / "no_counts.jsonl"
    path.write_text("\n".join(line for line in lines if "token_count" not in line) + "\n")
    rollout = only("codex", path)
    assert [[c.id for c in call.tool_calls] for call in rollout.calls()] == [
        ["call_cfg"],
        ["call_log"],
        ["call_git"],
        ["call_test"],
        [],
    ]
    assert "interleaved_tool_outputs" not in {f["reason"] for f in rollout.meta["fidelity"]}
