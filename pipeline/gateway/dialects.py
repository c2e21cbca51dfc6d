"""Downstream dialects: Anthropic Messages ⇄ OpenAI chat completions, and SSE for both.

The upstream engine speaks OpenAI chat completions, so an Anthropic request (Claude
Code through ``ANTHROPIC_BASE_URL``) is translated before it is sent, and what is
recorded is the OpenAI request the engine received: that is the context the model saw
(the engine's chat template renders exactly those messages).

Streaming: without a Judge the engine's chunks are relayed as they arrive
(``pipeline/gateway/streaming.py``). With a Judge the gateway takes the whole response
(it must be judged, and may be rewritten, before the harness sees any of it), then
replays it to a streaming harness as the dialect's server-sent events (below).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pipeline.common.errors import SeamError


class DialectError(SeamError, ValueError):
    """A request the gateway cannot translate; answered with HTTP 400 and this text."""


# ---------------------------------------------------------------- Anthropic → OpenAI

_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


_ANTHROPIC_TEXT = ("text",)
_RESPONSES_TEXT = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _joined_text(content: Any, where: str, kinds: tuple[str, ...] = _ANTHROPIC_TEXT) -> str:
    """Plain text of a content value: a string, or a list of text parts of ``kinds``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(f"{where}: content must be a string or a list of parts")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise DialectError(
                f"{where}: content part type {kind!r} is not supported by the gateway "
                f"(text parts are: {', '.join(kinds)})"
            )
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def anthropic_to_openai(body: dict) -> dict:
    """An Anthropic Messages request as the equivalent OpenAI chat-completions request."""
    if not isinstance(body.get("messages"), list):
        raise DialectError("request has no 'messages' list")
    messages: list[dict] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _joined_text(system, "system")})
    for i, msg in enumerate(body["messages"]):
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant", "system"):
            raise DialectError(f"messages[{i}]: role must be 'user', 'assistant' or 'system'")
        if msg["role"] == "system":  # newer Claude Code sends system notes between turns
            messages.append(
                {"role": "system", "content": _joined_text(msg.get("content"), f"messages[{i}]")}
            )
            continue
        messages.extend(_anthropic_message(msg, f"messages[{i}]"))
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_tokens") is not None:
        out["max_tokens"] = body["max_tokens"]
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    tools = body.get("tools") or []
    if tools:
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema") or {"type": "object"},
                },
            }
            for t in tools
            if isinstance(t, dict) and t.get("name")
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif choice.get("type") in _TOOL_CHOICE:
            out["tool_choice"] = _TOOL_CHOICE[choice["type"]]
    return out


def _anthropic_message(msg: dict, where: str) -> list[dict]:
    role, content = msg["role"], msg.get("content")
    if isinstance(content, str) or content is None:
        return [{"role": role, "content": content or ""}]
    if not isinstance(content, list):
        raise DialectError(f"{where}: content must be a string or a list of blocks")
    if role == "assistant":
        text, reasoning, calls = [], [], []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text.append(str(block.get("text", "")))
            elif kind in ("thinking", "redacted_thinking"):
                reasoning.append(str(block.get("thinking", "")))
            elif kind == "tool_use":
                calls.append(
                    {
                        "id": block.get("id") or f"toolu_{uuid.uuid4().hex[:12]}",
                        "type": "function",
                        "function": {
                            "name": block.get("name", ""),
                            "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False),
                        },
                    }
                )
            else:
                raise DialectError(f"{where}: assistant block type {kind!r} is not supported")
        out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if reasoning:
            out["reasoning_content"] = "".join(reasoning)
        if calls:
            out["tool_calls"] = calls
        return [out]
    # A user turn: tool results first (OpenAI wants them right after the calls), then text.
    results, text = [], []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            body = _joined_text(block.get("content"), f"{where} tool_result")
            if block.get("is_error"):
                body = body or "error"
            results.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id", ""), "content": body}
            )
        elif kind == "text":
            text.append(str(block.get("text", "")))
        else:
            raise DialectError(
                f"{where}: user block type {kind!r} is not supported by the gateway "
                "(text and tool_result are)"
            )
    return results + ([{"role": "user", "content": "".join(text)}] if text else [])


# ---------------------------------------------------------------- OpenAI → Anthropic

_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def openai_to_anthropic(response: dict, model: str | None) -> dict:
    """The engine's chat-completions response as an Anthropic Messages response."""
    choice = response["choices"][0]
    message = choice.get("message") or {}
    blocks: list[dict] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": fn.get("name"),
                "input": tool_input(fn.get("arguments")),
            }
        )
    usage = response.get("usage") or {}
    return {
        "id": "msg_" + str(response.get("id") or uuid.uuid4().hex),
        "type": "message",
        "role": "assistant",
        "model": model or response.get("model"),
        "content": blocks,
        "stop_reason": _STOP_REASON.get(choice.get("finish_reason"), "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    }


def tool_input(arguments: str | None) -> dict:
    """A tool call's arguments text as an Anthropic ``tool_use`` input, which is an object:
    the parsed JSON object, or ``{"_raw_arguments": text}`` when the text is not one (the
    raw text stays in the call log)."""
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"_raw_arguments": arguments}


# ---------------------------------------------------------------- server-sent events


def sse_event(data: dict, event: str | None = None) -> bytes:
    """One server-sent event: an optional ``event:`` line, the JSON ``data:`` line, a blank line."""
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data, ensure_ascii=False) + "\n\n").encode()


_sse = sse_event


def openai_sse(response: dict, include_usage: bool = False) -> list[bytes]:
    """A whole chat-completions response as the events a streaming engine would send."""
    return [_sse(c) for c in openai_chunks(response, include_usage)] + [b"data: [DONE]\n\n"]


def openai_chunks(response: dict, include_usage: bool = False) -> list[dict]:
    """A whole chat-completions response as the chunks a streaming engine would send."""
    choice = response["choices"][0]
    message = choice.get("message") or {}
    base = {
        "id": response.get("id") or f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": response.get("created") or int(time.time()),
        "model": response.get("model"),
    }

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": ""})]
    reasoning = message.get("reasoning_content")
    if reasoning:
        events.append(chunk({"reasoning_content": reasoning}))
    if message.get("content"):
        events.append(chunk({"content": message["content"]}))
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call.get("id"),
                            "type": "function",
                            "function": {"name": fn.get("name"), "arguments": ""},
                        }
                    ]
                }
            )
        )
        events.append(
            chunk({"tool_calls": [{"index": i, "function": {"arguments": fn.get("arguments")}}]})
        )
    events.append(chunk({}, choice.get("finish_reason") or "stop"))
    if include_usage and response.get("usage"):
        events.append({**base, "choices": [], "usage": response["usage"]})
    return events


def anthropic_sse(message: dict) -> list[bytes]:
    """A whole Anthropic message as the Messages streaming events, in their order."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
    events = [_sse({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        first: dict[str, Any]
        delta: dict[str, Any]
        if kind == "text":
            first, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        elif kind == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            first = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": json.dumps(block["input"], ensure_ascii=False),
            }
        events.append(
            _sse(
                {"type": "content_block_start", "index": index, "content_block": first},
                "content_block_start",
            )
        )
        events.append(
            _sse(
                {"type": "content_block_delta", "index": index, "delta": delta},
                "content_block_delta",
            )
        )
        events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    events.append(
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
            "message_delta",
        )
    )
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return events


# ---------------------------------------------------------------- OpenAI Responses (Codex)

_RESPONSES_ROLES = {"user": "user", "assistant": "assistant", "system": "system"}
# Chat templates of open models know system/user/assistant/tool; a Responses
# "developer" message is an instruction from the harness, so it goes in as system.
_RESPONSES_ROLES["developer"] = "system"


def responses_to_openai(body: dict) -> dict:
    """An OpenAI Responses request (Codex) as the equivalent chat-completions request."""
    messages: list[dict] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list):
        raise DialectError("request has no 'input' (a string or a list of items)")
    reasoning: list[str] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise DialectError(f"{where}: an item is not an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = _RESPONSES_ROLES.get(item.get("role") or "")
            if role is None:
                raise DialectError(f"{where}: role {item.get('role')!r} is not supported")
            msg: dict[str, Any] = {
                "role": role,
                "content": _joined_text(item.get("content"), where, _RESPONSES_TEXT),
            }
            if role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = "".join(reasoning), []
            messages.append(msg)
        elif kind == "reasoning":
            summary = item.get("content") or item.get("summary") or []
            reasoning.append(_joined_text(summary, where, _RESPONSES_TEXT))
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments") if kind == "function_call" else item.get("input")
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": arguments or ""},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # parallel calls: one turn
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"], reasoning = "".join(reasoning), []
                messages.append(msg)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id", ""),
                    "content": output
                    if isinstance(output, str)
                    else _joined_text(output, where, _RESPONSES_TEXT),
                }
            )
        else:
            raise DialectError(
                f"{where}: item type {kind!r} is not supported by the gateway (message, "
                "reasoning, function_call, function_call_output, custom_tool_call are)"
            )
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if body.get(name) is not None:
            out[name] = body[name]
    tools = []
    for t in body.get("tools") or []:
        if not isinstance(t, dict) or t.get("type") != "function":
            raise DialectError(
                f"tool type {t.get('type') if isinstance(t, dict) else t!r} is not supported by "
                "the gateway (function tools are): configure the harness for function tools"
            )
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t.get("parameters") or {"type": "object"},
                },
            }
        )
    if tools:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        out["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    return out


def openai_to_responses(response: dict, model: str | None) -> dict:
    """The engine's chat-completions response as an OpenAI Responses object."""
    choice = response["choices"][0]
    message = choice.get("message") or {}
    rid = str(response.get("id") or uuid.uuid4().hex)
    output: list[dict] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        output.append(
            {
                "id": f"rs_{rid}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    if message.get("content"):
        output.append(
            {
                "id": f"msg_{rid}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
            }
        )
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        output.append(
            {
                "id": f"fc_{rid}_{i}",
                "type": "function_call",
                "status": "completed",
                "call_id": call.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments") or "",
            }
        )
    usage = response.get("usage") or {}
    truncated = choice.get("finish_reason") == "length"
    return {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": response.get("created") or int(time.time()),
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "model": model or response.get("model"),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": int(usage.get("completion_tokens") or 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": int(usage.get("prompt_tokens") or 0)
            + int(usage.get("completion_tokens") or 0),
        },
    }


def responses_sse(resp: dict) -> list[bytes]:
    """A whole Responses object as the Responses streaming events, in their order."""
    seq = iter(range(1_000_000))

    def event(kind: str, **data: Any) -> bytes:
        return _sse({"type": kind, "sequence_number": next(seq), **data}, kind)

    pending = {**resp, "status": "in_progress", "output": [], "usage": None}
    events = [event("response.created", response=pending)]
    events.append(event("response.in_progress", response=pending))
    for index, item in enumerate(resp["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            empty_part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
            )
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(event("response.content_part.added", **ids, part=empty_part))
            events.append(event("response.output_text.delta", **ids, delta=text, logprobs=[]))
            events.append(event("response.output_text.done", **ids, text=text, logprobs=[]))
            events.append(event("response.content_part.done", **ids, part=item["content"][0]))
        elif item["type"] == "function_call":
            events.append(
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
            )
            ids = {"item_id": item["id"], "output_index": index}
            events.append(
                event("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            )
            events.append(
                event("response.function_call_arguments.done", **ids, arguments=item["arguments"])
            )
        else:
            events.append(event("response.output_item.added", output_index=index, item=item))
        events.append(event("response.output_item.done", output_index=index, item=item))
    final = "response.incomplete" if resp["status"] == "incomplete" else "response.completed"
    events.append(event(final, response=resp))
    return events
