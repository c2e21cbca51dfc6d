"""OpenHands event streams: V0 event lists (``action`` / ``observation`` events, as
``save_trajectory_path`` and evaluation ``output.jsonl`` ``history`` write them) and V1
software-agent-sdk events (``kind``-tagged, one per JSONL line or in a JSON list).

An agent action that carries ``tool_call_metadata`` (V0) or an ``ActionEvent`` (V1) is
part of one call; actions of one LLM response (same ``model_response.id`` /
``llm_response_id``) are one assistant message with all their tool calls. Observations
answer their ``tool_call_id``. ``TokenEvent`` ids go to the call they belong to.

Condensation (V0 action ``condensation``, V1 ``Condensation``) is a rewrite replayed the
way OpenHands builds its view: every event so far minus all forgotten ids, the summary
inserted at ``summary_offset``, and tool calls / results whose partner was forgotten
dropped. Events the LLM never sees (state changes, recalls, pauses) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.readers import Accepted, Reader, ReadItem, Rejected, Skipped, register
from pipeline.readers.builder import Msg, RolloutBuilder, msg
from pipeline.readers.common import (
    BAD_CONTENT,
    content_text,
    file_digest,
    first_json_object,
    iter_json_records,
    load_json,
    read_head,
    reason_of,
)
from schemas.rollout import Keep

V0_SKIP = {
    "change_agent_state",
    "agent_state_changed",
    "recall",
    "null",
    "condensation_request",
    "pause",
    "resume",
}
V1_SKIP = {
    "ConversationStateUpdateEvent",
    "PauseEvent",
    "CondensationRequest",
    "LLMCompletionLogEvent",
    "CondensationSummaryEvent",
    "ConversationErrorEvent",
    "StreamingDeltaEvent",
}


class _Replay:
    """Replays events of one conversation into a builder."""

    def __init__(self) -> None:
        self.builder = RolloutBuilder()
        self.order: list[str] = []
        self.event_msgs: dict[str, list[str]] = {}
        self.forgotten: set[str] = set()
        self.pending: tuple[str, list[dict], dict] | None = None
        self.tokens: dict | None = None
        self.model: str | None = None
        self.tools: list[dict] = []
        self.used = 0

    def add(self, event_id: str, messages: list[Msg]) -> None:
        self.order.append(event_id)
        self.event_msgs[event_id] = []
        for m in messages:
            appended = self.builder.append(m)
            if appended is None:  # a tool result whose call is not open: the builder counts it
                continue
            self.event_msgs[event_id].append(appended.id)
            if appended.role == "assistant" and self.tokens is not None:
                self._attach(appended.id, self.tokens)
                self.tokens = None

    def action(
        self, event_id: str, response_id: str, text: str, reasoning: str | None, call: dict | None
    ) -> None:
        """Collect actions of one LLM response; flushed when anything else arrives."""
        if self.pending and self.pending[0] != response_id:
            self.flush()
        if self.pending is None:
            self.pending = (response_id, [], {"ids": [], "text": text, "reasoning": reasoning})
        if call is not None and all(c.get("id") != call.get("id") for c in self.pending[1]):
            self.pending[1].append(call)
        self.pending[2]["ids"].append(event_id)

    def flush(self) -> None:
        if self.pending is None:
            return
        response_id, calls, info = self.pending
        self.pending = None
        m = msg(
            "assistant",
            info["text"],
            id=f"response-{response_id}",
            reasoning=info["reasoning"] or None,
            tool_calls=calls or None,
            finish_reason="tool_calls" if calls else None,
        )
        self.add(info["ids"][0], [m])
        for other in info["ids"][1:]:
            self.order.append(other)
            self.event_msgs[other] = []

    def token_ids(self, prompt: list, response: list) -> None:
        """A ``TokenEvent``: for the call just made, else for the next one."""
        self.flush()
        ids = {"prompt_ids": list(prompt) or None, "output_ids": list(response)}
        live = self.builder.live_messages()
        if live and live[-1].role == "assistant" and live[-1].output_ids is None:
            self._attach(live[-1].id, ids)
        else:
            self.tokens = ids

    def _attach(self, message_id: str, ids: dict) -> None:
        if ids.get("output_ids"):
            self.builder.update(message_id, **{k: v for k, v in ids.items() if v is not None})

    def condense(
        self, event_id: str, forgotten: set[str], summary: str | None, offset: Any, trigger: str
    ) -> None:
        """The view OpenHands builds: events not forgotten, the summary at ``summary_offset``
        (an index into those events), then flattened to the messages of each event."""
        self.flush()
        self.forgotten |= forgotten
        view: list[str | Msg] = [e for e in self.order if e not in self.forgotten]
        if summary:
            at = offset if isinstance(offset, int) and 0 <= offset <= len(view) else len(view)
            view.insert(
                at,
                msg("user", summary, id=f"{event_id}:summary", meta={"condensation_summary": True}),
            )
        items: list[Keep | Msg] = []
        for entry in view:
            items.extend(
                [entry]
                if isinstance(entry, Msg)
                else [Keep(id=m) for m in self.event_msgs.get(entry, [])]
            )
        self.builder.rewrite(
            "compaction",
            trigger,
            self._drop_unpaired(items),
            id=f"condensation-{event_id}",
            meta={"forgotten_events": len(forgotten), "summary_offset": offset},
        )

    def _drop_unpaired(self, items: list) -> list:
        """OpenHands drops tool calls and results whose partner is not in the view."""
        messages = self.builder.messages
        kept = [messages[i.id] for i in items if isinstance(i, Keep)]
        answered = {m.tool_call_id for m in kept if m.role == "tool"}
        calls = {c.id for m in kept for c in m.tool_calls}
        out = []
        for item in items:
            m = messages.get(item.id) if isinstance(item, Keep) else None
            if m is not None and m.role == "tool" and m.tool_call_id not in calls:
                continue
            if m is not None and m.tool_calls and not any(c.id in answered for c in m.tool_calls):
                continue
            out.append(item)
        return out


def _v0(replay: _Replay, e: dict) -> str | None:
    """One V0 event; returns a skip reason if the LLM never saw it."""
    eid, kind = str(e.get("id")), e.get("action") or e.get("observation")
    args = e.get("args") or {}
    meta = e.get("tool_call_metadata") or {}
    if kind in V0_SKIP:
        return f"{'action' if 'action' in e else 'observation'} '{kind}' (not sent to the model)"
    if e.get("action") == "condensation":
        ids = set(map(str, args.get("forgotten_event_ids") or []))
        if args.get("forgotten_events_start_id") is not None:
            start, end = (
                int(args["forgotten_events_start_id"]),
                int(args["forgotten_events_end_id"]),
            )
            ids |= {str(i) for i in range(start, end + 1)}
        replay.condense(eid, ids, args.get("summary"), args.get("summary_offset"), "budget")
    elif e.get("action") == "system":
        replay.flush()
        replay.tools = [t for t in args.get("tools") or [] if isinstance(t, dict)]
        replay.add(
            eid,
            [
                msg(
                    "system",
                    content_text(args.get("content") or e.get("message")),
                    id=f"event-{eid}",
                )
            ],
        )
    elif "action" in e and e.get("source") == "agent":
        response = meta.get("model_response") or {}
        choice = ((response.get("choices") or [{}])[0] or {}).get("message") or {}
        replay.model = replay.model or response.get("model")
        call = next(
            (
                {
                    "id": c.get("id"),
                    "name": (c.get("function") or {}).get("name"),
                    "arguments": (c.get("function") or {}).get("arguments"),
                }
                for c in choice.get("tool_calls") or []
                if c.get("id") == meta.get("tool_call_id")
            ),
            None,
        )
        if meta and call is None:
            call = {
                "id": meta.get("tool_call_id"),
                "name": meta.get("function_name"),
                "arguments": args,
            }
        text = (
            choice.get("content")
            if meta
            else (args.get("content") or e.get("message") or args.get("thought"))
        )
        replay.action(
            eid,
            str(response.get("id") or eid),
            content_text(text),
            choice.get("reasoning_content"),
            call,
        )
    elif "action" in e:
        replay.flush()
        replay.add(
            eid,
            [msg("user", content_text(args.get("content") or e.get("message")), id=f"event-{eid}")],
        )
    else:
        replay.flush()
        if meta.get("tool_call_id") and not replay.builder.is_open(str(meta["tool_call_id"])):
            return f"observation '{kind}' for a tool call not in this file"
        body = content_text(e.get("content"))
        m = (
            msg(
                "tool",
                body,
                id=f"event-{eid}",
                tool_call_id=str(meta["tool_call_id"]),
                name=meta.get("function_name"),
            )
            if meta.get("tool_call_id")
            else msg("user", body, id=f"event-{eid}", meta={"observation": kind})
        )
        replay.add(eid, [m])
    return None


def _v1(replay: _Replay, e: dict) -> str | None:
    """One V1 (software-agent-sdk) event; returns a skip reason if the LLM never saw it."""
    eid, kind = str(e.get("id")), e.get("kind")
    if kind in V1_SKIP:
        return f"{kind} (not sent to the model)"
    if kind == "ActionEvent":
        call = e.get("tool_call") or {}
        replay.action(
            eid,
            str(e.get("llm_response_id") or eid),
            content_text(e.get("thought")),
            e.get("reasoning_content"),
            {
                "id": call.get("id") or e.get("tool_call_id"),
                "name": call.get("name") or e.get("tool_name"),
                "arguments": call.get("arguments"),
            },
        )
        return None
    if kind == "TokenEvent":
        replay.token_ids(e.get("prompt_token_ids") or [], e.get("response_token_ids") or [])
        return None
    if kind == "Condensation":
        replay.condense(
            eid,
            set(map(str, e.get("forgotten_event_ids") or [])),
            e.get("summary"),
            e.get("summary_offset"),
            "budget",
        )
        return None
    replay.flush()
    if kind == "SystemPromptEvent":
        replay.tools = [t for t in e.get("tools") or [] if isinstance(t, dict)]
        replay.add(eid, [msg("system", content_text(e.get("system_prompt")), id=f"event-{eid}")])
    elif kind == "MessageEvent":
        llm = e.get("llm_message") or {}
        role = "assistant" if e.get("source") == "agent" else "user"
        replay.add(
            eid,
            [
                msg(
                    role,
                    content_text(llm.get("content")),
                    id=f"event-{eid}",
                    reasoning=llm.get("reasoning_content") if role == "assistant" else None,
                )
            ],
        )
    elif kind in ("ObservationEvent", "AgentErrorEvent", "UserRejectObservation") and e.get(
        "tool_call_id"
    ):
        if not replay.builder.is_open(str(e["tool_call_id"])):
            return f"{kind} for a tool call not in this file"
        obs = e.get("observation") or {}
        body = (
            content_text(obs.get("content"))
            if obs
            else str(e.get("error") or e.get("rejection_reason") or "")
        )
        replay.add(
            eid,
            [
                msg(
                    "tool",
                    body,
                    id=f"event-{eid}",
                    tool_call_id=str(e["tool_call_id"]),
                    name=e.get("tool_name"),
                    meta={"kind": kind},
                )
            ],
        )
    else:
        return f"{kind} (not sent to the model)"
    return None


@register
class OpenHandsReader(Reader):
    name = "openhands"
    records_outcomes = False
    description = (
        "OpenHands V0 event lists / eval output.jsonl histories and V1 (software-agent-sdk) events"
    )

    def sniff(self, path: Path, head: bytes) -> bool:
        text = head.lstrip()
        if text.startswith(b"["):
            return (
                b'"action"' in head or b'"observation"' in head or b'"kind"' in head
            ) and b'"source"' in head
        rec = first_json_object(head)
        if rec is None:
            return False
        return ("kind" in rec and "source" in rec and "id" in rec) or isinstance(
            rec.get("history"), list
        )

    def read(self, path: Path) -> Iterator[ReadItem]:
        if (
            path.name.endswith((".json", ".json.gz", ".json.zst"))
            or read_head(path, 256).lstrip()[:1] == b"["
        ):
            try:
                doc = load_json(path)
            except (ValueError, OSError) as exc:
                yield Rejected(None, f"cannot read OpenHands file: {exc}")
                return
            history = (
                doc if isinstance(doc, list) else (doc.get("events") or doc.get("history") or [])
            )
            yield from self._conversation(
                history, [None] * len(history), f"{path.stem}-{file_digest(path)}", {}
            )
            return
        events: list[dict] = []
        lines: list[int | None] = []
        for line, rec, error, raw in iter_json_records(path):
            if error:
                yield Rejected(line, error, raw)
            elif isinstance(rec.get("history"), list):
                task = str(rec.get("instance_id") or f"{path.stem}:{line}")
                meta = {
                    k: rec[k] for k in ("instance_id", "instruction") if isinstance(rec.get(k), str)
                }
                yield from self._conversation(rec["history"], None, task, meta, line)
            else:
                events.append(rec)
                lines.append(line)
        if events:
            yield from self._conversation(events, lines, f"{path.stem}-{file_digest(path)}", {})

    def _conversation(
        self, events: list, lines: list | None, rollout_id: str, meta: dict, line: int | None = None
    ) -> Iterator[ReadItem]:
        """One rollout from ``events``; with ``lines`` each event is one input record (a
        skipped event is reported on its own), without it the whole list is ``line``."""
        replay = _Replay()
        skipped: list[Skipped] = []
        first = lines[0] if lines else line
        try:
            for i, e in enumerate(events):
                if not isinstance(e, dict):
                    raise ValueError(f"event is not an object: {str(e)[:80]}")
                reason = _v1(replay, e) if "kind" in e else _v0(replay, e)
                if reason:
                    skipped.append(Skipped(lines[i] if lines else line, reason))
            replay.flush()
            if lines is None and skipped:
                meta = {**meta, "skipped_events": len(skipped)}
            rollout = replay.builder.build(
                rollout_id=rollout_id,
                task_id=rollout_id,
                source=self.name,
                model=replay.model,
                tools=replay.tools,
                meta=meta,
            )
        except BAD_CONTENT as exc:
            yield Rejected(
                first,
                f"conversation {rollout_id}: {reason_of(exc)}",
                records=len(events) if lines else 1,
            )
            return
        if lines is not None:
            yield from skipped
        yield Accepted(
            rollout, first, records=len(events) - len(skipped) if lines is not None else 1
        )
