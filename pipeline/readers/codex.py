"""Codex CLI rollout JSONL (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl[.zst]``).

The model's input is the ``response_item`` stream (plus ``base_instructions`` from
``session_meta``, sent as the system prompt of every request); ``event_msg`` records are
UI events that repeat those items, so they are skipped with their type as reason.
One call of the model is the run of output items (reasoning, assistant message,
function / custom / local-shell / tool-search calls, built-in web search or image
generation) between two input items; a ``token_count`` event or a ``turn_context`` also
ends a call, since Codex writes them after each response.

Rewrites: ``compacted`` replaces the history by ``replacement_history`` (copies of live
messages are kept by id; a remote compaction's encrypted ``compaction`` item is kept as
an opaque user message flagged ``meta.opaque``, never dropped). Old files without
``replacement_history`` are rebuilt the way Codex did: system and user messages kept,
the summary appended. ``thread_rolled_back`` drops the last ``num_turns`` user turns.
A file may hold several sessions: each ``session_meta`` starts a rollout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pipeline.readers import Accepted, Reader, ReadItem, Rejected, Skipped, register
from pipeline.readers.builder import Msg, RolloutBuilder, msg
from pipeline.readers.common import (
    BAD_CONTENT,
    UniqueNames,
    as_arguments,
    content_text,
    first_json_object,
    iter_json_records,
    reason_of,
)
from schemas.rollout import Keep

CALL_ITEMS = {
    "function_call": "arguments",
    "custom_tool_call": "input",
    "local_shell_call": "action",
    "tool_search_call": "arguments",
}
BUILTIN_ITEMS = {"web_search_call", "image_generation_call"}
OUTPUT_ITEMS = {
    "function_call_output",
    "custom_tool_call_output",
    "local_shell_call_output",
    "tool_search_output",
}
OPAQUE_ITEMS = {"compaction", "compaction_summary"}
ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}
# User-role messages Codex injects (environment context, AGENTS.md); they do not start a turn.
INJECTED_PREFIXES = ("<", "# AGENTS.md")


def _is_output(item: dict) -> bool:
    """Items the model generated (the rest are its input)."""
    kind = item.get("type")
    return (
        (kind == "message" and item.get("role") == "assistant")
        or kind == "reasoning"
        or kind in CALL_ITEMS
        or kind in BUILTIN_ITEMS
    )


class _Call:
    """Output items of one model response, merged into one assistant message."""

    def __init__(self, line: int | None = None) -> None:
        self.line = line
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict] = []
        self.meta: dict = {}

    def add(self, item: dict) -> None:
        kind = item.get("type")
        if kind == "message":
            self.text.append(content_text(item.get("content")))
        elif kind == "reasoning":
            raw = content_text(item.get("content"))
            self.reasoning.append(
                raw or "\n".join(content_text(s) for s in item.get("summary") or [])
            )
            if item.get("encrypted_content"):
                self.meta["encrypted_reasoning"] = True
        elif kind in CALL_ITEMS:
            self.calls.append(
                {
                    "id": item.get("call_id") or item.get("id"),
                    "name": item.get("name") or kind,
                    "arguments": as_arguments(item.get(CALL_ITEMS[kind])),
                }
            )
            if kind != "function_call":
                self.meta.setdefault("call_types", {})[str(self.calls[-1]["id"])] = kind
        else:
            self.meta.setdefault("builtin_calls", []).append(
                {k: v for k, v in item.items() if k != "metadata"}
            )

    def message(self) -> Msg:
        return msg(
            "assistant",
            "\n\n".join(t for t in self.text if t),
            id=f"L{self.line}" if self.line else None,
            reasoning="\n\n".join(r for r in self.reasoning if r) or None,
            tool_calls=self.calls or None,
            finish_reason="tool_calls" if self.calls else None,
            meta=self.meta or None,
        )

    def __bool__(self) -> bool:
        return bool(self.text or self.reasoning or self.calls or self.meta)


def _input_message(item: dict) -> Msg | None:
    """An input-side item as a message (None if it is not one)."""
    kind = item.get("type")
    if kind == "message" and item.get("role") in ROLES and item.get("role") != "assistant":
        role = ROLES[item["role"]]
        meta = {"codex_role": item["role"]} if item["role"] != role else None
        return msg(role, content_text(item.get("content")), meta=meta)
    if kind == "agent_message":
        return msg("user", content_text(item.get("content")), meta={"author": item.get("author")})
    if kind in OUTPUT_ITEMS:
        body = (
            as_arguments(item.get("tools"))
            if kind == "tool_search_output"
            else content_text(item.get("output"))
        )
        return msg("tool", body, tool_call_id=str(item.get("call_id")))
    if kind in OPAQUE_ITEMS:
        return msg(
            "user",
            "",
            meta={
                "opaque": True,
                "codex_item": kind,
                "encrypted_content": item.get("encrypted_content"),
            },
        )
    return None


def history_messages(items: list) -> tuple[list[Msg], list[str]]:
    """``replacement_history`` items as messages (output runs merged into calls), and the
    types of the items that are not context (recorded on the rewrite)."""
    out: list[Msg] = []
    others: list[str] = []
    call = _Call()
    for item in items:
        if not isinstance(item, dict):
            others.append(type(item).__name__)
            continue
        if _is_output(item):
            call.add(item)
            continue
        if call:
            out.append(call.message())
            call = _Call()
        m = _input_message(item)
        if m is None:
            others.append(str(item.get("type")))
        else:
            out.append(m)
    if call:
        out.append(call.message())
    return out, others


class _Session:
    def __init__(self, meta: dict, line: int) -> None:
        self.meta = meta
        self.first = line
        self.records = 0
        self.builder = RolloutBuilder(fill_missing_results=True, fill_before=("user", "system"))
        self.call = _Call()
        self.turn_starts: set[str] = set()
        self.models: list[str] = []
        self.base_id: str | None = None
        instructions = meta.get("base_instructions") or {}
        text = instructions.get("text") if isinstance(instructions, dict) else instructions
        if text:
            self.base_id = self.builder.append(
                msg(
                    "system", str(text), id="base_instructions", meta={"codex": "base_instructions"}
                )
            ).id

    def flush(self) -> None:
        if self.call:
            self.builder.append(self.call.message())
            self.call = _Call()


@register
class CodexReader(Reader):
    name = "codex"
    description = "Codex CLI rollout JSONL (~/.codex/sessions/**/rollout-*.jsonl, .zst too)"

    def sniff(self, path: Path, head: bytes) -> bool:
        rec = first_json_object(head)
        return (
            bool(rec)
            and "payload" in rec
            and rec.get("type")
            in {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
        )

    def read(self, path: Path) -> Iterator[ReadItem]:
        session: _Session | None = None
        ids = UniqueNames()
        for line, rec, error, raw in iter_json_records(path):
            if error:
                yield Rejected(line, error, raw)
                continue
            rtype, payload = rec.get("type"), rec.get("payload")
            payload = payload if isinstance(payload, dict) else {}
            if rtype == "session_meta" or session is None:
                if session is not None:
                    yield from self._finish(session, path, ids)
                try:
                    session = _Session(payload if rtype == "session_meta" else {}, line)
                except BAD_CONTENT as exc:
                    session = _Session({}, line)
                    yield Rejected(line, f"session_meta: {reason_of(exc)}", raw)
                    continue
                if rtype == "session_meta":
                    session.records += 1
                    continue
            try:
                skip = self._record(session, rtype, payload, line)
            except BAD_CONTENT as exc:
                yield Rejected(line, f"{rtype}: {reason_of(exc)}", raw)
                continue
            if skip:
                yield Skipped(line, skip)
            else:
                session.records += 1
        if session is not None:
            yield from self._finish(session, path, ids)

    def _record(self, s: _Session, rtype: str, payload: dict, line: int) -> str | None:
        """Apply one record to the session; returns a skip reason if it adds nothing."""
        kind = payload.get("type")
        if rtype == "event_msg":
            if kind == "thread_rolled_back":
                s.flush()
                self._rollback(s, int(payload.get("num_turns") or 0), line)
                return None
            if kind == "token_count":
                s.flush()
            return f"event_msg/{kind}: UI event, repeats or annotates the model input"
        if rtype == "turn_context":
            s.flush()
            if payload.get("model") and payload["model"] not in s.models:
                s.models.append(payload["model"])
            return None
        if rtype == "compacted":
            s.flush()
            self._compaction(s, payload, line)
            return None
        if rtype != "response_item":
            return f"'{rtype}' record: not model input"
        if kind == "ghost_snapshot":
            return "response_item/ghost_snapshot: undo bookkeeping, not model input"
        if _is_output(payload):
            s.call.line = s.call.line or line
            s.call.add(payload)
            return None
        m = _input_message(payload)
        if m is None:
            return f"response_item/{kind}: not a message or call seam knows"
        s.flush()
        if m.role == "tool" and not s.builder.is_open(m.fields["tool_call_id"]):
            return f"response_item/{kind} for a call that is not open in this session"
        m.id = f"L{line}"
        event = s.builder.append(m)
        if m.role == "user" and not m.content.lstrip().startswith(INJECTED_PREFIXES):
            s.turn_starts.add(event.id)
        return None

    @staticmethod
    def _compaction(s: _Session, payload: dict, line: int) -> None:
        history = payload.get("replacement_history")
        meta = {
            k: payload[k]
            for k in ("window_id", "window_number", "previous_window_id", "first_window_id")
            if k in payload
        }
        meta["line"] = line
        if isinstance(history, list):
            new, others = history_messages(history)
            if others:
                meta["not_context_items"] = others
            for i, m in enumerate(new):
                m.id = f"L{line}.{i}"
            items = ([Keep(id=s.base_id)] if s.base_id else []) + s.builder.match(new)
            meta["remote"] = not payload.get("message") and any(
                m.fields.get("meta", {}).get("opaque") for m in new
            )
        else:
            kept = [
                Keep(id=m.id) for m in s.builder.live_messages() if m.role in ("system", "user")
            ]
            summary = msg(
                "user",
                str(payload.get("message") or ""),
                id=f"L{line}",
                meta={"compact_summary": True},
            )
            items = kept + [summary]
            meta["reconstructed"] = (
                "no replacement_history: system and user messages kept, summary appended"
            )
        s.builder.rewrite("compaction", "budget", items, id=f"compacted@{line}", meta=meta)

    @staticmethod
    def _rollback(s: _Session, turns: int, line: int) -> None:
        live = s.builder.live_messages()
        starts = [i for i, m in enumerate(live) if m.id in s.turn_starts]
        cut = starts[-turns] if 0 < turns <= len(starts) else (0 if turns else len(live))
        s.builder.rewrite(
            "edit",
            "manual",
            [Keep(id=m.id) for m in live[:cut]],
            id=f"rollback@{line}",
            meta={"num_turns": turns, "line": line},
        )

    def _finish(self, s: _Session, path: Path, ids: UniqueNames) -> Iterator[ReadItem]:
        try:
            s.flush()
        except BAD_CONTENT as exc:
            yield Rejected(s.first, f"session: {reason_of(exc)}", records=s.records)
            return
        session_id = str(s.meta.get("id") or s.meta.get("session_id") or path.stem)
        if not s.builder.has_calls():
            yield Rejected(
                s.first,
                f"session {session_id} has no model call ({s.records} records)",
                records=s.records,
            )
            return
        meta = {
            k: s.meta[k]
            for k in ("cwd", "cli_version", "originator", "forked_from_id")
            if s.meta.get(k)
        }
        meta["session_id"] = session_id
        if len(s.models) > 1:
            meta["models"] = s.models
        parent = s.meta.get("parent_thread_id") or s.meta.get("forked_from_id")
        rollout_id = ids.claim(session_id)
        try:
            rollout = s.builder.build(
                rollout_id=rollout_id,
                task_id=session_id,
                source=self.name,
                model=s.models[0] if s.models else None,
                meta=meta,
                parent_rollout_id=str(parent) if parent else None,
            )
        except BAD_CONTENT as exc:
            yield Rejected(s.first, f"session {rollout_id}: {reason_of(exc)}", records=s.records)
            return
        yield Accepted(rollout, s.first, records=s.records)
