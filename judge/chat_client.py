"""A client for OpenAI-compatible ``/v1/chat/completions`` endpoints (vLLM, SGLang, hosted
APIs), written for batch judging on ``httpx2`` (HTTP) and ``tenacity`` (retries).

- **Total timeouts.** Each attempt — connect, send, wait, read the whole body — is one
  coroutine cancelled at ``timeout_s`` (``asyncio.wait_for``). httpx's own timeouts are
  per operation: a server trickling one byte a second never trips a read timeout.
  Requests run on one event loop in a background thread; ``complete`` blocks its
  caller (the judge's worker threads) until its answer or failure.
- **Bounded responses.** The body is streamed and the read stops at
  ``max_response_bytes`` (decoded bytes, so a compressed bomb stops there too); a
  ``Content-Length`` over the limit is refused before reading. An oversized response is
  a failure, never retried, never cached.
- **Retries.** HTTP 429/5xx, timeouts and dropped connections are retried by tenacity:
  attempt ``a`` (1-based) waits ``min(backoff_cap_s, backoff_s · 2^(a-1))``, or the
  server's ``Retry-After`` when it sends one (capped the same way).
- **Fail fast.** After ``max_connect_failures`` connection failures in a row (nothing
  listening, no route: not one request reached a server) the endpoint is taken as down
  and every later request fails at once without being sent, instead of every step of
  the run trying (and retrying) in turn. Any response resets the count.
- **Cache.** ``answer_cache.AnswerCache``: only answers the caller's ``validate``
  accepted are stored; a cached answer that is unreadable or no longer validates is a
  miss.
- **Secrets.** The API key is read from the environment variable the caller names and
  sent only in the ``Authorization`` header; a key written into the URL (userinfo or a
  ``?key=``-like parameter) is taken out of it and sent as a header too
  (``pipeline/common/credentials.py``), so ``self.url`` and ``self.config.url``, the only URL
  printed or written, hold none. Every text that came from the server has every one of
  these keys removed (``redact.Redactor``, all encodings) before it is stored, shown or
  raised: the raw body before parsing, the answer after, and each string of the answer
  once more after its own JSON is decoded (a key spelled in ``\\uXXXX`` escapes inside
  the answer's JSON is only a key once decoded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from judge.answer_cache import AnswerCache
from judge.llm_options import ClientConfig  # the options, with their flags
from pipeline.common.credentials import split_url, with_path
from pipeline.common.errors import SeamError
from pipeline.common.redact import Redactor


class ChatError(SeamError):
    """A request that failed for good (after retries); the message is safe to print."""


@dataclass
class Usage:
    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    answered: int = 0  # steps with a valid answer (cached or not)
    failures: int = 0  # steps without one
    prompt_tokens: int = 0
    completion_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)

    def cost(self, config: ClientConfig) -> float:
        return (
            self.prompt_tokens * config.price_in_per_mtok
            + self.completion_tokens * config.price_out_per_mtok
        ) / 1e6

    def as_dict(self, config: ClientConfig) -> dict[str, Any]:
        keys = (
            "requests",
            "cache_hits",
            "retries",
            "answered",
            "failures",
            "prompt_tokens",
            "completion_tokens",
        )
        return {**{k: getattr(self, k) for k in keys}, "cost": round(self.cost(config), 6)}


def endpoint(url: str) -> str:
    """Accept a server root, a ``/v1`` base or the full chat-completions URL (a query,
    such as Azure's ``?api-version=``, stays at the end)."""

    def chat(path: str) -> str:
        path = path.rstrip("/")
        if path.endswith("/chat/completions"):
            return path
        return path + ("/chat/completions" if path.endswith("/v1") else "/v1/chat/completions")

    return with_path(url, chat)


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class _ConnectFailed(_Retryable):
    """No connection could be made: counts towards taking the endpoint as down."""


class ChatClient:
    """Thread-safe; ``close()`` (or ``with``) stops its event loop and connections."""

    def __init__(self, config: ClientConfig):
        api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self._endpoint = split_url(config.url, bearer=api_key)
        self.config = dataclasses.replace(config, url=self._endpoint.url)
        self.url = endpoint(self._endpoint.url)
        self.usage = Usage()
        self._redactor = Redactor(*self._endpoint.secrets)
        self._cache = (
            AnswerCache(config.cache_dir, config.model, config.max_response_bytes)
            if config.cache_dir and config.use_cache
            else None
        )
        self._connect_failures = 0  # in a row; touched only on the loop's thread
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="seam-judge-http", daemon=True
        )
        self._thread.start()
        self._http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(config.timeout_s),
            headers=self._headers(),
            follow_redirects=False,
        )

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._http.aclose(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _headers(self) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "Accept": "application/json",
            **self._endpoint.headers,
        }

    def request_body(self, messages: list[dict]) -> dict:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }
        if self.config.json_mode:
            body["response_format"] = {"type": "json_object"}
        return body

    @staticmethod
    def cache_key(body: dict) -> str:
        return hashlib.sha256(
            json.dumps(body, sort_keys=True, ensure_ascii=False).encode()
        ).hexdigest()

    def complete(self, messages: list[dict], validate: Callable[[str], Any]) -> tuple[Any, str]:
        """(validated answer, cache key) for ``messages``. ``validate`` turns the answer's
        text into a value or raises ``ValueError``; raises ``ChatError`` on failure."""
        body = self.request_body(messages)
        key = self.cache_key(body)
        cached = self._cache.get(key) if self._cache else None
        if cached is not None:
            try:
                value = validate(cached)
            except ValueError:
                pass  # stored by an older prompt or validator: ask again
            else:
                self.usage.add(cache_hits=1, answered=1)
                return value, key
        try:
            future = asyncio.run_coroutine_threadsafe(self._post_with_retries(body), self._loop)
            content = future.result()
            value = validate(content)
        except ChatError as exc:
            self.usage.add(failures=1)
            raise ChatError(self._redact(str(exc))) from None
        except ValueError as exc:
            self.usage.add(failures=1)
            raise ChatError(self._redact(f"invalid answer: {exc}")) from None
        self.usage.add(answered=1)
        if self._cache:
            self._cache.put(key, content)
        return value, key

    def _redact(self, text: str) -> str:
        return self._redactor.redact(text)

    # -- on the event loop ----------------------------------------------------------------
    async def _post_with_retries(self, body: dict) -> str:
        data = json.dumps(body).encode()
        attempts = self.config.max_retries + 1
        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=self._wait,
            retry=retry_if_exception_type(_Retryable),
            before_sleep=lambda _state: self.usage.add(retries=1),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._post(data)
        except _Retryable as exc:
            raise ChatError(f"{exc} (gave up after {attempts} attempts)") from None
        raise AssertionError("unreachable: tenacity returns or raises")

    def _wait(self, state) -> float:
        exc = state.outcome.exception()
        exponential = self.config.backoff_s * 2 ** (state.attempt_number - 1)
        delay = exc.retry_after if getattr(exc, "retry_after", None) is not None else exponential
        return min(self.config.backoff_cap_s, max(0.0, delay))

    async def _post(self, data: bytes) -> str:
        limit = self.config.max_connect_failures
        if self._connect_failures >= limit:
            raise ChatError(
                f"not sent: {self.url} is down ({self._connect_failures} connection failures "
                "in a row)"
            )
        self.usage.add(requests=1)
        try:
            status, headers, raw = await asyncio.wait_for(
                self._exchange(data), self.config.timeout_s
            )
        except _ConnectFailed:
            self._connect_failures += 1
            raise
        except (asyncio.TimeoutError, httpx2.TimeoutException):
            raise _Retryable(f"timeout after {self.config.timeout_s:g}s from {self.url}") from None
        if status == 429 or status >= 500:
            raise _Retryable(
                f"HTTP {status} from {self.url}: {self._shown(raw)}", _retry_after(headers)
            )
        if status != 200:
            raise ChatError(f"HTTP {status} from {self.url}: {self._shown(raw)}")
        return self._content(raw)

    async def _exchange(self, data: bytes) -> tuple[int, httpx2.Headers, bytes]:
        """Status, headers and at most ``max_response_bytes`` of body (else ChatError)."""
        cap = self.config.max_response_bytes
        try:
            async with self._http.stream("POST", self.url, content=data) as response:
                self._connect_failures = 0  # a server answered
                declared = response.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise ChatError(self._too_large(f"declares {int(declared):,} bytes"))
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > cap:
                        raise ChatError(self._too_large("sent more"))
                return response.status_code, response.headers, bytes(body)
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
            raise _ConnectFailed(f"cannot connect to {self.url}: {_reason(exc)}") from None
        except (httpx2.TransportError, httpx2.DecodingError) as exc:
            if isinstance(exc, httpx2.TimeoutException):
                raise
            raise _Retryable(f"connection to {self.url} failed: {_reason(exc)}") from None

    def _too_large(self, what: str) -> str:
        limit = self.config.max_response_bytes
        return f"response from {self.url} {what} than the limit of {limit:,} bytes"

    def _shown(self, raw: bytes) -> str:
        """At most 300 characters of a body, for an error message: redacted whole, then cut,
        so that no part of a key is left at the cut."""
        return self._redact(raw.decode("utf-8", "replace")).strip()[:300] or "(no body)"

    def _content(self, raw: bytes) -> str:
        try:
            payload = json.loads(raw)
            content = payload["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            shown = self._redact(raw.decode("utf-8", "replace"))[:200]
            raise ChatError(f"malformed response from {self.url}: {shown!r}") from None
        if not isinstance(content, str):
            raise ChatError(
                f"malformed response from {self.url}: message content is {type(content).__name__}"
            )
        usage = payload.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        self.usage.add(
            prompt_tokens=_count(usage.get("prompt_tokens")),
            completion_tokens=_count(usage.get("completion_tokens")),
        )
        # Decoded now: the answer is cached and quoted in findings.
        return redact_decoded(self._redactor, self._redact(content))


def redact_decoded(redactor: Redactor, text: str) -> str:
    """``text`` with a key removed once more inside the JSON it holds (from its first
    ``{`` to its last ``}``, where ``judge.llm.parse_answer`` reads it): a string that
    is a key only once its escapes are decoded (``"\\u0073\\u006b..."``) is replaced
    and that part re-encoded. Text without JSON, or JSON with no key in it, is returned
    unchanged, byte for byte."""
    start, end = text.find("{"), text.rfind("}")
    if not 0 <= start < end:
        return text
    try:
        decoded = json.loads(text[start : end + 1])
    except ValueError:
        return text
    cleaned = _redact_strings(redactor, decoded)
    if cleaned == decoded:
        return text
    return text[:start] + json.dumps(cleaned, ensure_ascii=False) + text[end + 1 :]


def _redact_strings(redactor: Redactor, value):
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, list):
        return [_redact_strings(redactor, v) for v in value]
    if isinstance(value, dict):
        return {redactor.redact(k): _redact_strings(redactor, v) for k, v in value.items()}
    return value


def _count(value) -> int:
    """A token count as reported; servers that omit or garble it count 0, not a crash."""
    return value if isinstance(value, int) and value >= 0 else 0


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _retry_after(headers: httpx2.Headers) -> float | None:
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to exponential backoff
