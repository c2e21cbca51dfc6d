"""Incremental streaming: the engine's chunks reach a streaming harness as they arrive,
and the call is recorded, as a whole answer, when the stream completes.

When a harness asks ``stream: true`` and no Judge is in the loop, the gateway asks the
engine to stream too (``stream_options.include_usage``, and the token-id parameters: with
``return_token_ids`` vLLM puts the prompt's ids on the first chunk, ``prompt_token_ids``,
and each chunk's sampled ids and logprobs on its choice, ``token_ids`` and
``logprobs.content``). Each chunk is translated to the harness's dialect at once
(``OpenAIRelay``, ``AnthropicRelay``, ``ResponsesRelay``) and sent, while ``Assembler``
joins the chunks into the whole chat-completions answer the engine gives unstreamed
(text, reasoning, tool calls, token ids, logprobs, usage). That answer is recorded
exactly as an unstreamed call's (same record), and only then does the harness get the
stream's last event (``[DONE]``, ``message_stop``, ``response.completed``): in
``--durability sync`` an answer is complete only once its record is on disk.

- An engine error mid-stream (an error event, a cut connection, a timeout, an answer over
  ``--max-response-mb``, a stream that ends without its finish): the harness gets its
  dialect's error event; nothing is recorded.
- A harness that disconnects mid-stream: the gateway reads the engine's stream to its end
  and records the call with ``seam.delivered: false`` (left out of the build; its retry
  is no seam), as for a client gone before an unstreamed answer.
- An engine that answers a streamed request with one JSON body (it does not stream): that
  answer is recorded and replayed as events, as with a Judge.

Anthropic ``tool_use`` input arrives whole, in one ``input_json_delta`` when the tool call
is complete: the gateway checks it is a JSON object first, as for an unstreamed answer
(a tool input is an object; an engine's malformed arguments are sent as
``{"_raw_arguments": text}``, never as a half-parsed object).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web

from pipeline.gateway.dialects import (
    openai_chunks,
    openai_to_anthropic,
    openai_to_responses,
    sse_event,
    tool_input,
)
from pipeline.gateway.upstream import Response, UpstreamError

if TYPE_CHECKING:
    from pipeline.gateway.server import Gateway, Session

STREAM_OPTIONS = {"include_usage": True}


class StreamFailed(Exception):
    """The engine's stream broke off; the message says how (sent to the harness)."""


# ---------------------------------------------------------------- reading the engine


async def sse_data(content: Any, cap: int) -> AsyncIterator[bytes]:
    """The ``data`` of each server-sent event in ``content`` (anything with ``iter_any()``:
    the engine's ``upstream.Response``; an event's ``data:`` lines joined by newlines, per
    the SSE format), ``b"[DONE]"`` included. Read in pieces as they come, not by line (a
    first chunk with 100k prompt ids is one line of ~600 KB); more than ``cap`` bytes in
    all is a ``StreamFailed``. Lines end in LF or CRLF; ``event:``, ``id:``, ``retry:``
    and comments carry nothing a chat stream needs."""
    buffer, size = b"", 0
    data: list[bytes] = []
    async for piece in content.iter_any():
        size += len(piece)
        if size > cap:
            raise StreamFailed(f"the engine's answer is over {cap:,} bytes")
        buffer += piece
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            line = line.removesuffix(b"\r")
            if not line:  # a blank line ends an event
                if data:
                    yield b"\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
    line = buffer.removesuffix(b"\r")  # the last event, when the stream ends without a blank line
    if line.startswith(b"data:"):
        data.append(line[6:] if line.startswith(b"data: ") else line[5:])
    if data:
        yield b"\n".join(data)


def _choice(chunk: dict) -> dict | None:
    choices = chunk.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def engine_error(chunk: dict) -> str | None:
    """The message of an error event in the engine's stream (vLLM: ``{"error": {...}}``;
    older servers: ``{"object": "error", "message": ...}``), or None for a chunk."""
    error = chunk.get("error")
    if error is not None:
        return str(error.get("message") if isinstance(error, dict) else error)
    if chunk.get("object") == "error":
        return str(chunk.get("message"))
    return None


class Assembler:
    """Joins ``chat.completion.chunk`` objects into the whole chat-completions answer, in
    the form an engine answers unstreamed: ``{id, object: "chat.completion", created,
    model, choices: [{index, message: {role, content, reasoning?, tool_calls?},
    finish_reason, stop_reason?, token_ids?, logprobs?}], usage?, prompt_token_ids?}``.
    Text, reasoning and each tool call's arguments are the concatenation of their deltas
    (a tool call's pieces are joined by its ``index``), ``token_ids`` and
    ``logprobs.content`` the concatenation of the chunks' (in order), ``prompt_token_ids``
    the first chunk's. A field no chunk carried is left out. The content is None when the
    answer is only tool calls (as vLLM answers), else the text (maybe empty)."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.text: list[str] = []
        self.reasoning: dict[str, list[str]] = {}  # reasoning_content | reasoning -> pieces
        self.calls: dict[int, dict] = {}
        self.token_ids: list[int] | None = None
        self.logprobs: list | None = None
        self.prompt_token_ids: list[int] | None = None
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.has_stop_reason = False
        self.usage: dict | None = None
        self.finished = False  # a choice chunk with a finish_reason arrived

    def add(self, chunk: dict) -> None:
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        if isinstance(chunk.get("prompt_token_ids"), list):
            self.prompt_token_ids = chunk["prompt_token_ids"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choice = _choice(chunk)
        if choice is None or choice.get("index", 0) != 0:
            return
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                self.reasoning.setdefault(key, []).append(delta[key])
        for piece in delta.get("tool_calls") or []:
            self._add_call(piece)
        if isinstance(choice.get("token_ids"), list):
            self.token_ids = (self.token_ids or []) + choice["token_ids"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            self.logprobs = (self.logprobs or []) + logprobs["content"]
        if "stop_reason" in choice and (choice.get("finish_reason") or choice["stop_reason"]):
            self.stop_reason, self.has_stop_reason = choice["stop_reason"], True
        if choice.get("finish_reason"):
            self.finish_reason, self.finished = choice["finish_reason"], True

    def _add_call(self, piece: Any) -> None:
        if not isinstance(piece, dict):
            raise StreamFailed("a streamed tool call is not an object")
        index = piece.get("index", len(self.calls))
        call = self.calls.get(index)
        fn = piece.get("function") or {}
        if call is None:
            call = self.calls[index] = {
                "id": piece.get("id"),
                "type": piece.get("type") or "function",
                "function": {"name": fn.get("name"), "arguments": ""},
            }
        elif piece.get("id"):
            call["id"] = piece["id"]
        if fn.get("name") and not call["function"]["name"]:
            call["function"]["name"] = fn["name"]
        call["function"]["arguments"] += fn.get("arguments") or ""

    def response(self) -> dict:
        text = "".join(self.text)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text if text or not self.calls else None,
        }
        for key, pieces in self.reasoning.items():
            message[key] = "".join(pieces)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        choice: dict[str, Any] = {"index": 0, "message": message}
        choice["finish_reason"] = self.finish_reason
        if self.has_stop_reason:
            choice["stop_reason"] = self.stop_reason
        if self.token_ids is not None:
            choice["token_ids"] = self.token_ids
        if self.logprobs is not None:
            choice["logprobs"] = {"content": self.logprobs}
        out: dict[str, Any] = {"id": self.head.get("id"), "object": "chat.completion"}
        if "created" in self.head:
            out["created"] = self.head["created"]
        out["model"] = self.head.get("model")
        out["choices"] = [choice]
        if self.usage is not None:
            out["usage"] = self.usage
        if self.prompt_token_ids is not None:
            out["prompt_token_ids"] = self.prompt_token_ids
        return out


# ---------------------------------------------------------------- the harness's dialect


class OpenAIRelay:
    """Chat-completions chunks as the engine sent them, less what the harness did not ask
    for: the token-id fields the gateway added, and the usage chunk without
    ``include_usage``. A chunk with nothing to take out is passed on as its bytes."""

    def __init__(self, asked: set[str], include_usage: bool) -> None:
        self.ids = "return_token_ids" in asked
        # choice fields the gateway asked for on the harness's behalf
        self.added: tuple[str, ...] = () if self.ids else ("token_ids", "prompt_token_ids")
        self.added += () if "logprobs" in asked else ("logprobs",)
        self.include_usage = include_usage

    def chunk(self, chunk: dict, raw: bytes) -> list[bytes]:
        changed = False
        if not self.include_usage and "usage" in chunk:
            if not chunk.get("choices"):
                return []  # the usage chunk the gateway asked for
            chunk, changed = {k: v for k, v in chunk.items() if k != "usage"}, True
        if not self.ids and "prompt_token_ids" in chunk:
            chunk, changed = {k: v for k, v in chunk.items() if k != "prompt_token_ids"}, True
        choice, added = _choice(chunk), self.added
        if choice is not None and any(k in choice for k in added):
            choice = {k: v for k, v in choice.items() if k not in added}
            chunk, changed = {**chunk, "choices": [choice, *chunk["choices"][1:]]}, True
        return [b"data: " + (orjson.dumps(chunk) if changed else raw) + b"\n\n"]

    def finish(self, response: dict) -> list[bytes]:
        return [b"data: [DONE]\n\n"]

    def error(self, message: str) -> list[bytes]:
        # The openai SDK raises APIError on a chunk with an "error" object.
        return [sse_event({"error": {"message": message, "type": "server_error"}})]


class AnthropicRelay:
    """Messages streaming events: ``message_start`` on the first chunk, then one content
    block per run of thinking, text or a tool call (``content_block_start``, its
    ``*_delta`` events, ``content_block_stop``), then ``message_delta`` (stop reason,
    usage) and ``message_stop``. A tool call's input is sent whole at its block's end."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.started = False
        self.index = -1
        self.open: tuple[str, int] | None = None  # (kind, tool call index)
        self.arguments = ""

    def _event(self, data: dict) -> bytes:
        return sse_event(data, data["type"])

    def chunk(self, chunk: dict, raw: bytes) -> list[bytes]:
        out: list[bytes] = []
        if not self.started:
            self.started = True
            prompt = len(chunk.get("prompt_token_ids") or [])
            head = {
                "id": chunk.get("id"),
                "model": chunk.get("model"),
                "usage": {"prompt_tokens": prompt},
            }
            message = openai_to_anthropic({**head, "choices": [{"message": {}}]}, self.model)
            message["stop_reason"] = None
            out.append(self._event({"type": "message_start", "message": message}))
        choice = _choice(chunk)
        delta = (choice or {}).get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            self._switch(
                ("thinking", 0), {"type": "thinking", "thinking": "", "signature": ""}, out
            )
            out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if delta.get("content"):
            self._switch(("text", 0), {"type": "text", "text": ""}, out)
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for piece in delta.get("tool_calls") or []:
            index = piece.get("index", 0)
            if self.open != ("tool", index):
                fn = piece.get("function") or {}
                block = {
                    "type": "tool_use",
                    "id": piece.get("id"),
                    "name": fn.get("name"),
                    "input": {},
                }
                self._switch(("tool", index), block, out)
            self.arguments += (piece.get("function") or {}).get("arguments") or ""
        return out

    def _delta(self, delta: dict) -> bytes:
        return self._event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def _switch(self, block: tuple[str, int], start: dict, out: list[bytes]) -> None:
        if self.open == block:
            return
        self._close(out)
        self.index += 1
        self.open = block
        out.append(
            self._event(
                {"type": "content_block_start", "index": self.index, "content_block": start}
            )
        )

    def _close(self, out: list[bytes]) -> None:
        if self.open is None:
            return
        if self.open[0] == "tool":
            partial = orjson.dumps(tool_input(self.arguments)).decode()
            out.append(self._delta({"type": "input_json_delta", "partial_json": partial}))
            self.arguments = ""
        out.append(self._event({"type": "content_block_stop", "index": self.index}))
        self.open = None

    def finish(self, response: dict) -> list[bytes]:
        out: list[bytes] = []
        self._close(out)
        message = openai_to_anthropic(response, self.model)
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        out.append(
            self._event({"type": "message_delta", "delta": delta, "usage": message["usage"]})
        )
        out.append(self._event({"type": "message_stop"}))
        return out

    def error(self, message: str) -> list[bytes]:
        # The anthropic SDK raises on an "error" event.
        return [self._event({"type": "error", "error": {"type": "api_error", "message": message}})]


class ResponsesRelay:
    """OpenAI Responses streaming events: ``response.created`` and ``response.in_progress``
    on the first chunk; an output item per run of reasoning (``response.reasoning_text.*``),
    text (``response.output_text.*``) or a function call
    (``response.function_call_arguments.*``), each opened with ``output_item.added`` and
    closed with ``output_item.done``; then ``response.completed`` (``response.incomplete``
    when the answer hit its token limit) with the whole response. Item ids are the ones
    the unstreamed translation gives (``rs_``, ``msg_``, ``fc_`` + the engine's id)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.seq = 0
        self.rid = ""
        self.started = False
        self.items: list[dict] = []
        self.open: tuple[str, int] | None = None
        self.text = ""

    def _event(self, kind: str, **data: Any) -> bytes:
        self.seq += 1
        return sse_event({"type": kind, "sequence_number": self.seq - 1, **data}, kind)

    def chunk(self, chunk: dict, raw: bytes) -> list[bytes]:
        out: list[bytes] = []
        if not self.started:
            self.started = True
            self.rid = str(chunk.get("id") or "")
            head = {
                "id": chunk.get("id"),
                "model": chunk.get("model"),
                "created": chunk.get("created"),
            }
            pending = openai_to_responses({**head, "choices": [{"message": {}}]}, self.model)
            pending |= {"status": "in_progress", "usage": None}
            out.append(self._event("response.created", response=pending))
            out.append(self._event("response.in_progress", response=pending))
        delta = (_choice(chunk) or {}).get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            self._switch(("reasoning", 0), out)
            out.append(self._event("response.reasoning_text.delta", **self._ids(), delta=reasoning))
            self.text += reasoning
        if delta.get("content"):
            self._switch(("message", 0), out)
            text = delta["content"]
            out.append(
                self._event("response.output_text.delta", **self._ids(), delta=text, logprobs=[])
            )
            self.text += text
        for piece in delta.get("tool_calls") or []:
            index = piece.get("index", 0)
            self._switch(("function_call", index), out, piece)
            arguments = (piece.get("function") or {}).get("arguments") or ""
            if arguments:
                ids = self._ids()
                del ids["content_index"]
                out.append(
                    self._event("response.function_call_arguments.delta", **ids, delta=arguments)
                )
                self.text += arguments
        return out

    def _ids(self) -> dict:
        item = self.items[-1]
        return {"item_id": item["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _item_id(self, prefix: str) -> str:
        taken = {item["id"] for item in self.items}
        base = f"{prefix}_{self.rid}"
        return base if base not in taken else f"{base}_{len(self.items)}"

    def _switch(self, block: tuple[str, int], out: list[bytes], call: dict | None = None) -> None:
        if self.open == block:
            return
        self._close(out)
        self.open = block
        kind = block[0]
        item: dict[str, Any]
        if kind == "reasoning":
            item = {"id": self._item_id("rs"), "type": "reasoning", "summary": [], "content": []}
        elif kind == "message":
            item = {
                "id": self._item_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
        else:
            fn = (call or {}).get("function") or {}
            item = {
                "id": f"fc_{self.rid}_{block[1]}",
                "type": "function_call",
                "status": "in_progress",
                "call_id": (call or {}).get("id"),
                "name": fn.get("name"),
                "arguments": "",
            }
        self.items.append(item)
        index = len(self.items) - 1
        out.append(self._event("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(self._event("response.content_part.added", **self._ids(), part=part))

    def _close(self, out: list[bytes]) -> None:
        if self.open is None:
            return
        kind, text = self.open[0], self.text
        item, ids = self.items[-1], self._ids()
        if kind == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            out.append(self._event("response.reasoning_text.done", **ids, text=text))
        elif kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            item |= {"status": "completed", "content": [part]}
            out.append(self._event("response.output_text.done", **ids, text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", **ids, part=part))
        else:
            item |= {"status": "completed", "arguments": text}
            del ids["content_index"]
            out.append(self._event("response.function_call_arguments.done", **ids, arguments=text))
        out.append(
            self._event("response.output_item.done", output_index=ids["output_index"], item=item)
        )
        self.open, self.text = None, ""

    def finish(self, response: dict) -> list[bytes]:
        out: list[bytes] = []
        self._close(out)
        final = openai_to_responses(response, self.model)
        final["output"] = self.items
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, response=final))
        return out

    def error(self, message: str) -> list[bytes]:
        failed: dict[str, Any] = {"id": f"resp_{self.rid}", "object": "response"}
        failed |= {"status": "failed", "error": {"code": "server_error", "message": message}}
        return [self._event("response.failed", response=failed)]


Relay = OpenAIRelay | AnthropicRelay | ResponsesRelay


def relay_for(dialect: str, model: Any, asked: set[str], include_usage: bool) -> Relay:
    if dialect == "anthropic":
        return AnthropicRelay(model)
    if dialect == "responses":
        return ResponsesRelay(model)
    return OpenAIRelay(asked, include_usage)


# ---------------------------------------------------------------- one streamed call


class _Harness:
    """The response to the harness: written while it listens; once it has gone, the rest
    is dropped (the engine's stream is still read to its end and recorded)."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        self.gone = False

    async def send(self, events: list[bytes]) -> None:
        if self.gone or not events:
            return
        try:
            if not self.resp.prepared:
                await self.resp.prepare(self.request)
            await self.resp.write(b"".join(events))
        except (ConnectionError, aiohttp.ClientConnectionError):  # the client went away
            self.gone = True

    async def end(self) -> web.StreamResponse:
        if not self.gone:
            try:
                if not self.resp.prepared:
                    await self.resp.prepare(self.request)
                await self.resp.write_eof()
            except (ConnectionError, aiohttp.ClientConnectionError):
                self.gone = True
        return self.resp


async def streamed_call(
    gw: Gateway,
    request: web.Request,
    session: Session,
    dialect: str,
    model: Any,
    upstream_body: dict,
    asked: set[str],
    include_usage: bool,
    received: float,
) -> web.StreamResponse:
    """One streamed call, the session's lock held: open the engine's stream, relay its
    chunks, record the assembled answer, send the last event."""
    started = time.monotonic()
    opened = await gw.open_upstream(upstream_body)
    if isinstance(opened, web.Response):  # the engine refused it: its status and body
        gw.stats["errors"] += 1
        return opened
    resp = opened
    relay = relay_for(dialect, model, asked, include_usage)
    harness = _Harness(request)
    try:
        if "text/event-stream" in resp.content_type:
            response = await _relay_chunks(gw, resp, relay, harness)
        else:  # an engine that answers in one body: recorded, and replayed as events
            whole = await gw.read_answer(resp)
            if isinstance(whole, web.Response):
                gw.stats["errors"] += 1
                return whole
            response = whole
            for chunk in openai_chunks(whole, include_usage=True):
                await harness.send(relay.chunk(chunk, orjson.dumps(chunk)))
    except StreamFailed as exc:
        gw.stats["errors"] += 1
        message = gw.redactor.redact(f"seam gateway: the engine's stream failed: {exc}")
        await harness.send(relay.error(message))
        return await harness.end()
    finally:
        resp.release()
    upstream_ms = (time.monotonic() - started) * 1000
    failed = await gw.record_answer(
        session, dialect, upstream_body, response, received, upstream_ms, not harness.gone
    )
    # Not recorded (a full disk, a failed fsync): the harness gets an error, not the end.
    await harness.send(relay.error(failed) if failed is not None else relay.finish(response))
    return await harness.end()


async def _relay_chunks(gw: Gateway, resp: Response, relay: Relay, harness: _Harness) -> dict:
    """Send each chunk of the engine's stream on, and return the assembled answer."""
    from pipeline.gateway.server import _check_answer

    assembler = Assembler()
    try:
        async for raw in sse_data(resp, gw.config.max_response_bytes):
            if raw.strip() == b"[DONE]":
                break
            try:
                chunk = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise StreamFailed("an event is not JSON") from None
            if not isinstance(chunk, dict):
                raise StreamFailed("an event is not a JSON object")
            error = engine_error(chunk)
            if error is not None:
                raise StreamFailed(error)
            assembler.add(chunk)
            await harness.send(relay.chunk(chunk, raw))
    except UpstreamError as exc:  # a cut connection, a timeout, an answer over the cap
        raise StreamFailed(str(exc)) from None
    if not assembler.finished:
        raise StreamFailed("the stream ended before its finish_reason")
    response = assembler.response()
    try:
        _check_answer(response)
    except ValueError as exc:
        raise StreamFailed(f"the answer is unusable: {exc}") from None
    return response
