"""A session's next request parsed without parsing again the history it re-sends.

An agent sends its whole history with every call: at 400 messages the request is 160 KB,
and ``orjson.loads`` of it was the largest part of the gateway's own CPU per call (~0.28
ms; issue 26, item 4). A harness re-sends the history byte for byte (one serializer, one
layout), so the next request starts with the previous request's bytes up to the end of
its last history item, then a comma and the new items. ``RequestParser.parse`` checks that
with one ``memcmp`` and parses only what is new:

- the new items, ``[`` + the bytes after that comma up to the history array's ``]``;
- the rest of the body, with the whole history array cut out and a sentinel string in
  its place (``SENTINEL``: a random nonce no request can contain), which also proves that
  the array is the value the body's ``key`` ends up with (a later duplicate member of that
  name would replace the sentinel);

and the history is the previous request's items (the same objects: equal bytes parse to
equal objects) followed by the new ones.

Why it is the same as ``orjson.loads(raw)``. Write ``raw = A [ I , S ] Z`` where
``A [ I`` are the previous request's bytes up to its last item (``I``: its items), ``S``
the new items and ``Z`` what follows the array. A JSON parser reads left to right, so on
``A [ I`` it is in the same state as on the previous request: inside the array that is the
value of the member ``key``, after the items ``I``. After the comma it expects an item,
exactly as after ``[`` when ``S`` is not empty, so ``[ S ]`` parses (as a whole document)
if and only if the array in ``raw`` ends at that ``]``, to the items ``S`` gives there; and
``A "sentinel" Z`` parses to ``raw``'s other members in their order, each with its last
value, exactly when ``raw`` does. Where the array ends is found from where a parse of
``[ S ] Z`` stops (orjson's error position), then proved by that whole-document parse.

A request under ``MIN_BYTES`` (16 KB) is parsed whole: there one parse costs less than
the shortcut's three small ones.

A request that does not start with the previous one's bytes (the first call, a rewritten
or compacted context, another layout) is parsed whole, and the parser then finds its
history array (the same two proofs) to continue from. A harness whose requests never
continue each other's bytes (one that moves a cache marker every call) would pay that
search on every call: after each miss the search waits longer (0, 1, 3, 7, ... up to 64
requests).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

# A string no request can hold: chosen at random when the gateway starts, never sent.
NONCE = "seam-history-" + secrets.token_hex(16)
SENTINEL = orjson.dumps(NONCE)
_SPACE = b" \t\r\n"
MAX_WAIT = 64
# Smaller requests are parsed whole: the shortcut's three small parses cost ~8-10 µs, one
# parse of 16 KB (~40 messages) about as much (measured: 4.6 µs whole vs 8.4 µs at 2 KB,
# 278 vs 24 µs at 160 KB).
MIN_BYTES = 16 * 1024


class RequestParser:
    """Parses one session's requests (``parse``); keeps the previous request's bytes and
    where its history array is (memory: one request's bytes per session)."""

    __slots__ = (
        *("raw", "open_at", "close", "key", "items", "wait", "backoff", "hits", "min_bytes"),
        "prior",
    )

    def __init__(self, min_bytes: int = MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self.raw: bytes | None = None  # the previous request, whose history ``items`` is
        self.open_at = self.close = 0  # its history array's ``[`` and ``]``
        self.key = ""
        self.items: list = []
        self.wait = 0  # requests to parse whole before searching for the array again
        self.backoff = 1
        self.hits = 0  # requests parsed from the previous one (for the tests)
        # The previous request's history list when the last ``parse`` continued it: the
        # new history starts with that list's very items (the same objects), else None.
        self.prior: list | None = None

    def parse(self, raw: bytes, key: str) -> Any:
        """``orjson.loads(raw)`` (its errors too), with ``raw[key]``'s shared history not
        parsed again when ``raw`` continues the previous request of this parser."""
        self.prior = None
        if len(raw) < self.min_bytes:
            self.raw = None
            return orjson.loads(raw)
        missed = False
        if self.raw is not None:
            body = self._continued(raw, key)
            if body is not None:
                self.hits += 1
                self.backoff = 1
                return body
            self.raw, missed = None, True
        body = orjson.loads(raw)
        if missed:
            self._missed()
        elif self.wait:
            self.wait -= 1
        elif (
            isinstance(body, dict)
            and isinstance(body.get(key), list)
            and body[key]
            and not self._find(raw, key, body)
        ):
            self._missed()
        return body

    def _missed(self) -> None:
        """A request that did not continue the previous one, or whose history array was
        not found: search again after 0, 1, 3, 7, ... requests (at most ``MAX_WAIT``)."""
        self.wait, self.backoff = self.backoff - 1, min(2 * self.backoff, MAX_WAIT)

    def _continued(self, raw: bytes, key: str) -> dict | None:
        assert self.raw is not None
        e = self.close
        if key != self.key or len(raw) <= e or raw[e] != 44:  # 44: the comma
            return None
        if not raw.startswith(memoryview(self.raw)[:e]):
            return None
        found = _array_at(raw, e)
        if found is None:
            return None
        close, new = found
        if not new:  # "[I,]": invalid JSON, which the whole parse reports
            return None
        body = _without_array(raw, self.open_at, close, key)
        if body is None:
            return None
        body[key] = items = self.items + new
        self.prior = self.items
        self.raw, self.close, self.items = raw, close, items
        return body

    def _find(self, raw: bytes, key: str, body: dict) -> bool:
        """Remember where ``raw``'s history array is (``body``: ``raw`` parsed); False
        when it was not found."""
        quoted = orjson.dumps(key)
        at = raw.find(quoted)
        for _ in range(4):  # the key's first occurrences (a top-level key comes early)
            if at == -1:
                return False
            j = _skip_space(raw, at + len(quoted))
            if j < len(raw) and raw[j] == 58:  # ':'
                j = _skip_space(raw, j + 1)
                if j < len(raw) and raw[j] == 91:  # '['
                    found = _array_at(raw, j)
                    if (
                        found is not None
                        and found[1] == body[key]
                        and _without_array(raw, j, found[0], key) is not None
                    ):
                        self.raw, self.open_at, self.close = raw, j, found[0]
                        self.key, self.items = key, body[key]
                        return True
            at = raw.find(quoted, at + 1)
        return False


def _skip_space(raw: bytes, at: int) -> int:
    while at < len(raw) and raw[at] in _SPACE:
        at += 1
    return at


def _array_at(raw: bytes, at: int) -> tuple[int, list] | None:
    """(where the array that ``[`` + ``raw[at + 1:]`` starts ends in ``raw``, its items),
    or None. The end is where a parse of the rest stops (the content after the array),
    and it is proved by parsing the array alone as a whole document."""
    doc = b"[" + raw[at + 1 :]
    try:
        orjson.loads(doc)
        return None  # nothing after the array: not a member of an object
    except orjson.JSONDecodeError as exc:
        pos, text = exc.pos, exc.doc
    if not isinstance(pos, int) or not 0 < pos <= len(doc):
        return None
    if not doc.isascii():  # orjson's position counts characters
        if not isinstance(text, str):
            return None
        pos = len(text[:pos].encode())
    end = len(doc[:pos].rstrip(_SPACE)) - 1
    if end < 1 or doc[end] != 93:  # ']'
        return None
    try:
        items = orjson.loads(doc[: end + 1])
    except orjson.JSONDecodeError:
        return None
    return (at + end, items) if isinstance(items, list) else None


def _without_array(raw: bytes, open_at: int, close: int, key: str) -> dict | None:
    """``raw`` parsed with ``raw[open_at : close + 1]`` replaced by the sentinel, if that
    is an object whose ``key`` ends up holding the sentinel (the array is the member's
    last value), else None."""
    try:
        body = orjson.loads(raw[:open_at] + SENTINEL + raw[close + 1 :])
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) and body.get(key) == NONCE else None
