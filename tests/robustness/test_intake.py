"""One way in (``pipeline/sources/intake.py``): one bad record never costs its neighbours. A byte
order mark or a first line that does not parse leaves a file's format and its records
as they are; a record nested too deep, over a size limit or in a file whose quarantine
would explode is quarantined alone, with the limit named."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import orjson
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.sources.canonical_io import parse_rollout
from pipeline.sources.files import Task, detect_input_format
from pipeline.sources.intake import (
    ACCEPTED,
    QUARANTINED,
    check_message_sizes,
    could_hold_a_message_over_the_limit,
    iter_records,
)
from pipeline.sources.limits import MIB, Limits, in_force
from pipeline.sources.read_context import ReadContext
from tests.robustness.records import good_record, line

FIXTURES = Path(__file__).parents[1] / "fixtures" / "raw"
# One JSONL file of every line-based format the issue found losing whole files.
JSONL_FILES = [
    "codex/compacted_local.jsonl",
    "openai_messages/conversations.jsonl",
    "chat_completions/gateway_log.jsonl",
    "openhands/v1_events.jsonl",
    "slime/samples.jsonl",
    "verl/agent_loop_outputs.jsonl",
    "skyrl/generator_output.jsonl",
    "claude_code/compact_auto.jsonl",
]
DOCUMENTS = ["openhands/v0_condensation.json", "swe_agent/function_calling.traj"]


def _canonical(path: Path, n: int = 5) -> Path:
    rng = random.Random(1)
    path.write_bytes(b"".join(line(good_record(rng, f"r{i}", "t")) + b"\n" for i in range(n)))
    return path


def _read(
    path: Path, fmt: str | None = None, limits: Limits | None = None
) -> tuple[str, list, list]:
    fmt = fmt or detect_input_format(path)
    records = list(iter_records(Task(0, str(path), fmt), context=ReadContext(limits or Limits())))
    # (line, events): some readers derive ids from the file's bytes, which a BOM changes
    accepted = [(r.line, len(r.rollout.events)) for r in records if r.kind == ACCEPTED]
    quarantined = [(r.line, r.reason) for r in records if r.kind == QUARANTINED]
    return fmt, accepted, quarantined


def _variants(tmp_path: Path) -> list[Path]:
    files = [_canonical(tmp_path / "canonical.jsonl")]
    for name in JSONL_FILES + DOCUMENTS:
        target = tmp_path / name.replace("/", "__")
        target.write_bytes((FIXTURES / name).read_bytes())
        files.append(target)
    return files


def test_a_byte_order_mark_changes_nothing(tmp_path):
    for path in _variants(tmp_path):
        before = _read(path)
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
        assert _read(path) == before, path.name
        assert before[1], path.name  # the file has rollouts to lose


@pytest.mark.parametrize("bad", [b"not json at all", b'{"cut": "off', b"\x00\x01binary"])
def test_a_bad_first_line_costs_only_itself(tmp_path, bad):
    for path in _variants(tmp_path):
        if path.suffix in (".json", ".traj"):
            continue  # one document per file: no first line of its own
        fmt, accepted, quarantined = _read(path)
        path.write_bytes(bad + b"\n" + path.read_bytes())
        fmt2, accepted2, quarantined2 = _read(path)
        assert fmt2 == fmt, path.name
        assert [n for _, n in accepted2] == [n for _, n in accepted], path.name
        assert quarantined2[0][0] == 1 and len(quarantined2) == len(quarantined) + 1, path.name


def _deep(levels: int) -> str:
    """JSON text nested ``levels`` times (as text: Python's own encoder would overflow)."""
    return '[{"type": "text", "content": ' * levels + '"x"' + "}]" * levels


def test_deep_nesting_in_one_record_quarantines_that_record_only(tmp_path):
    # Codex: a record nested deep used to turn the whole session into one RecursionError
    # entry (600 levels here: orjson itself refuses past 1024, with a reason of its own).
    src = (FIXTURES / "codex" / "two_sessions.jsonl").read_text().splitlines()
    _, accepted, _ = _read(FIXTURES / "codex" / "two_sessions.jsonl")
    deep = (
        '{"timestamp": "2026-01-01T00:00:00Z", "type": "event_msg", "payload": ' + _deep(300) + "}"
    )
    path = tmp_path / "codex.jsonl"
    path.write_text("\n".join([src[0], deep, *src[1:]]) + "\n")
    fmt, accepted2, quarantined = _read(path)
    assert fmt == "codex" and [r for _, r in accepted2] == [r for _, r in accepted]
    assert quarantined == [(2, quarantined[0][1])] and "max_depth" in quarantined[0][1]
    # Canonical: the deep record goes, its neighbours stay.
    canonical = _canonical(tmp_path / "c.jsonl", 3)
    rows = canonical.read_bytes().splitlines()
    rows[1] = rows[1][:-1] + b', "meta": {"deep": ' + _deep(1000).encode() + b"}}"
    canonical.write_bytes(b"\n".join(rows) + b"\n")
    _, accepted, quarantined = _read(canonical)
    assert [where for where, _ in accepted] == [1, 3]
    assert quarantined[0][0] == 2 and "depth" in quarantined[0][1]


def test_a_line_over_the_limit_is_quarantined_naming_it_and_never_held(tmp_path):
    small = Limits(max_line_bytes=MIB)
    path = _canonical(tmp_path / "c.jsonl", 3)
    rows = path.read_bytes().splitlines()
    rows.insert(1, b'{"rollout_id": "huge", "pad": "' + b"a" * (3 * MIB) + b'"}')
    for name, compress in (
        ("c.jsonl", bytes),
        ("c.jsonl.gz", gzip.compress),
        ("c.jsonl.zst", zstandard.compress),
    ):
        target = tmp_path / name
        target.write_bytes(compress(b"\n".join(rows) + b"\n"))
        _, accepted, quarantined = _read(target, "canonical", small)
        assert [where for where, _ in accepted] == [1, 3, 4], name
        ((where, reason),) = quarantined
        assert where == 2 and "max_line_bytes limit (1 MiB; raise it with --max-line-mb)" in reason


def test_decompressed_size_and_message_size_limits_name_themselves(tmp_path):
    path = _canonical(tmp_path / "c.jsonl", 40)
    bomb = tmp_path / "c.jsonl.zst"
    bomb.write_bytes(zstandard.compress(path.read_bytes()))
    half = Limits(max_decompressed_bytes=len(path.read_bytes()) // 2)
    _, accepted, quarantined = _read(bomb, "canonical", half)
    assert 0 < len(accepted) < 40 and "max_decompressed_bytes" in quarantined[-1][1]
    _, accepted, quarantined = _read(path, None, Limits(max_message_bytes=64))
    assert len(accepted) + len(quarantined) == 40 and quarantined
    assert all("max_message_bytes" in reason for _, reason in quarantined)


def test_keep_passes_over_the_canonical_records_it_rejects_unparsed(tmp_path):
    rng = random.Random(7)
    path = tmp_path / "in.jsonl"
    records = [line(good_record(rng, f"r{i}", "t")) for i in range(3)]
    path.write_bytes(b"\n".join([records[0], b"{not json", records[1], records[2]]) + b"\n")
    seen: list[bytes] = []

    def keep(data: bytes) -> bool:
        seen.append(data)
        return b'"r1"' in data

    read = list(iter_records(Task(0, str(path), "canonical"), keep=keep))
    assert [(r.kind, r.line) for r in read] == [(ACCEPTED, 3)]
    assert [r.rollout.rollout_id for r in read if r.rollout] == ["r1"]
    assert len(seen) == 4  # every line was offered to ``keep``, the rejected ones never parsed


def _one_message_record(text: str, arguments: str = "{}", reasoning: bool = True) -> dict:
    assistant = {"type": "message", "id": "a", "role": "assistant", "content": text}
    if reasoning:
        assistant["reasoning"] = text
    assistant["tool_calls"] = [{"id": "c", "name": "bash", "arguments": arguments}]
    return {
        "rollout_id": "r",
        "task_id": "t",
        "source": "test",
        "events": [{"type": "message", "id": "u", "role": "user", "content": "go"}, assistant],
        "reward": 1.0,
    }


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), st.booleans())
def test_no_message_of_a_record_holds_more_characters_than_the_record_has_bytes(
    text, arguments, ascii_escapes
):
    """What lets intake skip the message-size check of a record no longer than the limit
    (``could_hold_a_message_over_the_limit``): any text, written as orjson writes it or
    with every non-ASCII character a ``\\u`` escape, takes at least a byte per character."""
    obj = _one_message_record(text, arguments)
    record = json.dumps(obj, ensure_ascii=True).encode() if ascii_escapes else orjson.dumps(obj)
    size = 2 * len(text) + len(arguments)  # the assistant message's, as the check counts it
    for cap in (size - 1, size):  # a limit the message is just over, one it just fits
        with in_force(Limits(max_message_bytes=max(cap, 1))):
            if not could_hold_a_message_over_the_limit(record):
                check_message_sizes(parse_rollout(record))  # must not raise


def test_a_message_one_character_over_the_limit_is_quarantined_in_a_record_barely_longer(
    tmp_path,
):
    """The skip leaves no record out that holds a message over the limit: here the record
    is a few hundred bytes longer than its one large message."""
    cap = 4096
    for size, fate in ((cap, ACCEPTED), (cap + 1, QUARANTINED)):
        record = orjson.dumps(_one_message_record("x" * size, "", reasoning=False))
        assert len(record) < cap + 400
        path = tmp_path / f"{size}.jsonl"
        path.write_bytes(record + b"\n")
        _, accepted, quarantined = _read(path, "canonical", Limits(max_message_bytes=cap))
        assert len(accepted if fate == ACCEPTED else quarantined) == 1
        assert all("max_message_bytes" in reason for _, reason in quarantined)
