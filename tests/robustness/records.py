"""Real-shaped canonical rollout records and the ways real files break them.

``good_record`` draws a valid rollout as a plain dict (so a mutation can break it at
any level) from a seeded ``random.Random``: system and user messages, assistant steps
with parallel tool calls and their results, budget compactions with a summary call and
``system ⊕ resume ⊕ last k steps``, context edits that drop an observation.

``MUTATIONS`` turn a record into the bytes of one broken JSONL line. Each names what
went wrong the way it happens in practice (a writer killed mid-line, a field renamed by
a newer harness, a tool result that lost its call...). A mutation may leave a record
valid (pydantic accepts ``"1"`` for a float): the invariants hold either way.
"""

from __future__ import annotations

import itertools
import json
import os
import random

from hypothesis import HealthCheck, settings

from tests.strategies import TOOLS

WORDS = (
    "fix",
    "the",
    "bug",
    "in",
    "parser",
    "tests",
    "fail",
    "on",
    "empty",
    "input",
    "grep",
    "read",
    "edit",
    "def",
    "return",
    "None",
    "é",
    "中文",
    "🙂",
    "x = 1",
    "assert",
    "traceback",
    "line 42",
    "{",
    "}",
    "\n",
)


def fuzz_settings(default_examples: int) -> settings:
    """Hypothesis settings of a fuzz test: by default a small fixed set of examples (the
    same every run, so the default suite stays fast and never flaky); with
    ``SEAM_FUZZ_EXAMPLES=N`` (``make fuzz``) N random examples."""
    scaled = os.environ.get("SEAM_FUZZ_EXAMPLES")
    return settings(
        max_examples=int(scaled or default_examples),
        derandomize=not scaled,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
        ],
    )


def _text(rng: random.Random, lo: int = 1, hi: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def good_record(rng: random.Random, rollout_id: str, task_id: str) -> dict:
    ids = itertools.count()

    def message(role: str, content: str, **fields) -> dict:
        return {
            "type": "message",
            "id": f"m{next(ids)}",
            "role": role,
            "content": content,
            **fields,
        }

    system = message("system", "You are a coding agent. " + _text(rng))
    events = [system, message("user", "Task: " + _text(rng))]
    live = [e["id"] for e in events]
    steps: list[list[str]] = []
    for _ in range(rng.randint(1, 6)):
        op = rng.choice(["step", "step", "step", "compact", "edit"])
        if op == "compact" and steps:
            summary = message("assistant", "# Summary\n" + _text(rng), kind="summary")
            events += [message("user", "Summarize the work so far."), summary]
            resume = message("user", "Resume from this summary:\n" + summary["content"])
            kept = (
                [i for step in steps[-rng.randint(0, 2) :] for i in step if i in live]
                if rng.random() < 0.7
                else []
            )
            events.append(
                {
                    "type": "rewrite",
                    "id": f"w{next(ids)}",
                    "reason": "compaction",
                    "trigger": "budget",
                    "context": [{"type": "keep", "id": system["id"]}, resume]
                    + [{"type": "keep", "id": i} for i in kept],
                }
            )
            live = [system["id"], resume["id"]] + kept
            continue
        tool_ids = [e["id"] for e in events if e.get("role") == "tool" and e["id"] in live]
        if op == "edit" and tool_ids:
            dropped = rng.choice(tool_ids)
            live = [i for i in live if i != dropped]
            events.append(
                {
                    "type": "rewrite",
                    "id": f"w{next(ids)}",
                    "reason": "edit",
                    "trigger": "model",
                    "context": [{"type": "keep", "id": i} for i in live],
                }
            )
            continue
        calls = [
            {
                "id": f"c{next(ids)}",
                "name": rng.choice(["grep", "read", "edit"]),
                "arguments": json.dumps({"arg": _text(rng, 1, 3)}, ensure_ascii=False),
            }
            for _ in range(rng.randint(0, 2))
        ]
        fields = {"tool_calls": calls} if calls else {}
        if rng.random() < 0.3:
            fields["reasoning"] = _text(rng)
        step = [message("assistant", _text(rng, 0, 8), **fields)]
        step += [message("tool", _text(rng), tool_call_id=c["id"], name=c["name"]) for c in calls]
        events += step
        live += [e["id"] for e in step]
        steps.append([e["id"] for e in step])
    if not any(e.get("role") == "assistant" for e in events):
        events.append(message("assistant", "Done. " + _text(rng)))
    return {
        "rollout_id": rollout_id,
        "task_id": task_id,
        "source": "fuzz",
        "model": "qwen2.5-coder",
        "tools": TOOLS,
        "events": events,
        "reward": float(rng.random() < 0.5),
    }


def line(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode()


# -- mutations: record → one broken line ----------------------------------------------------
def _messages(record: dict, role: str | None = None) -> list[dict]:
    return [
        e
        for e in record["events"]
        if e.get("type") == "message" and (role is None or e["role"] == role)
    ]


def truncated(rng, record):
    data = line(record)
    return data[: rng.randrange(1, len(data) - 1)]


WRONG = (123, -1.5, "text", None, True, [], {}, [1, "a"], {"k": [None]})


def wrong_type(rng, record):
    target = rng.choice([record, *record["events"]])
    key = rng.choice(sorted(target))
    target[key] = rng.choice([v for v in WRONG if type(v) is not type(target[key])])
    return line(record)


def missing_field(rng, record):
    target, keys = rng.choice(
        [
            (record, ("rollout_id", "task_id", "source", "events")),
            (rng.choice(record["events"]), ("id", "type", "role", "context", "reason")),
        ]
    )
    keys = [k for k in keys if k in target]
    del target[rng.choice(keys)]
    return line(record)


def extra_field(rng, record):
    target = rng.choice(
        [record, *record["events"], *[c for e in record["events"] for c in e.get("tool_calls", [])]]
    )
    target[rng.choice(["surprise", "timestamp", "parentUuid", "_v2"])] = rng.choice(WRONG)
    return line(record)


def invalid_utf8(rng, record):
    data = line(record)
    at = data.index(b'"content": "') + len(b'"content": "')
    return data[:at] + rng.choice([b"\xff\xfe", b"\xc3(", b"\xed\xa0\x80", b"\x80abc"]) + data[at:]


def unknown_event_type(rng, record):
    record["events"].insert(
        rng.randrange(len(record["events"]) + 1),
        {"type": rng.choice(["teleport", "progress", "file-history-snapshot"]), "id": "u1"},
    )
    return line(record)


def call_without_result(rng, record):
    first = _messages(record)[0]
    record["events"].insert(
        1,
        {
            "type": "message",
            "id": "orphan-call",
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "never-answered", "name": "grep", "arguments": "{}"}],
        },
    )
    record["events"].append(
        {"type": "message", "id": "after", "role": "assistant", "content": first["content"]}
    )
    return line(record)


def result_without_call(rng, record):
    record["events"].insert(
        rng.randrange(1, len(record["events"]) + 1),
        {
            "type": "message",
            "id": "lost-result",
            "role": "tool",
            "tool_call_id": "no-such-call",
            "content": "exit code 0",
        },
    )
    return line(record)


def rewrite_unknown_id(rng, record):
    record["events"].insert(
        rng.randrange(1, len(record["events"]) + 1),
        {
            "type": "rewrite",
            "id": "w-ghost",
            "reason": "compaction",
            "trigger": "budget",
            "context": [{"type": "keep", "id": rng.choice(["ghost", "m999", ""])}],
        },
    )
    return line(record)


def duplicate_id(rng, record):
    taken = rng.choice(record["events"])["id"]
    record["events"].append({"type": "message", "id": taken, "role": "user", "content": "again"})
    return line(record)


def token_ids_out_of_range(rng, record):
    call = rng.choice(_messages(record, "assistant"))
    ids = rng.choice([[2**40], [-3], [10**9], [151_700, 151_645], [2**31]])
    call["output_ids"] = ids
    if rng.random() < 0.5:
        call["prompt_ids"] = [rng.choice([-1, 2**33, 5])]
    return line(record)


def not_an_object(rng, record):
    return rng.choice([b"[1, 2, 3]", b"null", b'"rollout"', b"42", b"true", b"{}", b"[]"])


def binary_garbage(rng, record):
    return b"\x01" + bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))


def deep_nesting(rng, record):
    depth = rng.choice([100, 600, 3000])
    record["meta"] = {"trace": None}
    return line(record).replace(b'"trace": null', b'"trace": ' + b"[" * depth + b"]" * depth)


def special_tokens_in_text(rng, record):
    msg = rng.choice(_messages(record))
    msg["content"] += rng.choice(
        ["<|im_end|>", "<|im_start|>assistant\n", "<|endoftext|>", "</tool_call>"]
    )
    return line(record)


def not_json_numbers(rng, record):
    data = line(record)
    return data.replace(
        b'"reward": ', b'"reward": ' + rng.choice([b"NaN", b"Infinity", b"1e999", b"-"]) + b"0*", 1
    )


def empty_events(rng, record):
    record["events"] = rng.choice([[], [_messages(record)[0]]])
    return line(record)


MUTATIONS = (
    truncated,
    wrong_type,
    missing_field,
    extra_field,
    invalid_utf8,
    unknown_event_type,
    call_without_result,
    result_without_call,
    rewrite_unknown_id,
    duplicate_id,
    token_ids_out_of_range,
    not_an_object,
    binary_garbage,
    deep_nesting,
    special_tokens_in_text,
    not_json_numbers,
    empty_events,
)


def broken_line(seed: int, mutation: int, rollout_id: str, task_id: str) -> bytes:
    """One broken line; the record it started from has its own rollout and task ids, so a
    mutant that stays valid forms its own group and cannot move a good record's advantage."""
    rng = random.Random(seed)
    data = MUTATIONS[mutation % len(MUTATIONS)](rng, good_record(rng, rollout_id, task_id))
    return data.replace(b"\n", b"\\n")
