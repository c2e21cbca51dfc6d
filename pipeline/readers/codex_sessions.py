"""Codex sessions spread over several files, or several sessions in one file.

Snapshots: a session saved several times (checkpoint branches keep one ``full.jsonl`` per
checkpoint) repeats its records; copies may differ only in the fields a redacting tool
blanked or dropped, the ciphertexts (``encrypted_content`` of reasoning and compaction
items: ``"REDACTED"`` in one copy, left out in another), and in the JSON key order.
``record_identity`` is what stays: the record without its ``encrypted*`` fields, keys
sorted, the record ``timestamp`` included, so two records only match when the same thing
was written at the same moment. ``merged_records(..., per_file_repeats=True)`` pairs the
n-th occurrence of an identity in one file with the n-th in another: a record that truly
occurs twice (the same command at the same millisecond, a count written twice) stays two.

Forks: a sub-agent spawned with the parent's context (``spawn_agent`` with
``fork_context``, or a forked thread) starts its file with its own ``session_meta``
(``forked_from_id`` / ``source.subagent.thread_spawn.parent_thread_id`` naming the
parent), then the parent's ``session_meta`` and a copy of the parent's history, written
in one go when the fork is made, then its own turns. ``is_fork_copy`` says that a
``session_meta`` starts that copy; ``own_turn_start`` says where the sub-agent's first
turn begins, i.e. where the copy ends: the first turn start (``turn_context`` or a
``task_started`` / ``turn_started`` event) whose ``turn_id`` is a UUIDv7 minted at or after
the fork's own id (Codex's thread and turn ids are UUIDv7: their first 48 bits are the
creation time in ms, so the parent's turns, all older than the fork, sort before it).
Where turn ids are not UUIDv7, the first turn start recorded more than ``COPY_WINDOW_S``
after the parent's copied header (the copy is written at once; a turn of the sub-agent
needs at least one model request after it).
"""

from __future__ import annotations

import json
import re
from datetime import datetime

ENCRYPTED_PREFIX = "encrypted"
TURN_STARTS = ("task_started", "turn_started")
COPY_WINDOW_S = 1.0
_UUID7 = re.compile(r"^([0-9a-f]{8})-([0-9a-f]{4})-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _visible(value: object) -> object:
    """``value`` without its encrypted fields (at any depth)."""
    if isinstance(value, dict):
        return {k: _visible(v) for k, v in value.items() if not str(k).startswith(ENCRYPTED_PREFIX)}
    if isinstance(value, list):
        return [_visible(v) for v in value]
    return value


def record_identity(record: dict, raw: str) -> str:
    """A record's identity across snapshots: everything visible, keys sorted (the
    ``raw`` text is not used: snapshots re-serialize records)."""
    return json.dumps(_visible(record), sort_keys=True, ensure_ascii=False)


def fork_parent(meta: dict) -> str | None:
    """The parent thread a ``session_meta`` payload names, if it is a fork or sub-agent."""
    source = meta.get("source")
    spawn = (source.get("subagent") or {}) if isinstance(source, dict) else {}
    spawn = spawn.get("thread_spawn") if isinstance(spawn, dict) else None
    for value in (
        meta.get("parent_thread_id"),
        meta.get("forked_from_id"),
        spawn.get("parent_thread_id") if isinstance(spawn, dict) else None,
    ):
        if value:
            return str(value)
    return None


def is_fork_copy(fork_meta: dict, fork_records: int, copied_meta: dict) -> bool:
    """A ``session_meta`` of ``copied_meta`` read while in the session of ``fork_meta``
    (which has ``fork_records`` records so far, its header included) starts the copy of
    the parent's history: it is the parent the fork names, right after the fork's header."""
    parent = fork_parent(fork_meta)
    own = copied_meta.get("id") or copied_meta.get("session_id")
    return fork_records == 1 and parent is not None and str(own) == parent


def _uuid7_ms(value: object) -> int | None:
    match = _UUID7.match(str(value).lower()) if value else None
    return int(match.group(1) + match.group(2), 16) if match else None


def seconds(stamp: object) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def own_turn_start(fork_id: str, copy_stamp: object, record: dict) -> bool:
    """Whether ``record`` starts a turn of the fork ``fork_id`` (so the copy of the parent's
    history, whose header was written at ``copy_stamp``, ended before it)."""
    payload = record.get("payload")
    payload = payload if isinstance(payload, dict) else {}
    kind = record.get("type")
    if not (kind == "turn_context" or (kind == "event_msg" and payload.get("type") in TURN_STARTS)):
        return False
    turn, fork = _uuid7_ms(payload.get("turn_id")), _uuid7_ms(fork_id)
    if turn is not None and fork is not None:
        return turn >= fork
    start, here = seconds(copy_stamp), seconds(record.get("timestamp"))
    return start is not None and here is not None and here - start > COPY_WINDOW_S
