"""OpenAI-style message logs, in the two shapes people keep them.

``openai-messages``: one conversation per line (``messages``, optional ``tools``,
``reward``, ``resolved``, ``task_id``, ``id``/``rollout_id``, ``model``). Append-only: the
messages are the rollout. A file that is one JSON document is read whole, never line
by line: a plain list of chat messages (older mini-swe-agent trajectories, many
exports) is one conversation, a list of conversation objects is one per element, and a
pretty-printed conversation object is one.

``chat-completions``: one model call per line, as an OpenAI-compatible gateway or proxy
logs it: the request (``request`` or ``body``, or the record itself: ``messages``,
``tools``, sampling parameters) and the response (``response`` or the record:
``choices[0].message``, optional ``logprobs``, vLLM ``prompt_token_ids`` and
``choices[0].token_ids``; ``task_id`` and a ``seam`` object as ``seam gateway`` writes
them: ``seam.kind == "summary"`` marks a summary call, ``seam.delivered == false`` a call
whose client was gone (skipped); its delta records, which store what a call adds to the
previous call of its session, are rebuilt whole first: ``pipeline/readers/call_delta.py``). Calls are grouped into rollouts by the ``group_by`` field (a
dotted path, ``--group-by`` on the command line); without one, by the first field
found among ``DEFAULT_GROUP_FIELDS``, else by the first system and user message. In a
group, each request is compared with the live context (previous request plus its
response): an extension appends, anything else is a rewrite to the request, unchanged
messages kept by id. When the previous response's text reappears inside the rewritten
context, that call produced the summary and is marked ``kind="summary"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.readers import Accepted, Reader, ReadItem, Rejected, Skipped, call_delta, register
from pipeline.readers.builder import OPENAI_ROLES, Msg, RolloutBuilder, openai_message
from pipeline.readers.common import (
    BAD_CONTENT,
    UniqueNames,
    file_digest,
    first_array_item,
    first_json_object,
    is_json_document,
    iter_json_records,
    load_json,
    read_head,
    reason_of,
    stable_id,
)
from schemas.rollout import Keep

DEFAULT_GROUP_FIELDS = (
    "session_id",
    "conversation_id",
    "rollout_id",
    "trajectory_id",
    "metadata.session_id",
    "request.metadata.session_id",
    "body.metadata.session_id",
    "request.user",
    "body.user",
)
UNDELIVERED = (
    "call not delivered: the client was gone before its answer was sent (seam.delivered false)"
)
FINISH = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
}


def _path(rec: dict, dotted: str) -> Any:
    value: Any = rec
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def chat_messages(raw: Any, prefix: str) -> list[Msg]:
    """A list of OpenAI chat messages (ids ``<prefix>.<index>``)."""
    if not isinstance(raw, list):
        raise ValueError("'messages' is not a list")
    return [openai_message(m, id=f"{prefix}.{i}") for i, m in enumerate(raw) if isinstance(m, dict)]


def _is_message(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and isinstance(item.get("role"), str)
        and item["role"] in OPENAI_ROLES
    )


@register
class OpenAIMessagesReader(Reader):
    name = "openai-messages"
    description = (
        "JSONL, one conversation per line: {messages, tools?, reward?, task_id?}; "
        "or a JSON list of chat messages (one conversation)"
    )

    def sniff(self, path: Path, head: bytes) -> bool:
        first = first_array_item(head)
        if first is not None:
            # A plain message list, or a list of conversations.
            return _is_message(first) or (
                isinstance(first, dict)
                and isinstance(first.get("messages"), list)
                and "choices" not in first
            )
        rec = first_json_object(head)
        return (
            rec is not None
            and isinstance(rec.get("messages"), list)
            and "choices" not in rec
            and "response" not in rec
        )

    def read(self, path: Path) -> Iterator[ReadItem]:
        ids = UniqueNames()
        try:
            document = is_json_document(read_head(path, 1 << 16))
        except (OSError, EOFError, ValueError) as exc:
            yield Rejected(None, f"cannot read the file: {exc}")
            return
        if document:
            yield from self._document(path, ids)
            return
        for line, rec, error, raw in iter_json_records(path):
            if error:
                yield Rejected(line, error, raw)
                continue
            yield self._conversation(rec, f"L{line}", stable_id(raw.strip()), ids, line, raw)

    def _document(self, path: Path, ids: UniqueNames) -> Iterator[ReadItem]:
        try:
            doc = load_json(path)
        except ValueError as exc:
            yield Rejected(None, f"cannot read the JSON document: {exc}")
            return
        if isinstance(doc, list) and doc and all(_is_message(m) for m in doc):
            doc = {"messages": doc}  # a plain list of chat messages: one conversation
        convs = doc if isinstance(doc, list) else [doc]
        if not any(isinstance(c, dict) for c in convs):
            yield Rejected(None, "expected chat messages or conversation objects")
            return
        base = f"{path.name.split('.')[0]}-{file_digest(path)}"
        for i, rec in enumerate(convs):
            if not isinstance(rec, dict):
                yield Rejected(None, f"element {i}: expected a conversation object")
                continue
            fallback = base if len(convs) == 1 else f"{base}-{i}"
            yield self._conversation(rec, f"c{i}", fallback, ids, None, None)

    def _conversation(
        self,
        rec: dict,
        prefix: str,
        fallback_id: str,
        ids: UniqueNames,
        line: int | None,
        raw: str | None,
    ) -> ReadItem:
        """One conversation object (one record) → an accepted rollout or a rejection."""
        try:
            builder = RolloutBuilder()
            for m in chat_messages(rec.get("messages"), prefix):
                if builder.append(m) is None:
                    raise ValueError(f"tool message {m.id} answers no earlier tool call")
            rollout_id = ids.claim(str(rec.get("rollout_id") or rec.get("id") or fallback_id))
            reward = rec.get("reward")
            rollout = builder.build(
                rollout_id=rollout_id,
                task_id=str(rec.get("task_id") or rollout_id),
                source=self.name,
                model=rec.get("model"),
                tools=rec.get("tools") or [],
                reward=float(reward) if isinstance(reward, (int, float)) else None,
                resolved=rec.get("resolved") if isinstance(rec.get("resolved"), bool) else None,
                meta=rec.get("meta") if isinstance(rec.get("meta"), dict) else {},
            )
        except BAD_CONTENT as exc:
            return Rejected(line, reason_of(exc), raw)
        return Accepted(rollout, line)


@register
class ChatCompletionsReader(Reader):
    name = "chat-completions"
    description = (
        "JSONL, one chat-completions call per line (request + response), grouped into rollouts"
    )
    options = {"group_by": None}

    def sniff(self, path: Path, head: bytes) -> bool:
        rec = first_json_object(head)
        if not rec:
            return False
        request = rec.get("request") or rec.get("body") or rec
        response = rec.get("response") or rec
        if call_delta.is_delta(rec):  # a seam gateway log whose first full line was lost
            request = {"messages": rec["request_delta"].get("messages")}
        return (
            isinstance(request, dict)
            and isinstance(request.get("messages"), list)
            and isinstance(response, dict)
            and isinstance(response.get("choices"), list)
        )

    def read(self, path: Path) -> Iterator[ReadItem]:
        groups: dict[str, list[tuple[int | None, dict, str]]] = {}
        resolvers: dict[str, call_delta.Resolver] = {}  # per session of a seam gateway log
        for line, rec, error, raw in iter_json_records(path):
            if error:
                yield Rejected(line, error, raw)
                continue
            if call_delta.call_number(rec) is not None or call_delta.is_delta(rec):
                # seam gateway numbers its calls and may store one as a delta to its base.
                resolver = resolvers.setdefault(str(rec.get("session_id")), call_delta.Resolver())
                try:
                    rec = resolver.resolve(rec)
                except BAD_CONTENT as exc:
                    yield Rejected(line, reason_of(exc), raw)
                    continue
                resolver.accept(rec)
            if not call_delta.delivered(rec):
                yield Skipped(line, UNDELIVERED)
                continue
            try:
                key = self._group(rec)
            except BAD_CONTENT as exc:
                yield Rejected(
                    line, f"cannot tell which rollout this call belongs to: {reason_of(exc)}", raw
                )
                continue
            groups.setdefault(key, []).append((line, rec, raw))
        for key, calls in groups.items():
            yield from self._rollout(key, calls)

    def _group(self, rec: dict) -> str:
        fields = (
            [self.options["group_by"]] if self.options.get("group_by") else DEFAULT_GROUP_FIELDS
        )
        for name in fields:
            value = _path(rec, name)
            if value not in (None, ""):
                return str(value)
        request = rec.get("request") or rec.get("body") or rec
        firsts = [m for m in request.get("messages") or [] if isinstance(m, dict)][:2]
        return "conv-" + stable_id(*(str(m.get("content")) for m in firsts))

    def _rollout(self, key: str, calls: list[tuple[int | None, dict, str]]) -> Iterator[ReadItem]:
        builder = RolloutBuilder()
        first = calls[0][0]
        tools: list = []
        models: list[str] = []
        for line, rec, raw in calls:
            try:
                request = rec.get("request") or rec.get("body") or rec
                response = rec.get("response") or rec
                apply_request(builder, chat_messages(request.get("messages"), f"L{line}"), line)
                tools = tools or request.get("tools") or []
                model = response.get("model") or request.get("model")
                if model and model not in models:
                    models.append(model)
                out = self._response(response, line)
                seam = found if isinstance(found := rec.get("seam"), dict) else {}
                if seam.get("kind") == "summary":  # seam gateway: a compaction prompt was sent
                    out.fields["kind"] = "summary"
                builder.append(out)
            except BAD_CONTENT as exc:
                # The whole rollout goes, so the rejection stands for every call in it.
                yield Rejected(
                    line, f"call in rollout {key}: {reason_of(exc)}", raw, records=len(calls)
                )
                return
        task_id = calls[0][1].get("task_id")
        try:
            rollout = builder.build(
                rollout_id=key,
                task_id=str(task_id) if isinstance(task_id, (str, int)) and task_id != "" else key,
                source=self.name,
                model=models[0] if models else None,
                tools=tools,
                meta={"models": models} if len(models) > 1 else {},
            )
        except BAD_CONTENT as exc:
            yield Rejected(first, f"rollout {key}: {reason_of(exc)}", records=len(calls))
            return
        yield Accepted(rollout, first, records=len(calls))

    @staticmethod
    def _response(response: dict, line: int | None) -> Msg:
        choice = (response.get("choices") or [None])[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise ValueError("response has no choices[0].message")
        out = openai_message({**choice["message"], "role": "assistant"}, id=f"L{line}.response")
        out.fields["finish_reason"] = FINISH.get(str(choice.get("finish_reason")))
        output_ids = choice.get("token_ids") or choice.get("output_token_ids")
        prompt_ids = response.get("prompt_token_ids") or choice.get("prompt_token_ids")
        tokens = (choice.get("logprobs") or {}).get("content") or []
        logprobs: list[Any] = [t.get("logprob") for t in tokens if isinstance(t, dict)]
        if output_ids:
            out.fields["output_ids"] = list(output_ids)
            out.fields["prompt_ids"] = list(prompt_ids) if prompt_ids else None
            if logprobs and len(logprobs) == len(output_ids):
                out.fields["logprobs"] = [float(x) for x in logprobs]
        if logprobs and "logprobs" not in out.fields:
            out.fields.setdefault("meta", {})["logprobs"] = logprobs
        out.fields = {k: v for k, v in out.fields.items() if v is not None}
        return out


def apply_request(builder: RolloutBuilder, sent: list[Msg], line: int | None) -> None:
    """Append what a request adds to the live context, or rewrite to it (``line``: where
    the request is, recorded on the rewrite). Shared by the readers of per-call logs."""
    items = builder.match(sent)
    live = builder.live
    if len(items) >= len(live) and all(
        isinstance(it, Keep) and it.id == live[i] for i, it in enumerate(items[: len(live)])
    ):
        for m in sent[len(live) :]:
            if builder.append(m) is None:
                raise ValueError(f"tool message {m.id} answers no earlier tool call")
        return
    new = [it for it in items if not isinstance(it, Keep)]
    previous = builder.last_call
    meta: dict = {"line": line}
    if (
        previous is not None
        and previous.content.strip()
        and any(previous.content.strip() in m.content for m in new)
    ):
        builder.update(previous.id, kind="summary")
        meta["summary_call"] = previous.id
    if not new:
        reason = "truncation"
    elif meta.get("summary_call") or len(items) < len(live):
        reason = "compaction"
    else:
        reason = "edit"
    builder.rewrite(
        reason,
        "manual" if reason == "edit" else "budget",
        items,
        id=f"request@{line}",
        meta={**meta, "trigger_inferred": True},
    )
