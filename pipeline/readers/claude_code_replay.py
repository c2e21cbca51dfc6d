"""Claude Code, pass two: the entries of one conversation → one canonical rollout.

``claude_code`` sorts records into conversations and merges the blocks of each API
response; this module replays one conversation, in file order, into events:

- ``compact_boundary`` (+ the ``isCompactSummary`` user record after it) → a
  ``compaction`` rewrite to the summary, plus the messages the boundary lists in
  ``preservedMessages``. The summary call is in its own file (``agent-acompact-*``):
  ``claude_code_compact`` puts it before the boundary, a call flagged ``SUMMARY_CALL``.
- ``microcompact_boundary`` → an ``edit`` rewrite keeping every live message, the
  results of ``compactedToolIds`` replaced by Claude Code's cleared placeholder.
- A resumed session (``claude --resume``) starts with copies of the earlier session's
  records, which carry that session's id: they were calls of that session, not this
  one, so they become the first rewrite's context (``meta.resumed_from``), not calls.
- A tool result whose call is not in the conversation (a slice) is skipped; a call
  left without result gets a flagged placeholder, as Claude Code itself sends one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.fidelity import REDACTED_KEY
from pipeline.readers import Accepted, ReadItem, Rejected, Skipped
from pipeline.readers.builder import RolloutBuilder, as_msg, msg
from pipeline.readers.claude_code_placement import (
    Placement,
    mark_modes,
    result_text,
    sent_tool_input,
)
from pipeline.readers.common import BAD_CONTENT, UniqueNames, content_text, reason_of
from schemas.rollout import Keep, MessageEvent

CLEARED = "[Old tool result content cleared]"
STOP_REASONS = {
    "tool_use": "tool_calls",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
}
# Reasoning blocks of a response: ``thinking`` (its text, or only a ``signature`` when
# the API omitted the text) and ``redacted_thinking`` (encrypted ``data``, no text).
REASONING_BLOCKS = ("thinking", "redacted_thinking")
# Entry.data flag of a call that wrote a compaction summary (claude_code_compact.py).
SUMMARY_CALL = "summary_call"
ORPHAN = "tool_result for a tool_use not in this conversation (sliced file, or a second result for one call)"


@dataclass
class Entry:
    kind: str  # user | call | result | summary | compact | microcompact | attachment
    line: int
    data: dict

    def session_id(self) -> str | None:
        rec = self.data["records"][0] if self.kind == "call" else self.data.get("rec", self.data)
        return rec.get("sessionId")


@dataclass
class Thread:
    key: str
    agent_id: str | None = None
    sessions: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    lines: set[int] = field(default_factory=set)
    calls: dict[str, Entry] = field(default_factory=dict)
    windows: int = 0
    meta: dict = field(default_factory=dict)
    # Context fidelity (pipeline/core/fidelity.py): entries for the whole conversation, and
    # damage noted at an entry index (it affects the event that entry becomes, and later).
    fidelity: list[dict] = field(default_factory=list)
    notes: dict[int, list[tuple[str, str]]] = field(default_factory=dict)

    def note_slice(self, detail: str) -> None:
        if not any(f["reason"] == "slice_start" for f in self.fidelity):
            self.fidelity.append({"reason": "slice_start", "event_id": None, "detail": detail})

    def note_lost(self, detail: str, at: int | None = None) -> None:
        self.note("lost_records", detail, at)

    def note(self, reason: str, detail: str, at: int | None = None) -> None:
        """A fidelity entry for the event the entry at ``at`` (default: the next) becomes."""
        index = len(self.entries) if at is None else at
        self.notes.setdefault(index, []).append((reason, detail))


def thread_rollout(thread: Thread, path: Path, ids: UniqueNames, source: str) -> Iterator[ReadItem]:
    """The file is named after its session; records of other sessions before the first of
    its own are the copies a resume makes (slices and sub-agent files are not renamed)."""
    resumed = path.name.split(".")[0] in thread.sessions
    session = (
        path.name.split(".")[0]
        if resumed
        else (thread.sessions[0] if thread.sessions else path.stem)
    )
    first = min(thread.lines) if thread.lines else None
    copied = 0
    if resumed:
        copied = next(
            (i for i, e in enumerate(thread.entries) if str(e.session_id()) == session), 0
        )
    builder = RolloutBuilder(fill_missing_results=True)
    replay = _Replay(builder, notes=thread.notes)
    try:
        if copied:
            earlier = _Replay(RolloutBuilder(fill_missing_results=True), replay)
            earlier.run(thread.entries[:copied])
            builder.rewrite(
                "edit",
                "manual",
                [as_msg(m) for m in earlier.builder.live_messages()],
                id="resumed",
                meta={"resumed_from": thread.entries[0].session_id(), "copied": copied},
            )
        replay.run(thread.entries[copied:], offset=copied)
    except BAD_CONTENT as exc:
        yield Rejected(
            first, f"{thread.key} of session {session}: {reason_of(exc)}", records=len(thread.lines)
        )
        return
    skipped = set(replay.orphans) - replay.used
    yield from (Skipped(line, ORPHAN) for line in sorted(skipped))
    records = len(thread.lines - skipped)
    if not builder.has_calls():
        if records:
            yield Rejected(
                first,
                f"{thread.key} of session {session} has no model call ({records} records)",
                records=records,
            )
        return
    main = thread.key == "main"
    rollout_id = ids.claim(session if main else f"{session}/{thread.key}")
    meta = {
        **thread.meta,
        "session_id": session,
        "agent_id": thread.agent_id,
        "models": replay.models if len(replay.models) > 1 else None,
        # Claude Code logs neither the system prompt nor the tool schemas it sent.
        "fidelity": [*NOT_LOGGED, *thread.fidelity, *replay.fidelity],
    }
    try:
        rollout = builder.build(
            rollout_id=rollout_id,
            task_id=session,
            source=source,
            model=replay.models[0] if replay.models else None,
            meta={k: v for k, v in meta.items() if v is not None},
            parent_rollout_id=None if main else session,
        )
    except BAD_CONTENT as exc:
        yield Rejected(first, f"{rollout_id}: {reason_of(exc)}", records=records)
        return
    yield Accepted(rollout, first, records=records)


NOT_LOGGED = [
    {"reason": "missing_system_prompt", "event_id": None, "detail": "Claude Code does not log it"},
    {"reason": "missing_tool_schemas", "event_id": None, "detail": "Claude Code does not log them"},
]


def _input_usage(usage: object) -> int:
    """Input tokens the API billed for a call: uncached + cache writes + cache reads
    (Anthropic usage fields); 0 when not recorded."""
    if not isinstance(usage, dict):
        return 0
    names = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    return sum(v for v in (usage.get(n) for n in names) if isinstance(v, int))


class _Replay:
    """Entries → builder events; ``shared`` is a replay whose bookkeeping this one adds to.
    ``notes``: damage found while sorting, by entry index; each becomes a fidelity entry
    naming the first event built at or after that entry."""

    def __init__(
        self, builder: RolloutBuilder, shared: _Replay | None = None, notes: dict | None = None
    ) -> None:
        self.builder = builder
        self.by_uuid: dict[str, str] = shared.by_uuid if shared else {}
        self.orphans: dict[int, str] = shared.orphans if shared else {}
        self.used: set[int] = shared.used if shared else set()
        self.models: list[str] = []
        self.notes: dict[int, list[tuple[str, str]]] = notes or {}
        self.fidelity: list[dict] = []
        self.placement = Placement(builder)  # attachments (claude_code_placement)

    def run(self, entries: list[Entry], offset: int = 0) -> None:
        pending: Entry | None = None
        waiting: list[tuple[str, str]] = []  # notes that wait for their first event
        mark_modes(entries)
        for index, entry in Placement.arrange(list(enumerate(entries, start=offset))):
            waiting.extend(self.notes.get(index, ()))
            before = len(self.builder.events)
            pending = self._entry(entry, pending, waiting)
            if waiting and len(self.builder.events) > before:
                event_id = self.builder.events[before].id
                self.fidelity.extend(
                    {"reason": r, "event_id": event_id, "detail": d} for r, d in waiting
                )
                waiting = []
        if pending is not None:
            self._compaction(pending, None)
        self.fidelity.extend({"reason": r, "event_id": None, "detail": d} for r, d in waiting)

    def _entry(self, entry: Entry, pending: Entry | None, waiting: list) -> Entry | None:
        """Replay one entry; returns the compact boundary still waiting for its summary."""
        self.placement.before(entry.kind)
        if entry.kind == "attachment":
            self.placement.attachment(entry, waiting)
            self.used.add(entry.line)
            return pending
        if pending is not None and entry.kind != "summary":
            self._compaction(pending, None)
            pending = None
        if entry.kind == "compact":
            pending = entry
        elif entry.kind == "summary":
            self._compaction(pending, entry)
            pending = None
        elif entry.kind == "microcompact":
            self._microcompaction(entry)
        elif entry.kind == "user":
            rec = entry.data["rec"]
            event = self.builder.append(
                msg(
                    "user",
                    entry.data["text"],
                    id=rec.get("uuid"),
                    meta={"is_meta": True} if rec.get("isMeta") else None,
                )
            )
            assert event is not None  # the builder refuses only tool results
            self.by_uuid[str(rec.get("uuid"))] = event.id
        elif entry.kind == "result":
            result = self._result(entry)
            if result is not None:
                self.placement.result(result.id, entry.data["block"], entry.line, waiting)
            else:
                self.orphans.setdefault(entry.line, ORPHAN)
                if self.builder.has_calls():  # not the head of a slice: a call was lost
                    call_id = entry.data["block"].get("tool_use_id")
                    waiting.append(
                        (
                            "lost_records",
                            f"@{entry.line}: tool result for {call_id}, whose call "
                            "is in none of the given files",
                        )
                    )
                return pending
        else:
            self._call(entry)
        self.used.add(entry.line)
        return pending

    def _call(self, entry: Entry) -> None:
        """One model call from the records of one API response."""
        text, thinking, calls, other = [], [], [], []
        redacted = 0  # reasoning blocks whose text the log does not hold
        stop = None
        reported = None
        for rec in entry.data["records"]:
            message = rec.get("message") or {}
            stop = message.get("stop_reason") or stop
            reported = max(reported or 0, _input_usage(message.get("usage"))) or None
            content = message.get("content")
            for block in (
                content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
            ):
                kind = block.get("type") if isinstance(block, dict) else None
                if kind == "text":
                    text.append(block.get("text") or "")
                elif kind in REASONING_BLOCKS:
                    thinking.append(block.get("thinking") or "")
                    redacted += not thinking[-1].strip()
                elif kind == "tool_use":
                    calls.append(
                        {
                            "id": block.get("id"),
                            "name": block.get("name"),
                            "arguments": sent_tool_input(block.get("name"), block.get("input")),
                        }
                    )
                else:
                    other.append(str(kind))
        first = entry.data["records"][0]
        message = first.get("message") or {}
        event = self.builder.append(
            msg(
                "assistant",
                "\n\n".join(t for t in text if t),
                id=message.get("id") or first.get("uuid"),
                reasoning="\n\n".join(t for t in thinking if t) or None,
                tool_calls=calls or None,
                # A compaction's own call (joined from its agent-acompact file).
                kind="summary" if entry.data.get(SUMMARY_CALL) else None,
                finish_reason=STOP_REASONS.get(str(stop)) or ("tool_calls" if calls else None),
                meta={
                    k: v
                    for k, v in (
                        ("unsupported_blocks", other),
                        ("reported_input_tokens", reported),
                        (REDACTED_KEY, redacted),
                    )
                    if v
                }
                or None,
            )
        )
        assert event is not None  # the builder refuses only tool results
        self.by_uuid.update({str(rec.get("uuid")): event.id for rec in entry.data["records"]})
        model = message.get("model")
        if model and model not in self.models:
            self.models.append(model)

    def _result(self, entry: Entry) -> MessageEvent | None:
        block, rec = entry.data["block"], entry.data["rec"]
        call_id = block.get("tool_use_id")
        if not call_id or not self.builder.is_open(str(call_id)):
            return None
        return self.builder.append(
            msg(
                "tool",
                result_text(block.get("content")),
                id=f"{rec.get('uuid')}:{call_id}",
                tool_call_id=str(call_id),
                meta={"is_error": True} if block.get("is_error") else None,
            )
        )

    def _compaction(self, boundary: Entry | None, summary: Entry | None) -> None:
        """The new context starts from the summary, then the messages the boundary preserved."""
        cm = (boundary.data.get("compactMetadata") or {}) if boundary else {}
        items: list = []
        if summary is not None:
            items.append(
                msg(
                    "user",
                    content_text((summary.data.get("message") or {}).get("content")),
                    id=summary.data.get("uuid"),
                    meta={"compact_summary": True},
                )
            )
        preserved = {
            self.by_uuid.get(str(u)) for u in (cm.get("preservedMessages") or {}).get("uuids") or []
        }
        items.extend(Keep(id=i) for i in self.builder.live if i in preserved)
        meta = {
            "boundary_line": boundary.line if boundary else None,
            "pre_tokens": cm.get("preTokens"),
            "source_trigger": cm.get("trigger"),
            "boundary_missing": boundary is None or None,
            "summary_missing": summary is None or None,
        }
        self.builder.rewrite(
            "compaction",
            "manual" if cm.get("trigger") == "manual" else "budget",
            items,
            id=boundary.data.get("uuid")
            if boundary
            else f"{summary.data.get('uuid') if summary else None}:compaction",
            meta={k: v for k, v in meta.items() if v is not None},
        )

    def _microcompaction(self, entry: Entry) -> None:
        md = entry.data.get("microcompactMetadata") or {}
        cleared = {self.builder.resolve(str(i)) for i in md.get("compactedToolIds") or []}
        items: list = []
        for event in self.builder.live_messages():
            if event.role == "tool" and event.tool_call_id in cleared:
                items.append(
                    msg(
                        "tool",
                        CLEARED,
                        id=f"{event.id}~cleared",
                        tool_call_id=event.tool_call_id,
                        meta={"replaces": event.id},
                    )
                )
            else:
                items.append(Keep(id=event.id))
        # A context edit, not a compaction: no summary, only old results cleared in place.
        self.builder.rewrite(
            "edit",
            "manual" if md.get("trigger") == "manual" else "budget",
            items,
            id=entry.data.get("uuid"),
            meta={
                "kind": "microcompact",
                "pre_tokens": md.get("preTokens"),
                "tokens_saved": md.get("tokensSaved"),
                "boundary_line": entry.line,
            },
        )
