"""Join ``seam hooks`` captures (``pipeline/hooks/claude_code.py``) to Claude Code sessions.

A capture folder holds, per hook call, a transcript snapshot (``<stamp>-<event>.jsonl``,
a session file like any other: the planner groups it with the session's other files by
``sessionId`` and the reader merges them by record ``uuid``, so records a later slice or
prune lost come back from the snapshot) and a ``.capture`` file beside it with what the
hook received. This module reads those ``.capture`` files for the files of a session and
records, on the compaction each one belongs to, ``meta.capture``: the hook's trigger,
the user's custom instructions (the text after ``/compact``), PostCompact's summary when
captured, and the snapshot's file and record count. A capture belongs to the compaction
whose ``compact_boundary`` names the snapshot's last record as its ``logicalParentUuid``
(the record right before it: Claude Code 2.1.197 runs both hooks before it writes the
boundary); a PostCompact snapshot that already holds the boundary, to its last one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pipeline.readers import Accepted, ReadItem
from schemas.rollout import RewriteEvent

CAPTURE_SUFFIX = ".capture"


def join_captures(item: ReadItem, paths: list[Path]) -> ReadItem:
    """``item`` with the captures of ``paths`` recorded on its compactions (unchanged
    when none of its files is a capture snapshot or nothing matches)."""
    if not isinstance(item, Accepted):
        return item
    captures = [c for p in paths if (c := _load(p)) is not None]
    if not captures:
        return item
    boundaries = _boundaries(paths)
    found: dict[str, dict] = {}
    for cap in captures:
        transcript = cap.get("transcript") or {}
        target = next((u for u, b in boundaries.items() if b == transcript.get("last_uuid")), None)
        if target is None and cap.get("event") == "PostCompact":
            target = transcript.get("last_boundary")
        if target is not None:
            found.setdefault(target, {}).update(_summary_of(cap))
    rollout = item.rollout
    events = [
        e.model_copy(update={"meta": {**e.meta, "capture": found[e.id]}})
        if isinstance(e, RewriteEvent) and e.id in found
        else e
        for e in rollout.events
    ]
    if events == rollout.events:
        return item
    return dataclasses.replace(item, rollout=rollout.model_copy(update={"events": events}))


def _load(path: Path) -> dict | None:
    side = path.with_suffix(CAPTURE_SUFFIX)
    if not side.is_file():
        return None
    try:
        cap = json.loads(side.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(cap, dict):
        return None
    if cap.get("event") == "PostCompact":
        cap.setdefault("transcript", {})
        cap["transcript"]["last_boundary"] = _last_boundary(path)
    return cap


def _summary_of(cap: dict) -> dict:
    """What a compaction records of a capture (PreCompact and PostCompact merged)."""
    transcript = cap.get("transcript") or {}
    kept = {
        "trigger": cap.get("trigger"),
        "custom_instructions": cap.get("custom_instructions"),
    }
    if cap.get("event") == "PostCompact":
        kept = {"compact_summary": cap.get("compact_summary")}
    else:
        kept["snapshot"] = transcript.get("file")
        kept["snapshot_records"] = transcript.get("records")
    return {k: v for k, v in kept.items() if v is not None}


def _boundaries(paths: list[Path]) -> dict[str, str | None]:
    """``compact_boundary`` uuid → its ``logicalParentUuid``, over the session's files."""
    found: dict[str, str | None] = {}
    for path in paths:
        for rec in _records(path, b"compact_boundary"):
            if rec.get("subtype") == "compact_boundary" and rec.get("uuid"):
                found[str(rec["uuid"])] = rec.get("logicalParentUuid") or rec.get("parentUuid")
    return found


def _last_boundary(path: Path) -> str | None:
    last = None
    for rec in _records(path, b"compact_boundary"):
        if rec.get("subtype") == "compact_boundary" and rec.get("uuid"):
            last = str(rec["uuid"])
    return last


def _records(path: Path, needle: bytes):
    """The JSON records of a file whose line contains ``needle`` (a cheap pre-filter)."""
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if needle in line:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(rec, dict):
                        yield rec
    except OSError:
        return
