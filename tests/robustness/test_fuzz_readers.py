"""Fuzzing every reader in ``pipeline.readers.REGISTRY`` with damaged real files.

Seeds are the readers' fixtures (and the public samples in ``$SEAM_REALWORLD_DIR`` when
present). Damage is done to bytes and to JSON trees: cuts at any byte, lost, repeated
and swapped lines (tool calls without results, results without calls, duplicate ids),
invalid UTF-8, binary lines, unknown record types, one value of the wrong type or one
id pointing nowhere (rewrites and condensations that forget unknown events).

Invariants: ``read`` never raises; it yields only Accepted / Rejected / Skipped; every
accepted rollout is a valid canonical rollout; for JSONL every non-blank line is
accounted for (records of accepted and rejected items + skipped lines). A build over
a directory of damaged files of every format accounts for every item.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.build.run import BuildConfig, run_build
from pipeline.readers import REGISTRY, Accepted, Rejected, Skipped
from pipeline.sources.canonical_io import iter_jsonl_lines
from schemas.rollout import Rollout
from tests.readers.util import FIXTURES
from tests.robustness.records import WRONG, fuzz_settings

REALWORLD = Path(os.environ["SEAM_REALWORLD_DIR"]) if os.environ.get("SEAM_REALWORLD_DIR") else None
FORMAT_OF_DIR = {
    "claude_code": "claude-code",
    "codex": "codex",
    "gemini_cli": "gemini-cli",
    "harbor_traces": "harbor-traces",
    "openhands": "openhands",
    "openai_messages": "openai-messages",
    "chat_completions": "chat-completions",
    "atif": "atif",
    "mini_swe_agent": "mini-swe-agent",
    "swe_agent": "swe-agent",
    "slime": "slime",
    "verl": "verl",
    "skyrl": "skyrl",
}


def _seeds() -> list[tuple[str, Path]]:
    seeds = []
    for root in [FIXTURES, REALWORLD]:
        if root is None or not root.is_dir():
            continue
        for p in sorted(root.rglob("*")):
            fmt = FORMAT_OF_DIR.get(p.relative_to(root).parts[0])
            if (
                fmt
                and p.is_file()
                and p.suffix in (".json", ".jsonl", ".traj")
                and p.name != "result.json"
            ):
                seeds.append((fmt, p))
    return seeds


SEEDS = _seeds()
TALLY: Counter = Counter()
FORMATS: Counter = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_tally():
    yield
    print(
        f"\nfuzzed readers: {TALLY['files']} damaged files, {TALLY['lines']} lines; per reader: {dict(FORMATS)}"
    )


def test_every_reader_has_a_seed_file():
    assert {fmt for fmt, _ in SEEDS} == set(REGISTRY)


# -- damage -----------------------------------------------------------------------------------
def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def cut(rng, data):
    return data[: rng.randrange(len(data) + 1)]


def drop_line(rng, data):
    lines = _lines(data)
    del lines[rng.randrange(len(lines))]
    return b"\n".join(lines)


def repeat_line(rng, data):
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[i])
    return b"\n".join(lines)


def swap_lines(rng, data):
    lines = _lines(data)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


def invalid_utf8(rng, data):
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf0\x28\x8c"]) + data[at:]


def binary_line(rng, data):
    lines = _lines(data)
    lines.insert(
        rng.randrange(len(lines) + 1),
        bytes(rng.randrange(1, 256) for _ in range(rng.randint(1, 64))).replace(b"\n", b""),
    )
    return b"\n".join(lines)


def unknown_record(rng, data):
    lines = _lines(data)
    record = {
        rng.choice(["type", "kind", "role", "action"]): rng.choice(
            ["mystery", "progress", "x-new-v9"]
        ),
        "payload": {"id": "u1"},
    }
    lines.insert(rng.randrange(len(lines) + 1), json.dumps(record).encode())
    return b"\n".join(lines)


def _nodes(tree, path=()):
    yield path, tree
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _nodes(v, (*path, i))


def _tree_edit(rng, tree):
    """One edit at one node: a wrong type, a deleted key, an extra key, or an id pointing nowhere."""
    parents = [(p, n) for p, n in _nodes(tree) if isinstance(n, (dict, list)) and n]
    if not parents:
        return rng.choice(WRONG)
    _, node = rng.choice(parents)
    key = rng.choice(sorted(node, key=str)) if isinstance(node, dict) else rng.randrange(len(node))
    action = rng.choice(["wrong", "delete", "extra", "ghost"])
    if action == "delete":
        del node[key]
    elif action == "extra" and isinstance(node, dict):
        node[f"x_{rng.randrange(99)}"] = rng.choice(WRONG)
    elif (
        action == "ghost" and isinstance(node[key], (str, int)) and not isinstance(node[key], bool)
    ):
        node[key] = rng.choice(["ghost-id", "toolu_unknown", 987654, -1, ""])
    else:
        node[key] = rng.choice(WRONG)
    return tree


def edit_json(rng, data):
    """A tree edit inside one JSONL line, or inside the whole document of a JSON file."""
    with contextlib.suppress(ValueError):
        return json.dumps(_tree_edit(rng, json.loads(data))).encode()
    lines = _lines(data)
    i = rng.randrange(len(lines))
    with contextlib.suppress(ValueError):
        lines[i] = json.dumps(_tree_edit(rng, json.loads(lines[i]))).encode()
    return b"\n".join(lines)


DAMAGE = (
    cut,
    drop_line,
    repeat_line,
    swap_lines,
    invalid_utf8,
    binary_line,
    unknown_record,
    edit_json,
    edit_json,
)


def read_all(fmt: str, path: Path) -> list:
    items = list(REGISTRY[fmt].read(path))
    for item in items:
        assert isinstance(item, (Accepted, Rejected, Skipped)), item
        if isinstance(item, Accepted):
            Rollout.model_validate(item.rollout.model_dump())
        if isinstance(item, Rejected):
            assert item.reason
    return items


def assert_every_line_accounted(path: Path, items: list) -> None:
    if path.suffix != ".jsonl":
        return
    records = sum(1 if isinstance(i, Skipped) else i.records for i in items)
    assert records == sum(1 for _ in iter_jsonl_lines(path)), [
        getattr(i, "reason", "") for i in items
    ]


@fuzz_settings(60)
@given(
    seed=st.sampled_from(SEEDS),
    damage=st.lists(
        st.tuples(st.sampled_from(DAMAGE), st.integers(0, 2**32)), min_size=1, max_size=3
    ),
)
def test_damaged_files_never_escape_a_reader_and_every_line_is_accounted_for(
    tmp_path_factory, seed, damage
):
    fmt, source = seed
    data = source.read_bytes()
    for fn, s in damage:
        data = fn(random.Random(s), data)
    path = tmp_path_factory.mktemp("reader") / source.name
    path.write_bytes(data)
    TALLY["files"] += 1
    TALLY["lines"] += data.count(b"\n") + 1
    FORMATS[fmt] += 1
    items = read_all(fmt, path)
    assert_every_line_accounted(path, items)


@pytest.mark.parametrize("fmt", sorted(REGISTRY))
def test_empty_binary_and_10_mb_inputs_are_rejected_or_read_by_every_reader(fmt, tmp_path):
    source = next(p for f, p in SEEDS if f == fmt)
    suffix = source.suffix
    big = {"padding": "x" * (10 << 20)}
    cases = {
        "empty": b"",
        "blank": b"\n\n   \n",
        "binary": bytes(random.Random(fmt).randrange(256) for _ in range(2048)),
        "10mb-line": source.read_bytes().rstrip(b"\n") + b"\n" + json.dumps(big).encode() + b"\n",
        "not-an-object": b"[1, 2, 3]\n",
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}{suffix}"
        path.write_bytes(data)
        TALLY["files"] += 1
        assert_every_line_accounted(path, read_all(fmt, path))


def test_a_build_over_damaged_files_of_every_format_accounts_for_every_item(tmp_path):
    rng = random.Random(11)
    src = tmp_path / "in"
    for i, (fmt, source) in enumerate(SEEDS):
        data = source.read_bytes()
        for _ in range(rng.randint(0, 2)):
            data = rng.choice(DAMAGE)(rng, data)
        (src / fmt).mkdir(parents=True, exist_ok=True)
        (src / fmt / f"{i:03d}-{source.name}").write_bytes(data)
        TALLY["files"] += 1
    result = run_build(
        BuildConfig(inputs=[str(src)], out=str(tmp_path / "out"), workers=1, progress=False)
    )
    c = result.counts
    assert c["read"] == c["accepted"] + c["quarantined"] > 0
    assert len((tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()) == c["quarantined"]


FOUND_BY_FUZZING = {
    # Regression inputs: minimal files this fuzzer found, each pinning a reader bug that is
    # now fixed.
    #
    # Two calls of one session; the second is broken: the whole rollout was rejected but
    # counted as one record, so the first line was lost (openai_messages.py, _rollout now
    # rejects with records=len(calls)). Also hit by two lines without a session id, which
    # the reader groups by their first messages.
    "chat-completions": [
        {
            "session_id": "s",
            "request": {"messages": [{"role": "user", "content": "hi"}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "a"}}]},
        },
        {
            "session_id": "s",
            "request": {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": "more"},
                ]
            },
            "response": {"choices": True},
        },
    ],
    "chat-completions-no-session": [
        {
            "request": {
                "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
            },
            "response": {"choices": [{"message": {"role": "assistant", "content": "a"}}]},
        },
        {
            "request": {
                "messages": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": "more"},
                ]
            },
            "response": {"choices": True},
        },
    ],
    # A batch line whose second row is broken: the first row had already joined its
    # rollout, so the line was both rejected and accepted, and a rollout cut to its first
    # step was accepted as whole (token_dumps.py, _TokenDumpReader.read now checks every
    # row of a line before adding any, and rejects a broken line whole).
    "skyrl": [
        {
            "prompt_token_ids": [[1, 2], "text"],
            "response_ids": [[5, 6], [8, 9]],
            "trajectory_ids": [
                {"instance_id": "i", "repetition_id": 0},
                {"instance_id": "i", "repetition_id": 0},
            ],
        },
    ],
    # The same shape for the other batch readers, which share _TokenDumpReader.read.
    "verl": [
        {
            "prompt_ids": [[1, 2], "text"],
            "response_ids": [[5, 6], [8, 9]],
            "rollout_id": ["r", "r"],
        },
    ],
    "slime": [
        {"tokens": [[1, 2, 5, 6], "text"], "response_length": [2, 2], "rollout_id": ["r", "r"]},
    ],
}


@pytest.mark.parametrize("case", sorted(FOUND_BY_FUZZING))
def test_minimal_inputs_the_fuzzer_found(case, tmp_path):
    fmt = case.split("-no-session")[0]
    path = tmp_path / "found.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in FOUND_BY_FUZZING[case]))
    items = read_all(fmt, path)
    assert_every_line_accounted(path, items)
    assert not (
        any(isinstance(i, Rejected) for i in items) and any(isinstance(i, Accepted) for i in items)
    )
