"""Helpers every reader needs: decoded file access (``.gz``/``.zst`` included, through
``canonical_io``), content flattening, deterministic ids and one-line error reasons."""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import zstandard
from pydantic import ValidationError

from pipeline.canonical_io import iter_jsonl_lines, open_text_stream

# What reading a damaged or truncated (compressed) file raises.
UNREADABLE = (OSError, EOFError, zlib.error, zstandard.ZstdError)


def read_head(path: Path, size: int = 1 << 16) -> bytes:
    """The first ``size`` bytes of a file, decompressed (``.gz``/``.zst``)."""
    with open_text_stream(path) as fh:
        return fh.read(size)


def load_json(path: Path) -> Any:
    """A whole JSON document (decompressed). Raises ``ValueError`` with a short reason."""
    try:
        with open_text_stream(path) as fh:
            data = fh.read()
    except UNREADABLE as exc:
        raise ValueError(f"cannot read the file: {type(exc).__name__}: {exc}") from None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None


def iter_json_records(path: Path) -> Iterator[tuple[int | None, dict | None, str | None, str]]:
    """(1-based line, object or None, parse error or None, raw text) per non-blank line;
    a file that cannot be read to its end (truncated archive) ends with one error."""
    last = 0
    try:
        for line, obj, error, text in _records(path):
            last = line
            yield line, obj, error, text
    except UNREADABLE as exc:
        yield None, None, f"cannot read past line {last}: {type(exc).__name__}: {exc}", ""


def _records(path: Path) -> Iterator[tuple[int, dict | None, str | None, str]]:
    for raw in iter_jsonl_lines(path):
        text = raw.data.decode("utf-8", "replace")
        try:
            obj = orjson.loads(raw.data)
        except orjson.JSONDecodeError as exc:
            yield raw.line, None, f"invalid JSON: {exc}", text
            continue
        if not isinstance(obj, dict):
            yield raw.line, None, f"expected a JSON object, got {type(obj).__name__}", text
            continue
        yield raw.line, obj, None, text


def first_json_object(head: bytes) -> dict | None:
    """The first line of ``head`` as a JSON object, if it parses (for ``sniff``)."""
    line = head.split(b"\n", 1)[0].strip()
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


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
    lines) rather than JSON Lines: its first non-blank line is not a whole JSON value."""
    text = head.lstrip()
    if text.startswith(b"["):
        return True
    try:
        orjson.loads(text.split(b"\n", 1)[0])
    except orjson.JSONDecodeError:
        return text.startswith(b"{")
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
BAD_CONTENT = (ValueError, TypeError, AttributeError, KeyError, IndexError)


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
