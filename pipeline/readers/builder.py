"""``RolloutBuilder`` replays a format's records into canonical events.

It keeps the live context (the ids a rewrite can ``Keep``) and the tool calls
still waiting for a result, so each reader only says *what happened* (a message, a
tool result, a rewrite) and the pairing rules of ``schemas/rollout.py`` hold by
construction. Two repairs are made, both recorded in ``Rollout.meta``, never silent:

- a tool call id reused inside one rollout (replayed demonstrations do this) is renamed
  ``<id>#<n>`` and later results for that id go to the newest call;
- with ``fill_missing_results`` (formats whose client sends a placeholder itself when a
  result is missing, e.g. Claude Code after an interrupted tool), a call still
  unanswered when a message of one of ``fill_before`` roles (or a rewrite, or the end of
  a rollout that has later calls) arrives gets the result ``[no tool result recorded]``,
  flagged ``meta.synthesized``; with ``fill_at_call`` that result is placed right after
  the call (and its recorded results), where a client that normalizes its history
  (Codex) inserts it, instead of where the gap was noticed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.readers.common import UniqueNames, as_arguments, content_text
from schemas.rollout import Keep, MessageEvent, RewriteEvent, Rollout

MISSING_RESULT = "[no tool result recorded]"


@dataclass
class Msg:
    """A message as a reader sees it, before it gets its final id in a rollout."""

    role: str
    content: str = ""
    id: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def msg(role: str, content: str = "", id: str | None = None, **fields: Any) -> Msg:
    return Msg(role, content, id, {k: v for k, v in fields.items() if v is not None})


def as_msg(m: MessageEvent) -> Msg:
    """A built message as a new one (e.g. a copied history carried into another rollout's
    context), with its id and fields."""
    return Msg(
        m.role,
        m.content,
        m.id,
        m.model_dump(exclude_none=True, exclude={"type", "id", "role", "content"}),
    )


class RolloutBuilder:
    """Replays one rollout's messages and rewrites into canonical events."""

    def __init__(
        self,
        fill_missing_results: bool = False,
        fill_before: tuple[str, ...] = ("assistant", "user", "system"),
        fill_at_call: bool = False,
    ) -> None:
        self.events: list[MessageEvent | RewriteEvent] = []
        self.messages: dict[str, MessageEvent] = {}
        self.live: list[str] = []
        self.last_call: MessageEvent | None = None
        self._position: dict[str, int] = {}
        self._ids = UniqueNames()
        self._call_ids = UniqueNames()
        self._alias: dict[str, str] = {}
        self._open: dict[str, str] = {}
        self._fill = fill_missing_results
        self._fill_before = fill_before
        self._fill_at_call = fill_at_call
        self._synthesized = 0
        self._renamed: dict[str, str] = {}

    def has_calls(self) -> bool:
        return self.last_call is not None

    def resolve(self, call_id: str) -> str:
        """The id a source tool-call id has in this rollout (after any renaming)."""
        return self._alias.get(call_id, call_id)

    def is_open(self, call_id: str) -> bool:
        return self.resolve(call_id) in self._open

    def append(self, m: Msg) -> MessageEvent | None:
        """Append a message; a tool result whose call is not open returns ``None``."""
        if self._fill and m.role in self._fill_before:
            self.fill_missing_results()
        event = self._event(m, answer=True)
        if event is not None:
            self._position[event.id] = len(self.events)
            self.events.append(event)
            if event.role == "assistant":
                self.last_call = event
            self.live.append(event.id)
        return event

    def update(self, message_id: str, **changes: Any) -> None:
        """Replace fields of an appended message (e.g. token ids that arrive after it)."""
        if message_id not in self._position:
            raise ValueError(
                f"message {message_id} is not an appended message and cannot be updated"
            )
        old = self.messages[message_id]
        new = MessageEvent.model_validate({**old.model_dump(exclude_none=True), **changes})
        self.messages[message_id] = new
        self.events[self._position[message_id]] = new
        if self.last_call is old:
            self.last_call = new

    def fill_missing_results(self, keep_open: frozenset = frozenset()) -> None:
        for call_id in [c for c in self._open if c not in keep_open]:
            placeholder = msg(
                "tool",
                MISSING_RESULT,
                id=f"{call_id}:no-result",
                tool_call_id=call_id,
                meta={"synthesized": "the source records no result for this call"},
            )
            if self._fill_at_call:
                self._insert_after_call(placeholder, self._open[call_id])
            else:
                self.append(placeholder)
            self._synthesized += 1

    def _insert_after_call(self, m: Msg, call_msg_id: str) -> None:
        """Insert a result right after its call and the call's results so far, in the
        events and in the live context. Only used before any later call or rewrite (the
        gap is filled then), so nothing replayed so far saw the other order."""
        event = self._event(m, answer=True)
        if event is None:
            return
        answers = {c.id for c in self.messages[call_msg_id].tool_calls}

        def answers_call(e: object) -> bool:
            return isinstance(e, MessageEvent) and e.role == "tool" and e.tool_call_id in answers

        at = self._position[call_msg_id] + 1
        while at < len(self.events) and answers_call(self.events[at]):
            at += 1
        self.events.insert(at, event)
        for i in range(at, len(self.events)):
            if self.events[i].id in self._position or i == at:
                self._position[self.events[i].id] = i
        j = self.live.index(call_msg_id) + 1  # an open call is live: rewrites fill first
        while j < len(self.live) and answers_call(self.messages.get(self.live[j])):
            j += 1
        self.live.insert(j, event.id)

    def rewrite(
        self,
        reason: str,
        trigger: str,
        items: Sequence[Keep | Msg],
        id: str | None = None,
        meta: dict | None = None,
    ) -> RewriteEvent:
        """Replace the live context by ``items`` (kept ids and new messages, in order)."""
        if self._fill:
            self.fill_missing_results()
        context: list[Keep | MessageEvent] = []
        for item in items:
            if isinstance(item, Keep):
                context.append(item)
            else:
                new = self._event(item, answer=False)
                if new is not None:
                    context.append(new)
        event = RewriteEvent(
            id=self._ids.claim(id or f"rewrite-{len(self.events)}"),
            reason=reason,
            trigger=trigger,
            context=context,
            meta=meta or {},
        )
        self.events.append(event)
        self.live = [item.id for item in context]
        return event

    def match(self, candidates: list[Msg], with_reasoning: bool = False) -> list[Keep | Msg]:
        """Map a full new context onto the live one, in order: a candidate equal to a live
        message becomes ``Keep`` of it, anything else stays a new message. With
        ``with_reasoning``, an assistant message is only equal if its reasoning is too (for
        formats whose new context says exactly which reasoning it holds, e.g. Codex
        ``replacement_history``: keeping a message by id would bring back reasoning the
        new context dropped)."""
        items: list[Keep | Msg] = []
        pos = 0
        for cand in candidates:
            key = self._key(cand, with_reasoning)
            hit = next(
                (
                    j
                    for j in range(pos, len(self.live))
                    if self._key(self.messages[self.live[j]], with_reasoning) == key
                ),
                None,
            )
            if hit is None:
                items.append(cand)
            else:
                items.append(Keep(id=self.live[hit]))
                pos = hit + 1
        return items

    def live_messages(self) -> list[MessageEvent]:
        return [self.messages[i] for i in self.live]

    def build(self, **fields: Any) -> Rollout:
        meta = dict(fields.pop("meta", None) or {})
        if self._fill:
            last = self.last_call
            self.fill_missing_results(
                frozenset(c.id for c in last.tool_calls) if last else frozenset()
            )
        if self._synthesized:
            meta["synthesized_tool_results"] = self._synthesized
        if self._renamed:
            meta["renamed_tool_call_ids"] = dict(self._renamed)
        return Rollout(events=self.events, meta=meta, **fields)

    def _key(self, m: MessageEvent | Msg, with_reasoning: bool = False) -> tuple:
        """What makes two messages the same context item (ids and metadata aside)."""
        if isinstance(m, MessageEvent):
            calls = tuple((c.name, c.arguments) for c in m.tool_calls)
            key: tuple = m.role, m.content.strip(), calls, m.tool_call_id, _opaque(m.meta)
            reasoning = m.reasoning
        else:
            calls = tuple(
                (str(c.get("name") or "unknown"), as_arguments(c.get("arguments")))
                for c in m.fields.get("tool_calls", [])
            )
            call_id = m.fields.get("tool_call_id")
            key = (
                m.role,
                m.content.strip(),
                calls,
                self._alias.get(call_id, call_id) if call_id is not None else None,
                _opaque(m.fields.get("meta") or {}),
            )
            reasoning = m.fields.get("reasoning")
        return (*key, (reasoning or "").strip()) if with_reasoning else key

    def _event(self, m: Msg, answer: bool) -> MessageEvent | None:
        fields = dict(m.fields)
        if m.role == "tool":
            raw_id = fields.get("tool_call_id")
            call_id = self._alias.get(raw_id, raw_id) if raw_id is not None else None
            if call_id in self._open:
                del self._open[call_id]
            elif answer:
                return None
            fields["tool_call_id"] = call_id
        msg_id = self._ids.claim(m.id or f"m{len(self.messages)}")
        if fields.get("tool_calls"):
            fields["tool_calls"] = [
                self._call(c, msg_id, i) for i, c in enumerate(fields["tool_calls"])
            ]
        event = MessageEvent(id=msg_id, role=m.role, content=m.content or "", **fields)
        self.messages[msg_id] = event
        for call in event.tool_calls:
            self._open[call.id] = msg_id
        return event

    def _call(self, call: dict, msg_id: str, index: int) -> dict:
        original = str(call.get("id") or f"{msg_id}:call{index}")
        new_id = self._call_ids.claim(original)
        self._alias[original] = new_id
        if new_id != original:
            self._renamed[new_id] = original
        return {
            "id": new_id,
            "name": str(call.get("name") or "unknown"),
            "arguments": as_arguments(call.get("arguments")),
        }


def _opaque(meta: dict) -> tuple | None:
    """An opaque item (its text a placeholder) equals only the same opaque item: two
    encrypted summaries share their placeholder but not their ciphertext."""
    if "opaque" not in meta:
        return None
    return meta["opaque"], meta.get("encrypted_content")


OPENAI_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}


def openai_message(m: dict, id: str | None = None, meta: dict | None = None) -> Msg:
    """An OpenAI chat message (``role``, ``content``, ``tool_calls``, ``tool_call_id``)."""
    role = OPENAI_ROLES.get(str(m.get("role")))
    if role is None:
        raise ValueError(f"unknown message role {m.get('role')!r}")
    fields: dict[str, Any] = {"meta": meta or None}
    if role == "assistant":
        calls = [
            {
                "id": c.get("id"),
                "name": (c.get("function") or {}).get("name"),
                "arguments": (c.get("function") or {}).get("arguments"),
            }
            for c in m.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        fields["tool_calls"] = calls or None
        reasoning = m.get("reasoning_content") or m.get("reasoning") or m.get("thinking")
        fields["reasoning"] = content_text(reasoning) or None
    elif role == "tool":
        fields["tool_call_id"] = str(m.get("tool_call_id") or m.get("name") or "")
        fields["name"] = m.get("name")
    return msg(role, content_text(m.get("content")), id=id, **fields)
