"""A stand-in for an inference engine: OpenAI chat completions the way vLLM answers them
with ``return_token_ids`` and ``logprobs``, at once or after a fixed delay per call.

The prompt's ids are ``range(100 × number of messages)``: a request that extends the
previous one has prompt ids that extend the previous prompt's, as a real engine's do (the
gateway's delta log stores only the new ones). The answer is 64 tokens of text. A
``delay_ms`` stands for the engine's generation time (a real engine takes hundreds of
milliseconds); the delay is an ``asyncio.sleep``, so concurrent calls overlap as they do
on a batching engine.

Run alone: ``python -m bench.engine_stub --port 8000 [--delay-ms 200]``.
"""

from __future__ import annotations

import argparse
import asyncio

import orjson
from aiohttp import web

OUTPUT_IDS = list(range(1000, 1064))
TOKENS_PER_MESSAGE = 100


def answer(body: dict, tokens_per_message: int = TOKENS_PER_MESSAGE) -> dict:
    """The engine's answer to one chat-completions request ``body``."""
    out: dict = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "model": body.get("model") or "stub",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "word " * len(OUTPUT_IDS)},
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": len(OUTPUT_IDS)},
    }
    prompt = tokens_per_message * len(body.get("messages") or [])
    out["usage"]["prompt_tokens"] = prompt
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = list(range(prompt))
        out["choices"][0]["token_ids"] = OUTPUT_IDS
    if body.get("logprobs"):
        step = {"token": "word", "logprob": -0.5}
        out["choices"][0]["logprobs"] = {"content": [step] * len(OUTPUT_IDS)}
    return out


def make_app(
    delay_ms: float = 0.0, tokens_per_message: int = TOKENS_PER_MESSAGE
) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        return web.Response(
            body=orjson.dumps(answer(body, tokens_per_message)), content_type="application/json"
        )

    app = web.Application(client_max_size=1 << 28)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    web.run_app(
        make_app(args.delay_ms), host="127.0.0.1", port=args.port, print=None, access_log=None
    )


if __name__ == "__main__":
    main()
