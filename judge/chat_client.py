"""A small client for OpenAI-compatible ``/v1/chat/completions`` endpoints (vLLM, SGLang,
hosted APIs), written for batch judging: stdlib HTTP only, total-time timeouts, retries
with exponential backoff on 429/5xx/timeouts/dropped connections (``Retry-After`` is
honoured), a content-addressed on-disk cache, and token/cost accounting.

- **Cache.** The key is the SHA-256 of the canonical JSON request body (model, messages,
  sampling settings). Only answers the caller's ``validate`` accepted are stored, so a
  rerun over the same inputs sends no request at all, and a bad answer is asked again.
- **Backoff.** Attempt ``a`` (0-based) waits ``min(backoff_cap_s, backoff_s · 2^a)``, or
  the server's ``Retry-After`` when it sends one (capped the same way).
- **Secrets.** The API key is read from the environment variable the caller names, sent
  only in the ``Authorization`` header, and never appears in errors, logs or the cache:
  every text that came from the server (error bodies, malformed responses, answers) has
  the key replaced with ``***`` before it is stored, logged or raised, since some
  gateways echo the ``Authorization`` header back.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ChatError(Exception):
    """A request that failed for good (after retries); the message is safe to print."""


REDACTED = "***"


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***``."""
    return text.replace(secret, REDACTED) if secret else text


@dataclass(frozen=True)
class ClientConfig:
    url: str
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 1.0
    backoff_cap_s: float = 30.0
    temperature: float = 0.0
    max_tokens: int = 1024
    json_mode: bool = True
    cache_dir: str | None = None
    price_in_per_mtok: float = 0.0  # currency units per 1M prompt tokens
    price_out_per_mtok: float = 0.0  # currency units per 1M completion tokens


@dataclass
class Usage:
    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0
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
            "failures",
            "prompt_tokens",
            "completion_tokens",
        )
        return {**{k: getattr(self, k) for k in keys}, "cost": round(self.cost(config), 6)}


def endpoint(url: str) -> str:
    """Accept a server root, a ``/v1`` base or the full chat-completions URL."""
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ChatClient:
    def __init__(self, config: ClientConfig):
        self.config = config
        self.url = endpoint(config.url)
        self.usage = Usage()
        self._api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self._cache = Path(config.cache_dir) if config.cache_dir else None

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
        cached = self._cache_get(key)
        if cached is not None:
            self.usage.add(cache_hits=1)
            return validate(cached), key
        try:
            content = self._post_with_retries(body)
        except ChatError as exc:
            self.usage.add(failures=1)
            raise ChatError(self._redact(str(exc))) from None
        try:
            value = validate(content)
        except ValueError as exc:
            self.usage.add(failures=1)
            raise ChatError(self._redact(f"invalid answer: {exc}")) from None
        self._cache_put(key, content)
        return value, key

    def _post_with_retries(self, body: dict) -> str:
        data = json.dumps(body).encode()
        for attempt in range(self.config.max_retries + 1):
            try:
                return self._post(data)
            except _Retryable as exc:
                if attempt == self.config.max_retries:
                    raise ChatError(f"{exc} (gave up after {attempt + 1} attempts)") from None
                self.usage.add(retries=1)
                delay = (
                    exc.retry_after
                    if exc.retry_after is not None
                    else self.config.backoff_s * 2**attempt
                )
                time.sleep(min(self.config.backoff_cap_s, max(0.0, delay)))
        raise AssertionError("unreachable: the loop returns or raises")

    def _post(self, data: bytes) -> str:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        deadline = time.monotonic() + self.config.timeout_s
        self.usage.add(requests=1)
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                raw = self._read_until(response, deadline)
        except urllib.error.HTTPError as exc:
            # read past the 300 shown bytes so a key echoed across the cut is whole when redacted
            detail = self._redact(_error_detail(exc, 300 + len(self._api_key or "")))[:300]
            if exc.code == 429 or exc.code >= 500:
                raise _Retryable(
                    f"HTTP {exc.code} from {self.url}: {detail}", _retry_after(exc.headers)
                ) from None
            raise ChatError(f"HTTP {exc.code} from {self.url}: {detail}") from None
        except TimeoutError:
            raise _Retryable(f"timeout after {self.config.timeout_s:g}s from {self.url}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                raise _Retryable(
                    f"timeout after {self.config.timeout_s:g}s from {self.url}"
                ) from None
            raise _Retryable(self._redact(f"cannot reach {self.url}: {exc.reason}")) from None
        except (ConnectionError, http.client.HTTPException) as exc:
            raise _Retryable(f"connection to {self.url} failed: {type(exc).__name__}") from None
        return self._content(raw)

    def _read_until(self, response, deadline: float) -> bytes:
        """Read the body, failing once the total time passes the deadline: a server that
        trickles bytes must not hold a worker forever."""
        chunks: list[bytes] = []
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError
            chunk = response.read(1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def _redact(self, text: str) -> str:
        return redact(text, self._api_key)

    def _content(self, raw: bytes) -> str:
        try:
            payload = json.loads(raw)
            content = payload["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            # redact before cutting to 200 characters, so no half key is shown
            shown = self._redact(raw[: 800 + len(self._api_key or "")].decode("utf-8", "replace"))[
                :200
            ]
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
        return self._redact(content)  # the answer is cached and quoted in findings

    # -- cache ------------------------------------------------------------------------
    def _cache_path(self, key: str) -> Path | None:
        return self._cache / key[:2] / f"{key}.json" if self._cache else None

    def _cache_get(self, key: str) -> str | None:
        path = self._cache_path(key)
        if path is None or not path.exists():
            return None
        return json.loads(path.read_text())["content"]

    def _cache_put(self, key: str, content: str) -> None:
        path = self._cache_path(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"model": self.config.model, "content": content}))
        os.replace(tmp, path)


def _count(value) -> int:
    """A token count as reported; servers that omit or garble it count 0, not a crash."""
    return value if isinstance(value, int) and value >= 0 else 0


def _error_detail(exc: urllib.error.HTTPError, limit: int = 300) -> str:
    try:
        return exc.read(limit).decode("utf-8", "replace").strip()
    except (OSError, http.client.HTTPException):
        return "(no body)"


def _retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to exponential backoff
