"""The LLM judge's options, each field with its ``seam judge`` flag
(``pipeline/common/options.py``): ``ClientConfig``, the client of an OpenAI-compatible
endpoint (``judge/chat_client.py``), and ``LlmJudgeOptions``, how the judge asks it
(``judge/llm.py``). A module of its own that imports no HTTP library, so the command line
adds the flags without the ``judge-llm`` extra; the defaults written here are the ones
the command line shows and the library uses."""

from __future__ import annotations

import operator
from dataclasses import dataclass

from pipeline.common.options import MIB, in_mib, option


def _cache_dir(given: str | None) -> str:
    """``--cache-dir``, else ``$SEAM_CACHE_DIR/judge`` (or ``~/.cache/seam/judge``)."""
    from pipeline.core.tokenizer import cache_dir

    return given or str(cache_dir() / "judge")


def _at_least_one(flag: str) -> dict:
    return {"type": int, "check": lambda n: n >= 1, "error": f"{flag} must be at least 1"}


@dataclass(frozen=True)
class ClientConfig:
    # --llm and --model have no default: the command asks for them (None: no LLM judge).
    url: str = option(
        flag="--llm",
        metavar="URL",
        flag_default=None,
        help="OpenAI-compatible endpoint: server root, .../v1, or .../v1/chat/completions.",
    )
    model: str = option(
        flag="--model", flag_default=None, help="Model name to request (needed with --llm)."
    )
    api_key_env: str | None = option(
        "OPENAI_API_KEY",
        flag="--api-key-env",
        help="Environment variable holding the API key (default {default}; unset = no key). "
        "The key is only sent in the Authorization header, never printed or cached.",
    )
    timeout_s: float = option(  # per attempt, in total
        120.0,
        flag="--timeout",
        type=float,
        help="Seconds per request attempt, in total: connect, send, wait and read the whole "
        "answer (default {default}).",
    )
    max_retries: int = option(
        4,
        flag="--retries",
        type=int,
        help="Retries on HTTP 429/5xx, timeouts and dropped connections, with exponential "
        "backoff 1s·2^attempt capped at 30s, or the server's Retry-After (default {default}).",
    )
    backoff_s: float = 1.0
    backoff_cap_s: float = 30.0
    temperature: float = 0.0
    max_tokens: int = option(
        1024,
        flag="--max-answer-tokens",
        type=int,
        help="Answer length limit per request (default {default}).",
    )
    json_mode: bool = option(
        True,
        flag="--no-json-mode",
        switch=True,
        to_field=operator.not_,  # the flag says off
        help="Do not send response_format={type: json_object} (for servers that reject it).",
    )
    # None: no cache (the library's default); the command line always names one.
    cache_dir: str | None = option(
        None,
        flag="--cache-dir",
        to_field=_cache_dir,
        help="Content-addressed answer cache: a rerun over the same inputs sends no request "
        "(default $SEAM_CACHE_DIR/judge, else ~/.cache/seam/judge).",
    )
    use_cache: bool = option(
        True,
        flag="--no-cache",
        switch=True,
        to_field=operator.not_,  # the flag says off
        help="Neither read nor write the cache.",
    )
    price_in_per_mtok: float = option(  # currency units per 1M prompt tokens
        0.0,
        flag="--price-in",
        type=float,
        help="Price per 1M prompt tokens, for the cost line (default {default}).",
    )
    price_out_per_mtok: float = option(  # currency units per 1M completion tokens
        0.0,
        flag="--price-out",
        type=float,
        help="Price per 1M completion tokens (default {default}).",
    )
    # An answer of max_tokens tokens is a few KB. In MiB on the command line, as the
    # gateway's --max-response-mb and the input limits (--max-line-mb, ...).
    max_response_bytes: int = option(
        4 * MIB,
        flag="--max-response-mb",
        **in_mib(),
        check=lambda mb: mb > 0,
        error="--max-response-mb must be positive",
        help="Largest response body read, in MiB; a larger one fails that step and is never "
        "cached (default {default}).",
    )
    max_connect_failures: int = option(  # in a row, then the endpoint is taken as down
        5,
        flag="--max-connect-failures",
        **_at_least_one("--max-connect-failures"),
        help="Connection failures in a row after which the endpoint is taken as down and the "
        "remaining steps fail without a request (default {default}).",
    )


@dataclass(frozen=True)
class LlmJudgeOptions:
    """How ``seam judge --llm`` asks: ``judge.llm.judge_rollouts``' parameters."""

    concurrency: int = option(
        8,
        flag="--concurrency",
        **_at_least_one("--concurrency"),
        help="Requests in flight at once (default {default}).",
    )
    every_call: bool = option(
        False,
        flag="--every-call",
        switch=True,
        help="Also ask, at every other action call, whether the agent should compact now "
        "(missing_trigger).",
    )
    max_context_chars: int = option(
        60_000,
        flag="--max-context-chars",
        **_at_least_one("--max-context-chars"),
        help="Longest history shown; beyond it the first two messages and the most recent "
        "ones are kept (default {default}).",
    )
    batch: int = option(
        256,
        flag="--batch",
        **_at_least_one("--batch"),
        help="Rollouts held in memory per judging batch (default {default}).",
    )
