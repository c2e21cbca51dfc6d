"""A stand-in for an inference engine: OpenAI chat completions the way vLLM answers them
with ``return_token_ids`` and ``logprobs``, at once or after a fixed delay per call,
whole or streamed.

The prompt's ids are ``range(100 × number of messages)``: a request that extends the
previous one has prompt ids that extend the previous prompt's, as a real engine's do (the
gateway's delta log stores only the new ones). The answer is 64 tokens of text. A
``delay_ms`` stands for the engine's generation time (a real engine takes hundreds of
milliseconds); the delay is an ``asyncio.sleep``, so concurrent calls overlap as they do
on a batching engine.

Streaming (``"stream": true``) follows vLLM's OpenAI server (``serving_chat.py``): the
first ``chat.completion.chunk`` carries the role, an empty content and, with
``return_token_ids``, the prompt's ids at the chunk's top level (``prompt_token_ids``);
every later chunk carries its piece of the text in ``choices[0].delta`` with that piece's
ids in ``choices[0].token_ids`` and its logprobs in ``choices[0].logprobs.content``; the
last choice chunk has the ``finish_reason``; with ``stream_options.include_usage`` a
chunk with no choices carries the ``usage``; then ``data: [DONE]``. An error after the
stream began is a ``data: {"error": {...}}`` event, as vLLM sends it.

Run alone: ``python -m bench.engine_stub --port 8000 [--delay-ms 200] [--chunk-ms 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

OUTPUT_IDS = list(range(1000, 1064))
TOKENS_PER_MESSAGE = 100
CREATED = 1_700_000_000  # a fixed time: a streamed and a whole answer are equal
PIECES = 8  # a streamed answer's text arrives in this many chunks


def answer(body: dict, tokens_per_message: int = TOKENS_PER_MESSAGE) -> dict:
    """The engine's whole answer to one chat-completions request ``body`` (its keys in the
    order the gateway's stream assembly gives them, so a streamed call's record has the
    same bytes)."""
    prompt = tokens_per_message * len(body.get("messages") or [])
    choice: dict = {
        "index": 0,
        "message": {"role": "assistant", "content": "word " * len(OUTPUT_IDS)},
        "finish_reason": "stop",
    }
    if body.get("return_token_ids"):
        choice["token_ids"] = OUTPUT_IDS
    if body.get("logprobs"):
        step = {"token": "word", "logprob": -0.5}
        choice["logprobs"] = {"content": [step] * len(OUTPUT_IDS)}
    out: dict = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": CREATED,
        "model": body.get("model") or "stub",
        "choices": [choice],
        "usage": {"prompt_tokens": prompt, "completion_tokens": len(OUTPUT_IDS)},
    }
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = list(range(prompt))
    return out


def _split(items: list, parts: int) -> list[list]:
    """``items`` cut into ``parts`` contiguous runs (the later ones may be empty)."""
    size = -(-len(items) // parts) if items else 0
    return [items[i * size : (i + 1) * size] for i in range(parts)]


def stream_chunks(whole: dict, include_usage: bool = True, pieces: int = PIECES) -> list[dict]:
    """The ``chat.completion.chunk`` objects a vLLM-style engine streams for the answer
    ``whole`` (a chat-completions response): reasoning, then text in ``pieces`` parts,
    then each tool call (its name, then its arguments in two parts), then the finish;
    the sampled ids and logprobs spread over those chunks in order."""
    choice = whole["choices"][0]
    message = choice.get("message") or {}
    head = {
        "id": whole.get("id"),
        "object": "chat.completion.chunk",
        "created": whole.get("created"),
        "model": whole.get("model"),
    }
    deltas: list[dict] = []
    for key in ("reasoning_content", "reasoning"):
        if message.get(key):
            deltas += [{key: t} for t in _text_pieces(message[key], pieces) if t]
    deltas += [{"content": t} for t in _text_pieces(message.get("content") or "", pieces) if t]
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        name = {"index": i, "id": call.get("id"), "type": "function"}
        deltas.append(
            {"tool_calls": [{**name, "function": {"name": fn.get("name"), "arguments": ""}}]}
        )
        for part in _text_pieces(fn.get("arguments") or "", 2):
            deltas.append({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
    ids = _split(list(choice.get("token_ids") or []), len(deltas) + 1)
    steps = _split(list((choice.get("logprobs") or {}).get("content") or []), len(deltas) + 1)
    deltas.append({})  # the finish chunk carries the last ids (vLLM's end-of-turn token)

    def one(delta: dict, n: int, finish: str | None) -> dict:
        c: dict = {"index": 0, "delta": delta, "finish_reason": finish}
        if "token_ids" in choice:
            c["token_ids"] = ids[n]
        if "logprobs" in choice:
            c["logprobs"] = {"content": steps[n]}
        return {**head, "choices": [c]}

    first: dict = {
        **head,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        ],
    }
    if "prompt_token_ids" in whole:
        first["prompt_token_ids"] = whole["prompt_token_ids"]
    out = [first]
    out += [one(d, n, None) for n, d in enumerate(deltas[:-1])]
    out.append(one({}, len(deltas) - 1, choice.get("finish_reason")))
    if include_usage and whole.get("usage"):
        out.append({**head, "choices": [], "usage": whole["usage"]})
    return out


def _text_pieces(text: str, parts: int) -> list[str]:
    size = -(-len(text) // parts) if text else 0
    return [text[i * size : (i + 1) * size] for i in range(parts)] if text else []


async def write_stream(
    request: web.Request,
    chunks: list[dict],
    chunk_s: float = 0.0,
    after_first: Callable[[], Awaitable[None]] | None = None,
    fail_after: int | None = None,
) -> web.StreamResponse:
    """Send ``chunks`` as server-sent events: ``chunk_s`` seconds apart, ``after_first``
    awaited after the first one (a test holds the rest back with it), and after
    ``fail_after`` chunks an error event instead of the rest."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for n, chunk in enumerate(chunks):
        if fail_after is not None and n == fail_after:
            error = {
                "error": {
                    "message": "the engine failed mid-stream",
                    "type": "InternalServerError",
                    "code": 500,
                }
            }
            await resp.write(b"data: " + orjson.dumps(error) + b"\n\n")
            break
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if n == 0 and after_first is not None:
            await after_first()
        elif chunk_s:
            await asyncio.sleep(chunk_s)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def make_app(
    delay_ms: float = 0.0,
    tokens_per_message: int = TOKENS_PER_MESSAGE,
    chunk_ms: float = 0.0,
    after_first: Callable[[], Awaitable[None]] | None = None,
    fail_after: int | None = None,
    seen: list[dict] | None = None,
) -> web.Application:
    """The stand-in's application. A streamed answer's chunks come ``chunk_ms`` apart
    (after the first, which comes at once), or when ``after_first`` returns; ``seen``
    collects the request bodies."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if seen is not None:
            seen.append(body)
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        whole = answer(body, tokens_per_message)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = stream_chunks(whole, usage)
            return await write_stream(request, chunks, chunk_ms / 1000, after_first, fail_after)
        return web.Response(body=orjson.dumps(whole), content_type="application/json")

    app = web.Application(client_max_size=1 << 28)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--chunk-ms", type=float, default=0.0, help="between streamed chunks")
    args = parser.parse_args()
    web.run_app(
        make_app(args.delay_ms, chunk_ms=args.chunk_ms),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
