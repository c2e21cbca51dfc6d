"""Codex CLI rollout JSONL (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl[.zst]``).

The model's input is the ``response_item`` stream (plus ``base_instructions`` from
``session_meta``, sent as the system prompt of every request); ``event_msg`` records are
UI events that repeat those items, so they are skipped with their type as reason.
One call of the model is the run of output items (reasoning, assistant message,
function / custom / local-shell / tool-search calls, image generation) between two input
items; a ``token_count`` event or a ``turn_context`` also ends a call, since Codex writes
them after each response. The input items keep the order the Responses API received
them: a ``developer`` message Codex records between a call and its output (an approval
notice) stays there, and the output still answers its call; a call that never gets an
output is answered by a placeholder right after it, as Codex does. ``token_count``'s
``last_token_usage.input_tokens`` (cached tokens included) becomes the call's
``meta.reported_input_tokens``.

Tool kinds (``meta.tool_kinds`` of the assistant message, call id → kind, for calls that
are not JSON function calls): ``custom`` for a ``custom_tool_call`` (a freeform tool such
as ``apply_patch``: its input is raw text by design, kept verbatim as the arguments),
``local_shell`` / ``tool_search`` for those items, ``builtin`` for a ``web_search_call``.
A web search is run by the provider inside the response: the call is the assistant
message up to the ``web_search_call`` (a tool call ``web_search`` whose arguments are
the item's ``action``), the results the model then read are not in the log, so they are
an opaque tool result (``meta.opaque = "web_search_results"``, placeholder content) and
the rollout's ``meta.fidelity`` says so; the rest of the response is the next call.

Rewrites: ``compacted`` replaces the history by exactly ``replacement_history``, in its
order (a live message is kept by id only when it is equal, reasoning included). A
remote compaction's encrypted ``compaction`` item is an opaque user message
(``meta.opaque = "encrypted_compaction"``, placeholder content, never an empty turn),
the rewrite says ``meta.remote: true`` and ``meta.fidelity`` records ``opaque_summary``.
Old files without ``replacement_history`` are rebuilt the way Codex did: system and
user messages kept, the summary appended. ``thread_rolled_back`` drops the last
``num_turns`` user turns.

The tool definitions Codex sends are not in the log: every rollout's ``meta.fidelity``
says ``missing_tool_schemas``.

Sessions: each ``session_meta`` id is one rollout. Codex Desktop writes a new
``session_meta`` on every resumed turn: a ``session_meta`` whose id was seen before
continues that session (counted in ``meta.resumed``). ``rollouts_from_records`` does
this over any list of records, so records of one session from several files can be
read together.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from pipeline.core.fidelity import REDACTED_KEY
from pipeline.readers import Accepted, Reader, ReadItem, Rejected, Skipped, register
from pipeline.readers.builder import Msg, RolloutBuilder, as_msg, msg
from pipeline.readers.codex_sessions import (
    fork_parent,
    is_fork_copy,
    own_turn_start,
    record_identity,
    seconds,
)
from pipeline.readers.common import (
    BAD_CONTENT,
    REPEAT,
    UniqueNames,
    as_arguments,
    content_text,
    first_json_object,
    iter_json_records,
    located,
    merged_records,
    reason_of,
)
from schemas.rollout import Keep, MessageEvent

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
# Canonical tool kinds of the call items that are not JSON function calls.
TOOL_KINDS = {
    "custom_tool_call": "custom",
    "local_shell_call": "local_shell",
    "tool_search_call": "tool_search",
    "web_search_call": "builtin",
}
# Placeholders of the opaque items (documented in docs/readers.md, "Codex").
ENCRYPTED_SUMMARY = "[compaction summary: encrypted by the provider, its text is not in the log]"
WEB_SEARCH_RESULTS = "[web search results: read by the model, not recorded in the log]"
Records = Iterable[tuple[int | None, dict | None, str | None, str]]
# A response's items are written at once (older Codex): within this many seconds.
BATCH_GAP_S = 1.0
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


def _fidelity(reason: str, event_id: str | None, detail: str) -> dict:
    """One ``rollout.meta["fidelity"]`` entry (the reader convention, docs/data.md)."""
    return {"reason": reason, "event_id": event_id, "detail": detail}


def _web_search_result(call_id: str, id: str) -> Msg:
    return msg(
        "tool",
        WEB_SEARCH_RESULTS,
        id=id,
        tool_call_id=call_id,
        meta={"opaque": "web_search_results"},
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
            if not self.reasoning[-1].strip():  # reasoned, but no text of it is logged
                self.meta[REDACTED_KEY] = self.meta.get(REDACTED_KEY, 0) + 1
        elif kind in CALL_ITEMS or kind == "web_search_call":
            call_id = (
                item.get("call_id") or item.get("id") or f"{kind}@L{self.line}.{len(self.calls)}"
            )
            search = kind == "web_search_call"
            self.calls.append(
                {
                    "id": call_id,
                    "name": "web_search" if search else item.get("name") or kind,
                    "arguments": as_arguments(item.get("action" if search else CALL_ITEMS[kind])),
                }
            )
            if kind in TOOL_KINDS:
                self.meta.setdefault("tool_kinds", {})[str(call_id)] = TOOL_KINDS[kind]
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
            ENCRYPTED_SUMMARY,
            meta={
                "opaque": "encrypted_compaction",
                "codex_item": kind,
                "encrypted_content": item.get("encrypted_content"),
            },
        )
    return None


def history_messages(items: list) -> tuple[list[Msg], list[str]]:
    """``replacement_history`` items as messages (output runs merged into calls, a web
    search closing its call with its opaque result), and the types of the items that
    are not context (recorded on the rewrite)."""
    out: list[Msg] = []
    others: list[str] = []
    call = _Call()
    for item in items:
        if not isinstance(item, dict):
            others.append(type(item).__name__)
            continue
        if _is_output(item):
            call.add(item)
            if item.get("type") == "web_search_call":
                out.append(call.message())
                out.append(_web_search_result(str(call.calls[-1]["id"]), ""))
                call = _Call()
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
    def __init__(self, meta: dict, line: int | None) -> None:
        self.meta = meta
        self.first = line
        self.records = 0
        self.resumed = 0
        # A call still waiting for its output when the next call (or a rewrite) comes gets
        # a placeholder right after it, where Codex inserts one itself ("aborted"); input
        # recorded between a call and its output (a developer approval notice, a user
        # message) does not close the call.
        self.builder = RolloutBuilder(
            fill_missing_results=True, fill_before=("assistant",), fill_at_call=True
        )
        self.call = _Call()
        # Outputs of the current response's calls, held until the response ends (Codex
        # may write them between its calls), when they were written, whether more of the
        # response came after them; the timestamp of the record being read; whether the
        # session writes token counts.
        self.outputs: list[Msg] = []
        self.outputs_at: object = None
        self.interleaved = False
        self.stamp: object = None
        self.counts = False
        self.turn_starts: set[str] = set()
        self.models: list[str] = []
        self.fidelity: list[dict] = []
        # Calls since the last token_count (which names the input size of the response
        # they form), and that count's running total (Codex writes some counts twice).
        self.response_calls: list[str] = []
        self.usage_total: object = None
        # (count, the calls read before it) per count or rewrite; whether counts come
        # before their response (older Codex); agent_message texts since the last count,
        # and before it.
        self.usage_log: list[tuple[int | None, list[str]]] = []
        self.counts_first = False
        self.announced: list[str] = []
        self.announced_before: list[str] = []
        self.base_id: str | None = None
        # A fork that started from a copy of its parent's history: (parent, copied
        # records, copied context messages).
        self.copied: tuple[str, int, int] | None = None
        self.broken: str | None = None  # why the session cannot be built, if known early
        instructions = meta.get("base_instructions") or {}
        text = instructions.get("text") if isinstance(instructions, dict) else instructions
        if text:
            base = self.builder.append(
                msg(
                    "system", str(text), id="base_instructions", meta={"codex": "base_instructions"}
                )
            )
            self.base_id = base.id if base is not None else None

    def flush(self) -> None:
        if self.call:
            event = self.builder.append(self.call.message())
            if event is not None:  # an assistant message is always appended
                self.response_calls.append(event.id)
            self.call = _Call()
        self.flush_outputs()

    def holds_output(self, m: Msg) -> bool:
        """Keep ``m`` back if it is the output of a call of the response still being read
        (it goes right after the response: ``flush_outputs``)."""
        call_id = m.fields.get("tool_call_id") if m.role == "tool" else None
        if call_id is None or call_id not in {str(c["id"]) for c in self.call.calls}:
            return False
        self.outputs.append(m)
        self.outputs_at = self.stamp
        return True

    def continues_response(self) -> bool:
        """An output item read after outputs of the current response's calls: the same
        response (older Codex wrote each call's output right after the call, all items
        of a response at once) when the session writes token counts (newer Codex writes
        one between two responses) and the item was written with those outputs (within
        ``BATCH_GAP_S``: a response retried after a dropped stream comes later).
        Otherwise the outputs answered the response and this item starts the next one."""
        if not self.outputs or not self.counts:
            return False
        held, here = seconds(self.outputs_at), seconds(self.stamp)
        self.interleaved = held is None or here is None or here - held <= BATCH_GAP_S
        return self.interleaved

    def flush_outputs(self) -> None:
        outputs, self.outputs = self.outputs, []
        events = [self.builder.append(m) for m in outputs]
        first = next((e for e in events if e is not None), None)
        if self.interleaved and first is not None:
            self.fidelity.append(
                _fidelity(
                    "interleaved_tool_outputs",
                    first.id,
                    f"{len(outputs)} tool outputs written between the calls of one response; "
                    "the context has them after its calls",
                )
            )
        self.interleaved = False

    def append_input(self, m: Msg) -> MessageEvent | None:
        self.flush()
        return self.builder.append(m)

    def web_search(self, line: int | None) -> None:
        """The model's output stops at a web search; the provider runs it and the model
        reads results the log does not hold (an opaque tool result), then goes on."""
        call_id = str(self.call.calls[-1]["id"])
        self.flush()
        result = self.builder.append(_web_search_result(call_id, f"L{line}:results"))
        self.fidelity.append(
            _fidelity(
                "opaque_tool_result",
                result.id if result is not None else None,
                f"web search {call_id}: its results are not in the log",
            )
        )

    def report_usage(self, info: object) -> None:
        """``token_count``: the provider's input tokens of one response. Codex writes it
        right after the response, or after the outputs of the response's calls (newer
        versions), or, in older versions, before the response's items (``counts_first``);
        a count whose running total did not move repeats the previous one. The counts and
        the calls read between them are logged and given out at the end
        (``apply_usage``), once the order is known."""
        self.flush()
        self.counts = True
        if not isinstance(info, dict):
            return
        usage, total = info.get("last_token_usage"), info.get("total_token_usage")
        tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
        if total == self.usage_total or not isinstance(tokens, int) or tokens <= 0:
            return
        self.usage_total = total
        self.end_usage_span(tokens)
        self.announced_before, self.announced = self.announced, []

    def end_usage_span(self, tokens: int | None = None) -> None:
        """The calls read since the last count end here: at a count (``tokens``), or at a
        rewrite (no count: what follows is another span)."""
        self.usage_log.append((tokens, self.response_calls))
        self.response_calls = []

    def notice_message(self, text: str) -> None:
        """An assistant message item: if Codex announced its text (an ``agent_message``
        event) before the last count and not since, the count came between the streamed
        response and its items, i.e. the session writes each count before its response."""
        if text and text in self.announced_before and text not in self.announced:
            self.counts_first = True

    def apply_usage(self) -> None:
        """Each response's count as its call's ``meta.reported_input_tokens``: the count
        that closes its span, or with ``counts_first`` the one that opened it. Only when
        the response is one call (a web search splits a response into several)."""
        self.end_usage_span()
        opened: int | None = None
        for tokens, calls in self.usage_log:
            count = opened if self.counts_first else tokens
            if count is not None and len(calls) == 1:
                call = self.builder.messages[calls[0]]
                self.builder.update(call.id, meta={**call.meta, "reported_input_tokens": count})
            opened = tokens


def rollouts_from_records(records: Records, default_id: str) -> Iterator[ReadItem]:
    """Codex records (``(line, record, parse error, raw text)`` in order, from one file
    or several) → one rollout per ``session_meta`` id, in order of first appearance; a
    ``session_meta`` whose id was seen before continues that session. Records before any
    ``session_meta`` form a session named ``default_id``. A fork's copy of its parent's
    history (``codex_sessions``) is read into a session of its own, then becomes the
    fork's starting context (``_Fork.adopt``)."""
    sessions: dict[str, _Session] = {}
    session: _Session | None = None
    forks: list[_Fork] = []  # copies being read, innermost last (a fork of a fork nests)
    for line, rec, error, raw in records:
        if error or rec is None:
            yield Rejected(line, error or "not a JSON object", raw)
            continue
        while forks and forks[-1].ends_at(rec):
            session = forks.pop().adopt()
        rtype, payload = str(rec.get("type")), rec.get("payload")
        payload = payload if isinstance(payload, dict) else {}
        if rtype == "session_meta":
            key = str(payload.get("id") or payload.get("session_id") or default_id)
            if forks and key == forks[-1].parent:
                forks[-1].copy.resumed += 1
                forks[-1].copy.records += 1
                continue
            if session is not None and is_fork_copy(session.meta, session.records, payload):
                try:
                    forks.append(_Fork(session, key, rec.get("timestamp"), payload, line))
                except BAD_CONTENT as exc:
                    yield Rejected(line, f"session_meta: {reason_of(exc)}", raw)
                    continue
                session = forks[-1].copy
                continue
            while forks:  # another session starts: the copies end here
                forks.pop().adopt()
            if key in sessions:
                session = sessions[key]
                session.resumed += 1
                session.records += 1
                continue
            try:
                session = sessions[key] = _Session(payload, line)
            except BAD_CONTENT as exc:
                session = sessions[key] = _Session({}, line)
                yield Rejected(line, f"session_meta: {reason_of(exc)}", raw)
                continue
            session.records += 1
            continue
        if session is None:
            session = sessions.setdefault(default_id, _Session({}, line))
        try:
            session.stamp = rec.get("timestamp")
            skip = _record(session, rtype, payload, line)
        except BAD_CONTENT as exc:
            yield Rejected(line, f"{rtype}: {reason_of(exc)}", raw)
            continue
        if skip:
            yield Skipped(line, skip)
        else:
            session.records += 1
    while forks:
        forks.pop().adopt()
    ids = UniqueNames()
    for key, s in sessions.items():
        yield from _finish(s, key, ids)


class _Fork:
    """A fork whose copy of its parent's history is being read (``codex_sessions``): the
    copy is replayed like a session of its own, so its compactions, rollbacks and calls
    end where they ended for the parent, and its live context at the end of the copy is
    what the fork starts with."""

    def __init__(
        self, fork: _Session, parent: str, stamp: object, header: dict, line: int | None
    ) -> None:
        self.fork, self.parent, self.stamp = fork, parent, stamp
        own = fork.meta.get("id") or fork.meta.get("session_id")
        self.fork_id = str(own)
        self.copy = _Session(header, line)
        self.copy.records += 1

    def ends_at(self, rec: dict) -> bool:
        return own_turn_start(self.fork_id, self.stamp, rec)

    def adopt(self) -> _Session:
        """The fork's context becomes the copy's live context (context, not calls: the
        parent made those calls), after the fork's own system prompt; returns the fork."""
        copy, fork = self.copy, self.fork
        fork.records += copy.records
        try:
            copy.flush()
            copy.builder.fill_missing_results()  # what Codex sends for an unanswered call
            live = [
                m for m in copy.builder.live_messages() if m.id != copy.base_id or not fork.base_id
            ]
            items: list[Keep | Msg] = [Keep(id=fork.base_id)] if fork.base_id else []
            items += [as_msg(m) for m in live]
            fork.builder.rewrite(
                "edit",
                "manual",
                items,
                id="forked",
                meta={"forked_from": self.parent, "copied_records": copy.records},
            )
        except BAD_CONTENT as exc:
            fork.broken = f"its copy of the parent's history: {reason_of(exc)}"
            return fork
        fork.copied = (self.parent, copy.records, len(live))
        fork.fidelity += copy.fidelity
        fork.turn_starts |= copy.turn_starts
        return fork


@register
class CodexReader(Reader):
    name = "codex"
    records_outcomes = False
    description = "Codex CLI rollout JSONL (~/.codex/sessions/**/rollout-*.jsonl, .zst too)"

    def sniff(self, path: Path, head: bytes) -> bool:
        rec = first_json_object(head)
        return (
            rec is not None
            and "payload" in rec
            and str(rec.get("type"))
            in {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
        )

    def read(self, path: Path) -> Iterator[ReadItem]:
        yield from rollouts_from_records(iter_json_records(path), path.stem)

    def session_key(self, path: Path, head: bytes) -> str | None:
        """A rollout file's session: the id of its first ``session_meta`` (files of one
        session are read together, one rollout per session)."""
        rec = first_json_object(head)
        payload = rec.get("payload") if rec and rec.get("type") == "session_meta" else None
        return str(payload["id"]) if isinstance(payload, dict) and payload.get("id") else None

    def read_files(self, paths: list[Path]) -> Iterator[ReadItem]:
        """The files of one session as one stream (last, then first timestamp order); a
        record another file already holds (a snapshot: the same visible content at the same
        time, ``codex_sessions.record_identity``) is read once, the repeat counted."""
        records, where = merged_records(paths, record_identity, per_file_repeats=True)
        several = len(paths) > 1
        for pos, _, reason, raw in records:
            if raw == REPEAT:
                yield located(Skipped(pos, reason), where, several)
        fresh = [r for r in records if r[3] != REPEAT]
        for item in rollouts_from_records(fresh, paths[0].stem):
            yield located(item, where, several)


def _record(s: _Session, rtype: str, payload: dict, line: int | None) -> str | None:
    """Apply one record to the session; returns a skip reason if it adds nothing."""
    kind = payload.get("type")
    if rtype == "event_msg":
        if kind == "thread_rolled_back":
            s.flush()
            _rollback(s, int(payload.get("num_turns") or 0), line)
            return None
        if kind == "token_count":
            s.report_usage(payload.get("info"))
        elif kind == "agent_message":
            s.announced.append(str(payload.get("message")))
        return f"event_msg/{kind}: UI event, repeats or annotates the model input"
    if rtype == "turn_context":
        s.flush()
        if payload.get("model") and payload["model"] not in s.models:
            s.models.append(payload["model"])
        return None
    if rtype == "compacted":
        s.flush()
        _compaction(s, payload, line)
        return None
    if rtype != "response_item":
        return f"'{rtype}' record: not model input"
    if kind == "ghost_snapshot":
        return "response_item/ghost_snapshot: undo bookkeeping, not model input"
    if _is_output(payload):
        if s.outputs and not s.continues_response():
            s.flush()
        if kind == "message":
            s.notice_message(content_text(payload.get("content")))
        s.call.line = s.call.line or line
        s.call.add(payload)
        if kind == "web_search_call":
            s.web_search(line)
        return None
    m = _input_message(payload)
    if m is None:
        return f"response_item/{kind}: not a message or call seam knows"
    m.id = f"L{line}"
    if s.holds_output(m):
        return None
    s.flush()
    if m.role == "tool" and not s.builder.is_open(m.fields["tool_call_id"]):
        return f"response_item/{kind} for a call that is not open in this session"
    event = s.append_input(m)
    if (
        event is not None
        and m.role == "user"
        and not m.content.lstrip().startswith(INJECTED_PREFIXES)
    ):
        s.turn_starts.add(event.id)
    return None


def _compaction(s: _Session, payload: dict, line: int | None) -> None:
    history = payload.get("replacement_history")
    meta = {
        k: payload[k]
        for k in ("window_id", "window_number", "previous_window_id", "first_window_id")
        if k in payload
    }
    meta["line"] = line
    rewrite_id = f"compacted@{line}"
    if isinstance(history, list):
        new, others = history_messages(history)
        if others:
            meta["not_context_items"] = others
        for i, m in enumerate(new):
            m.id = f"L{line}.{i}"
        items = ([Keep(id=s.base_id)] if s.base_id else []) + s.builder.match(
            new, with_reasoning=True
        )
        meta["remote"] = any("opaque" in m.fields.get("meta", {}) for m in new)
        if meta["remote"]:
            s.fidelity.append(
                _fidelity(
                    "opaque_summary",
                    rewrite_id,
                    "remote compaction: the summary is encrypted by the provider",
                )
            )
    else:
        kept = [Keep(id=m.id) for m in s.builder.live_messages() if m.role in ("system", "user")]
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
    s.builder.rewrite("compaction", "budget", items, id=rewrite_id, meta=meta)
    s.end_usage_span()


def _rollback(s: _Session, turns: int, line: int | None) -> None:
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
    s.end_usage_span()


def _finish(s: _Session, session_id: str, ids: UniqueNames) -> Iterator[ReadItem]:
    try:
        s.flush()
        s.apply_usage()
    except BAD_CONTENT as exc:
        s.broken = s.broken or reason_of(exc)
    if s.broken:
        yield Rejected(s.first, f"session {session_id}: {s.broken}", records=s.records)
        return
    if not s.builder.has_calls():
        own = f"session {session_id} has no model call ({s.records} records)"
        if s.copied:
            source, copied, _ = s.copied
            own = (
                f"session {session_id}, a fork of {source}, has no model call of its own "
                f"({s.records} records, {copied} of them its copy of the parent's history)"
            )
        yield Rejected(s.first, own, records=s.records)
        return
    meta = {
        k: s.meta[k]
        for k in ("cwd", "cli_version", "originator", "forked_from_id")
        if s.meta.get(k)
    }
    meta["session_id"] = session_id
    if len(s.models) > 1:
        meta["models"] = s.models
    if s.resumed:
        meta["resumed"] = s.resumed
    if s.copied:
        source, copied, messages = s.copied
        meta["forked"] = {"from": source, "copied_records": copied, "copied_messages": messages}
    # Codex sends its tool definitions with every request and never logs them.
    meta["fidelity"] = [
        _fidelity("missing_tool_schemas", None, "Codex does not log the tools it sends"),
        *s.fidelity,
    ]
    parent = fork_parent(s.meta)
    rollout_id = ids.claim(session_id)
    try:
        rollout = s.builder.build(
            rollout_id=rollout_id,
            task_id=session_id,
            source=CodexReader.name,
            model=s.models[0] if s.models else None,
            meta=meta,
            parent_rollout_id=parent,
        )
    except BAD_CONTENT as exc:
        yield Rejected(s.first, f"session {rollout_id}: {reason_of(exc)}", records=s.records)
        return
    yield Accepted(rollout, s.first, records=s.records)
