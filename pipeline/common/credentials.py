"""Credentials written into a URL, taken out of it before anything prints or stores it.

``seam judge --llm URL``, ``seam gateway --upstream URL`` and ``seam gateway --judge URL``
all go through ``split_url``. A URL may carry a key two ways:

- **userinfo** (``https://user:KEY@host/v1``, RFC 3986 §3.2.1): sent as what HTTP
  clients send for it, ``Authorization: Basic base64(user:KEY)`` (RFC 7617), so a server
  that accepted the URL accepts the request;
- **a query parameter** whose name says credential (``?key=``, ``api_key=``,
  ``api-key=``, ``access_token=``, ``token=``, ``sig=``...: ``CREDENTIAL_PARAM``): sent as
  ``Authorization: Bearer KEY``, the header OpenAI-compatible servers read (vLLM,
  SGLang, OpenAI, Gemini's OpenAI endpoint).

What is left, ``Endpoint.url``, is the only form of the URL seam prints, writes
(``gateway.json``, findings, error files) or puts in an error message; the values taken
out are ``Endpoint.secrets``, for the redactor (``pipeline/common/redact.py``) that scrubs what
servers send back. A key from ``--api-key-env`` is sent as a bearer token when the URL
holds none: the URL is the more specific of the two (``seam judge`` reads
``OPENAI_API_KEY`` by default, which may belong to another service). Both are redacted.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

CREDENTIAL_PARAM = re.compile(r"key|token|secret|passw|auth|sig|credential|session", re.I)


@dataclass(frozen=True)
class Endpoint:
    url: str  # no credentials left: safe to print and to write
    headers: dict[str, str] = field(default_factory=dict)  # the credentials, to send
    secrets: tuple[str, ...] = ()  # every credential value, to redact


def split_url(url: str, bearer: str | None = None) -> Endpoint:
    """``url`` without its credentials, the header that carries them, and their values.
    ``bearer`` (a key from the environment) is sent as ``Authorization: Bearer`` when
    the URL carries no credential, and redacted either way."""
    parts = urlsplit(url)
    secrets: list[str] = []
    headers: dict[str, str] = {}
    host = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        user, password = unquote(user), unquote(password)
        secrets += [s for s in (user, password) if s]
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
        secrets.append(token)
    kept: list[tuple[str, str]] = []
    taken: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        (taken if CREDENTIAL_PARAM.search(name) else kept).append((name, value))
    secrets += [value for _, value in taken if value]
    first = next((value for _, value in taken if value), None)
    if first is not None and "Authorization" not in headers:
        headers["Authorization"] = f"Bearer {first}"
    if bearer:
        headers.setdefault("Authorization", f"Bearer {bearer}")
        secrets.append(bearer)
    query = urlencode(kept) if taken else parts.query  # untouched when nothing was taken
    # The fragment is never sent over HTTP, so it is dropped rather than shown.
    clean = urlunsplit((parts.scheme, host, parts.path, query, ""))
    return Endpoint(clean, headers, tuple(dict.fromkeys(secrets)))


def with_path(url: str, change) -> str:
    """``url`` with its path replaced by ``change(path)``; the query stays after it
    (``http://h/v1?x=1`` + ``/models`` is ``http://h/v1/models?x=1``)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=change(parts.path)))
