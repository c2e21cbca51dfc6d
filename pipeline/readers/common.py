"""Helpers every reader needs: decoded file access (``.gz``/``.zst`` included, through
``canonical_io``), content flattening, deterministic ids and one-line error reasons."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from pipeline.sources import limits
from pipeline.sources.canonical_io import UNREADABLE, iter_jsonl_lines, open_text_stream, strip_bom
from pipeline.sources.canonical_io import first_json_object as _first_json_object
from pipeline.sources.canonical_io import read_head as read_head


def load_json(path: Path) -> Any:
    """A whole JSON document (decompressed, at most ``max_document_bytes``, nested at
    most ``max_depth`` levels). Raises ``ValueError`` with a short reason."""
    cap = limits.current().max_document_bytes
    try:
        with open_text_stream(path) as fh:
            data = strip_bom(fh.read(cap + 1))
    except UNREADABLE as exc:
        raise ValueError(f"cannot read the file: {type(exc).__name__}: {exc}") from None
    if len(data) > cap:
        raise ValueError(limits.over("max_document_bytes", "the JSON document"))
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    limits.check_depth(doc, data)
    return doc


def iter_json_records(path: Path) -> Iterator[tuple[int | None, dict, str | None, str]]:
    """(1-based line, object, parse error or None, raw text) per non-blank line; the
    object is empty when there is an error. A file that cannot be read to its end
    (truncated archive) ends with one error, without a line."""
    last = 0
    try:
        for line, obj, error, text in _records(path):
            last = line
            yield line, obj, error, text
    except UNREADABLE as exc:
        yield None, {}, f"cannot read past line {last}: {type(exc).__name__}: {exc}", ""


def _records(path: Path) -> Iterator[tuple[int, dict, str | None, str]]:
    for raw in iter_jsonl_lines(path):
        text = raw.data.decode("utf-8", "replace")
        if raw.error:  # over a limit
            yield raw.line, {}, raw.error, text
            continue
        try:
            obj = orjson.loads(raw.data)
        except orjson.JSONDecodeError as exc:
            parts = run_together(text)
            if parts is None:
                yield raw.line, {}, f"invalid JSON: {exc}", text
                continue
            for part, part_text in parts:  # each record of a line holding several
                if part is None:
                    yield raw.line, {}, RUN_TOGETHER_LOST, part_text
                else:
                    yield raw.line, part, _depth_error(part, part_text), part_text
            continue
        if not isinstance(obj, dict):
            yield raw.line, {}, f"expected a JSON object, got {type(obj).__name__}", text
            continue
        try:
            limits.check_depth(obj, raw.data)
        except limits.DepthError as exc:
            yield raw.line, {}, str(exc), text
            continue
        yield raw.line, obj, None, text


def _depth_error(obj: dict, text: str) -> str | None:
    try:
        limits.check_depth(obj, text.encode())
    except limits.DepthError as exc:
        return str(exc)
    return None


RUN_TOGETHER_LOST = "invalid JSON: an unreadable part of a line that holds several records"
_OBJECT_START = re.compile(r'\{\s*"')
# Object starts tried per unreadable line: bounds the work on a long bad line.
RUN_TOGETHER_TRIES = 256


def run_together(text: str) -> list[tuple[dict | None, str]] | None:
    """A line holding several records run together (two writers raced on the file, or a
    cut write followed by the next record; seen in real Claude Code snapshots): each whole
    record as ``(object, its text)``, each unreadable stretch between them as ``(None,
    its text)``. A record is a JSON object starting at an object start (``{"``) that ends
    at the end of the line or right before the next ``{`` and does not stand where the
    cut record before it expects a value (a complete object nested in a cut record is a
    value, not a record). None when the line holds fewer than two parts, or no whole
    record (plain bad JSON stays one error)."""
    decoder, line = json.JSONDecoder(), text.strip()
    parts: list[tuple[dict | None, str]] = []
    pos, found = 0, 0
    for tried, start in enumerate(m.start() for m in _OBJECT_START.finditer(line)):
        if tried >= RUN_TOGETHER_TRIES:
            break
        if start < pos:
            continue
        try:
            obj, end = decoder.raw_decode(line, start)
        except ValueError:
            continue
        if not isinstance(obj, dict) or (end < len(line) and line[end:].lstrip()[:1] != "{"):
            continue
        if _expects_value(line[pos:start]):
            continue  # a value nested in a cut record, not a record
        if line[pos:start].strip():
            parts.append((None, line[pos:start]))
        parts.append((obj, line[start:end]))
        pos, found = end, found + 1
    if line[pos:].strip():
        parts.append((None, line[pos:]))
    if found == 0 or len(parts) < 2:
        return None
    return parts


def _expects_value(fragment: str) -> bool:
    """Whether a cut record's text ends where JSON expects a value (after ``:``, ``[``, or
    ``,`` inside an array): an object there is nested in it. A record cut inside a string
    or after an object member's comma cannot hold an object next."""
    stack: list[str] = []
    last, i = "", 0
    while i < len(fragment):
        c = fragment[i]
        if c == '"':
            end = _string_end(fragment, i)
            if end is None:
                return False  # cut inside a string
            last, i = '"', end + 1
            continue
        if c in "{[":
            stack.append(c)
        elif c in "}]" and stack:
            stack.pop()
        if not c.isspace():
            last = c
        i += 1
    return last in (":", "[") or (last == "," and stack[-1:] == ["["])


def top_level_fields(text: str, names: tuple[str, ...] = ("type", "uuid")) -> dict[str, str]:
    """String fields of the outermost object of a record that does not parse (cut or
    garbled), found by a scan that skips strings and nested values: enough to tell what
    kind of record was lost (nested objects carry ``type`` fields too)."""
    found: dict[str, str] = {}
    depth, i, key = 0, 0, None
    while i < len(text) and len(found) < len(names):
        c = text[i]
        if c == '"':
            end = _string_end(text, i)
            if end is None:
                break
            value = text[i + 1 : end]
            if depth == 1 and key is None and text[end + 1 :].lstrip()[:1] == ":":
                key = value
            elif depth == 1 and key is not None:
                if key in names and "\\" not in value:
                    found[key] = value
                key = None
            i = end + 1
            continue
        if c in "{[":
            depth += 1
            if depth > 1:
                key = None  # the value is nested: not a string field
        elif c in "}]":
            depth -= 1
        elif c == "," and depth == 1:
            key = None
        i += 1
    return found


def _string_end(text: str, start: int) -> int | None:
    """The index of the quote closing the JSON string that opens at ``start``."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    return None


def first_json_object(head: bytes) -> dict | None:
    """The first line of ``head`` that is a JSON object (for ``sniff``): a byte order mark
    or a first line that does not parse does not hide the format of the file."""
    found = _first_json_object(head)
    return found[1] if found else None


def first_array_item(head: bytes) -> Any:
    """The first element of a file that is one JSON array (pretty-printed or not), decoded
    from its first bytes (for ``sniff``); None if ``head`` does not start such an array."""
    text = head.decode("utf-8", "replace").lstrip()
    if not text.startswith("["):
        return None
    try:
        item, _ = json.JSONDecoder().raw_decode(text[1:].lstrip())
    except json.JSONDecodeError:
        return None
    return item


def is_json_document(head: bytes) -> bool:
    """Whether a file is one JSON document (an array, or an object spread over several
    lines) rather than JSON Lines: its first non-blank line is not a whole JSON value,
    and no later line is a JSON object written from the first column (a JSON Lines file
    whose first record is cut or garbled stays JSON Lines; a pretty-printed document
    indents its inner objects)."""
    text = strip_bom(head).lstrip()
    if text.startswith(b"["):
        return True
    first, _, rest = text.partition(b"\n")
    try:
        orjson.loads(first)
    except orjson.JSONDecodeError:
        return (
            text.startswith(b"{")
            and first_json_object(
                b"\n".join(line for line in rest.split(b"\n") if line.startswith(b"{"))
            )
            is None
        )
    return False


def content_text(content: Any) -> str:
    """Flatten message content (a string or a list of parts) to text; images become
    ``[image]`` so their position in the conversation is not lost."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return json.dumps(content, ensure_ascii=False)
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict):
            kind = str(part.get("type", ""))
            if isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif "image" in kind:
                parts.append("[image]")
            elif part.get("content") is not None:
                parts.append(content_text(part["content"]))
    return "\n".join(parts)


def as_arguments(value: Any) -> str:
    """Tool-call arguments as the JSON string the canonical schema stores."""
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def stable_id(*parts: Any) -> str:
    """A short deterministic id from the given parts (same input, same id)."""
    digest = hashlib.sha1("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return digest[:16]


def file_digest(path: Path) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


# What malformed content raises while a reader walks it: caught per record or rollout,
# turned into a quarantine entry, never let out of ``read``.
# RecursionError: content nested deep enough to overflow a recursive walk (JSON is
# capped by ``max_depth``, but a reader may nest further while converting).
BAD_CONTENT = (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError)


def reason_of(exc: Exception) -> str:
    """One actionable line for a validation failure or a field of an unexpected shape."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")
        return f"{where}: {msg}" if where else msg
    if isinstance(exc, ValueError):
        return str(exc)
    return f"a field has an unexpected shape ({type(exc).__name__}: {exc})"


class UniqueNames:
    """Hands out ``base``, then ``base#2``, ``base#3``… so ids never collide."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def claim(self, base: object) -> str:
        base = str(base)
        name, n = base, 1
        while name in self._used:
            n += 1
            name = f"{base}#{n}"
        self._used.add(name)
        return name

    def __contains__(self, name: str) -> bool:
        return name in self._used


# Sessions spread over several files (snapshots that repeat records, slices).
REPEAT = "\x00repeat"  # raw text of a merged record that repeats an earlier one
REPEAT_REASON = "repeat of a record already read from another file of the session"
_POSITION = re.compile(r"@(\d+)")  # a record's position in a fidelity detail, until located


def merged_records(
    paths: list[Path],
    identity: Callable[[dict, str], str | None],
    per_file_repeats: bool = False,
) -> tuple[list, list[tuple[str, int | None]]]:
    """The records of one session's files as one stream, and for each position in it the
    ``(file, line)`` it came from. Files go in the order of their last, then first
    ``timestamp`` (the order given breaks ties), so slices join in session order; a record whose
    ``identity(record, raw)`` was seen before becomes ``(pos, None, REPEAT_REASON,
    REPEAT)``: a reader skips and counts it. With ``per_file_repeats``, the n-th record of
    one identity inside a file repeats only the n-th of another file (a record that truly
    occurs twice in one file is read twice). Records are ``(position, record, error,
    raw)`` like ``iter_json_records`` yields, with positions for lines (``located``
    turns them back)."""
    loaded = []
    for order, path in enumerate(paths):
        recs = list(iter_json_records(path))
        stamps = [str(r["timestamp"]) for _, r, _, _ in recs if r and r.get("timestamp")]
        # By last, then first timestamp: a later slice ends later, and a file that
        # starts with a copy of the session's first record does not sort first for it.
        loaded.append(
            (not stamps, max(stamps, default=""), min(stamps, default=""), order, path, recs)
        )
    loaded.sort(key=lambda item: item[:4])
    records: list[tuple[int, dict | None, str | None, str]] = []
    where: list[tuple[str, int | None]] = []
    seen: set[str] = set()
    for *_, path, recs in loaded:
        occurrences: dict[str, int] = {}
        for line, found, error, raw in recs:
            rec: dict | None = found
            key = identity(found, raw) if found else None
            if key is not None and per_file_repeats:
                n = occurrences[key] = occurrences.get(key, 0) + 1
                key = f"{n}\x00{key}"
            if key is not None and key in seen:
                rec, error, raw = None, REPEAT_REASON, REPEAT
            elif key is not None:
                seen.add(key)
            where.append((str(path), line))
            records.append((len(where) - 1, rec, error, raw))
    return records, where


def located(item, where: list[tuple[str, int | None]], name_file: bool):
    """A read item whose ``line`` (and the ``@position`` marks in its rollout's fidelity
    details) are positions in a ``merged_records`` stream, with its file and line."""
    from pipeline.readers import Accepted

    def place(pos: int) -> str:
        file, line = where[pos]
        return f"{file}:{line}" if name_file else f"line {line}"

    if isinstance(item, Accepted):
        rollout = item.rollout
        fidelity = [
            {**f, "detail": _POSITION.sub(lambda m: place(int(m.group(1))), str(f["detail"]))}
            for f in rollout.meta.get("fidelity") or []
        ]
        events = [_event_located(e, where, name_file) for e in rollout.events]
        update: dict[str, Any] = {"events": events}
        if fidelity:
            update["meta"] = {**rollout.meta, "fidelity": fidelity}
        item = dataclasses.replace(item, rollout=rollout.model_copy(update=update))
    if item.line is None:
        return item
    file, line = where[item.line]
    return dataclasses.replace(item, line=line, file=file if name_file else None)


def _event_located(event, where: list[tuple[str, int | None]], name_file: bool):
    """A rewrite whose ``meta.boundary_line`` is a stream position, with its file's line."""
    pos = event.meta.get("boundary_line") if event.type == "rewrite" else None
    if not isinstance(pos, int):
        return event
    file, line = where[pos]
    meta = {**event.meta, "boundary_line": line, **({"boundary_file": file} if name_file else {})}
    return event.model_copy(update={"meta": meta})
