"""Downstream dialects: Anthropic Messages ⇄ OpenAI chat completions, and SSE for both.

The upstream engine speaks OpenAI chat completions, so an Anthropic request (Claude
Code through ``ANTHROPIC_BASE_URL``) is translated before it is sent, and what is
recorded is the OpenAI request the engine received: that is the context the model saw
(the engine's chat template renders exactly those messages).

Streaming: the gateway always asks the engine for the whole response (it must be judged
before the harness sees any of it, and engines return token ids only on whole
responses), then replays it to a streaming harness as the dialect's server-sent events.
A streaming harness therefore gets its first byte when the call is complete.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any


class DialectError(ValueError):
    """A request the gateway cannot translate; answered with HTTP 400 and this text."""


# ---------------------------------------------------------------- Anthropic → OpenAI

_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def _text_of(content: Any, where: str) -> str:
    """Plain text of an Anthropic content value (a string or a list of text blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(f"{where}: content must be a string or a list of blocks")
    parts = []
    for block in content:
        if not isinstance(block, dict):
            raise DialectError(f"{where}: a content block is not an object")
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        else:
            raise DialectError(
                f"{where}: content block type {kind!r} is not supported by the gateway "
                "(text, tool_use, tool_result and thinking are)"
            )
    return "".join(parts)


def anthropic_to_openai(body: dict) -> dict:
    """An Anthropic Messages request as the equivalent OpenAI chat-completions request."""
    if not isinstance(body.get("messages"), list):
        raise DialectError("request has no 'messages' list")
    messages: list[dict] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system, "system")})
    for i, msg in enumerate(body["messages"]):
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise DialectError(f"messages[{i}]: role must be 'user' or 'assistant'")
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
            body = _text_of(block.get("content"), f"{where} tool_result")
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
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            # Anthropic tool input is an object; the raw text stays in the call log.
            arguments = {"_raw_arguments": fn.get("arguments")}
        blocks.append(
            {"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": arguments}
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


# ---------------------------------------------------------------- server-sent events


def _sse(data: dict, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data, ensure_ascii=False) + "\n\n").encode()


def openai_sse(response: dict, include_usage: bool = False) -> list[bytes]:
    """A whole chat-completions response as the chunks a streaming engine would send."""
    choice = response["choices"][0]
    message = choice.get("message") or {}
    base = {
        "id": response.get("id") or f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": response.get("created") or int(time.time()),
        "model": response.get("model"),
    }

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

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
        events.append(_sse({**base, "choices": [], "usage": response["usage"]}))
    events.append(b"data: [DONE]\n\n")
    return events


def anthropic_sse(message: dict) -> list[bytes]:
    """A whole Anthropic message as the Messages streaming events, in their order."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
    events = [_sse({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
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
