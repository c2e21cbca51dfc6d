"""Gemini CLI chat recordings: the legacy single JSON (``{sessionId, messages[]}``) and
the JSONL log (``~/.gemini/tmp/<hash>/chats/session-*.jsonl``).

The JSONL file is an upsert log, replayed in order the way Gemini CLI does: a header
line; message lines, where a repeated ``id`` replaces the earlier version (tool calls,
results and token counts are filled in that way, so the last version is the truth);
``{"$set": {...}}`` patches, where ``messages`` replaces the whole list (this is how
compression and aborted-turn rollbacks are stored); ``{"$rewindTo": id}``, which drops
that message and everything after it (an unknown id clears the list).

A ``$set`` that keeps a prefix of the list is an ``edit`` rewrite; any other is a
``compaction`` (messages still present kept by id, new ones inserted). ``$rewindTo`` is
an ``edit``. A ``gemini`` message is a call whose ``toolCalls`` carry their own results
(they become tool messages right after it); ``info`` / ``error`` / ``warning`` messages
are shown to the user, not sent to the model, and are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.readers import Accepted, Reader, ReadItem, Rejected, Skipped, register
from pipeline.readers.builder import Msg, RolloutBuilder, msg
from pipeline.readers.common import (
    BAD_CONTENT,
    content_text,
    first_json_object,
    iter_json_records,
    load_json,
    reason_of,
)
from schemas.rollout import Keep

CONVERSATION_TYPES = {"user", "gemini"}


def _messages(rec: dict) -> list[Msg]:
    """One recorded message as canonical messages (a call plus its tool results)."""
    mid = str(rec["id"])
    if rec.get("type") == "user":
        return [msg("user", content_text(rec.get("content")), id=mid)]
    calls, results = [], []
    for i, call in enumerate(rec.get("toolCalls") or []):
        call_id = str(call.get("id") or f"{mid}:call{i}")
        calls.append({"id": call_id, "name": call.get("name"), "arguments": call.get("args")})
        for part in call.get("result") or []:
            response = (
                (part.get("functionResponse") or {}).get("response")
                if isinstance(part, dict)
                else None
            )
            if response is not None:
                output = response.get("output") if isinstance(response, dict) else None
                body = (
                    output if isinstance(output, str) else json.dumps(response, ensure_ascii=False)
                )
                results.append(
                    msg(
                        "tool",
                        body,
                        id=f"{mid}:{call_id}",
                        tool_call_id=call_id,
                        name=call.get("name"),
                        meta={"status": call.get("status")} if call.get("status") else None,
                    )
                )
    thoughts = "\n\n".join(
        f"{t.get('subject', '')}: {t.get('description', '')}".strip(": ")
        for t in rec.get("thoughts") or []
        if isinstance(t, dict)
    )
    meta = {k: rec[k] for k in ("model", "tokens") if rec.get(k)}
    call = msg(
        "assistant",
        content_text(rec.get("content")),
        id=mid,
        reasoning=thoughts or None,
        tool_calls=calls or None,
        finish_reason="tool_calls" if calls else None,
        meta=meta or None,
    )
    return [call] + results


class _Replay:
    def __init__(self) -> None:
        self.builder = RolloutBuilder(fill_missing_results=True)
        self.latest: dict[str, dict] = {}
        self.present: list[str] = []
        self.ops: list[tuple] = []
        self.ids: dict[str, list[str]] = {}
        self.models: list[str] = []

    def record(self, rec: dict, line: int | None) -> str | None:
        """Log one record; returns a skip reason if it changes nothing."""
        if "$rewindTo" in rec:
            target = str(rec["$rewindTo"])
            self.present = (
                self.present[: self.present.index(target)] if target in self.present else []
            )
            self.ops.append(("edit", list(self.present), line, {"rewind_to": target}))
            return None
        if isinstance(rec.get("$set"), dict):
            new = rec["$set"].get("messages")
            if not isinstance(new, list):
                return "$set of session metadata (not sent to the model)"
            kept = [
                m
                for m in new
                if isinstance(m, dict) and m.get("id") and m.get("type") in CONVERSATION_TYPES
            ]
            for m in kept:
                self.latest[str(m["id"])] = m
            ids = [str(m["id"]) for m in kept]
            if ids != self.present:
                reason = "edit" if ids == self.present[: len(ids)] else "compaction"
                self.ops.append((reason, list(ids), line, {"set_messages": len(new)}))
                self.present = ids
            return None
        if rec.get("id") is not None and rec.get("type") is not None:
            if rec["type"] not in CONVERSATION_TYPES:
                return f"'{rec['type']}' message (shown to the user, not sent to the model)"
            mid = str(rec["id"])
            self.latest[mid] = rec
            if mid not in self.present:
                self.present.append(mid)
                self.ops.append(("message", mid, line, {}))
            return None
        return (
            "session header"
            if rec.get("sessionId")
            else "record of unknown shape (no id, $set or $rewindTo)"
        )

    def replay(self) -> None:
        for kind, arg, line, meta in self.ops:
            if kind == "message":
                self._append(arg)
                continue
            items: list[Keep | Msg] = []
            live = set(self.builder.live)
            for mid in arg:
                known = self.ids.get(mid)
                if known and all(i in live for i in known):
                    items.extend(Keep(id=i) for i in known)
                else:
                    items.extend(_messages(self.latest[mid]))
            trigger = "manual" if kind == "edit" else "budget"
            self.builder.rewrite(
                kind, trigger, items, id=f"{kind}@{line}", meta={**meta, "line": line}
            )

    def _append(self, mid: str) -> None:
        rec = self.latest[mid]
        if rec.get("model") and rec["model"] not in self.models:
            self.models.append(rec["model"])
        self.ids[mid] = []
        for m in _messages(rec):
            event = self.builder.append(m)
            if event is not None:
                self.ids[mid].append(event.id)


@register
class GeminiCliReader(Reader):
    name = "gemini-cli"
    records_outcomes = False
    description = "Gemini CLI chat recordings (legacy session JSON and JSONL with $set / $rewindTo)"

    def sniff(self, path: Path, head: bytes) -> bool:
        rec = first_json_object(head)
        if rec is not None and "sessionId" in rec and "projectHash" in rec:
            return True
        return b'"sessionId"' in head and b'"projectHash"' in head and b'"messages"' in head

    @staticmethod
    def _record(replay: _Replay, rec: Any, line: int | None) -> str | None:
        if not isinstance(rec, dict):
            return "message is not an object"
        try:
            return replay.record(rec, line)
        except BAD_CONTENT as exc:
            return f"record of unexpected shape: {reason_of(exc)}"

    def read(self, path: Path) -> Iterator[ReadItem]:
        replay = _Replay()
        header: dict = {}
        records = 0
        first = None
        if path.name.endswith((".json", ".json.gz", ".json.zst")):
            try:
                doc = load_json(path)
                if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
                    raise ValueError("no 'messages' list")
            except (ValueError, OSError) as exc:
                yield Rejected(None, f"cannot read Gemini CLI session: {exc}")
                return
            header = doc
            for m in doc["messages"]:
                skip = self._record(replay, m, None)
                if skip:
                    yield Skipped(None, skip)
                else:
                    records += 1
        else:
            for line, rec, error, raw in iter_json_records(path):
                if error:
                    yield Rejected(line, error, raw)
                    continue
                first = first or line
                if not header and rec.get("sessionId") and "id" not in rec:
                    header = rec
                    records += 1
                    continue
                skip = self._record(replay, rec, line)
                if skip:
                    yield Skipped(line, skip)
                else:
                    records += 1
        session = str(header.get("sessionId") or path.stem)
        try:
            replay.replay()
            if not replay.builder.has_calls():
                raise ValueError("no gemini (model) message")
            rollout = replay.builder.build(
                rollout_id=session,
                task_id=session,
                source=self.name,
                model=replay.models[0] if replay.models else None,
                meta={
                    "session_id": session,
                    "project_hash": header.get("projectHash"),
                    **({"models": replay.models} if len(replay.models) > 1 else {}),
                },
            )
        except BAD_CONTENT as exc:
            yield Rejected(first, f"session {session}: {reason_of(exc)}", records=records)
            return
        yield Accepted(rollout, first, records=records)
