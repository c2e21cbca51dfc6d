"""Read and write a JSON document someone else owns without changing what it says.

``json.loads`` turns every number into a Python ``int`` or ``float``: ``1e400`` becomes
``inf`` and ``json.dumps`` writes it back as ``Infinity``, which is not JSON (RFC 8259
§6 has no literal for it), and ``1E5`` comes back as ``100000.0``. Here each number keeps
the exact text it was written with (``Number``), so a rewrite changes no value the
caller did not change (the layout does change: ``dumps`` indents by two spaces). What ``json.loads`` accepts but JSON does not (``NaN``, ``Infinity``,
``-Infinity``) and what it silently resolves (a key given twice: the last one wins) are
refused with ``JSONError`` instead, since writing the document back would lose
information.

``dumps`` writes the layout ``json.dumps(value, indent=2, ensure_ascii=False)`` writes.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.common.errors import SeamError


class JSONError(SeamError, ValueError):
    """Text that is not a JSON document this module can rewrite exactly."""


class Number:
    """A JSON number, kept as the text it was written with (``1e400``, ``1E5``, ``-0``).
    Equal to another ``Number`` of the same text, and to nothing else (not to the
    Python number: ``1e400`` is no float)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Number) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Number({self.text!r})"


def loads(text: str) -> Any:
    """Parse ``text``: objects are dicts (keys unique), arrays lists, numbers ``Number``."""
    try:
        return json.loads(
            text,
            parse_float=Number,
            parse_int=Number,
            parse_constant=_refuse_constant,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        raise JSONError(str(exc)) from None


def dumps(value: Any, indent: int = 2) -> str:
    """The JSON text of ``value`` (dicts, lists, str, bool, None, ``Number``, int)."""
    return _dump(value, indent, 0)


def _dump(value: Any, indent: int, depth: int) -> str:
    if isinstance(value, Number):
        return value.text
    if value is None or isinstance(value, (bool, int, str)):
        return json.dumps(value, ensure_ascii=False)
    pad, inner = " " * (indent * depth), " " * (indent * (depth + 1))
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = (
            f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {_dump(v, indent, depth + 1)}"
            for k, v in value.items()
        )
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        return (
            "[\n" + ",\n".join(f"{inner}{_dump(v, indent, depth + 1)}" for v in value) + f"\n{pad}]"
        )
    raise TypeError(f"cannot write {type(value).__name__} as exact JSON")


def _refuse_constant(name: str) -> Any:
    raise JSONError(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise JSONError(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out
