"""A prompt's token ids kept as the engine's JSON bytes, not parsed into Python ints.

The engine returns the whole prompt's ids with every call (``prompt_token_ids``: 40,000
ids at a 400-message history). Parsing them into ints, comparing them with the previous
call's and dumping them again was most of the gateway's CPU per call (issue 26, item 4:
parse ~4.5 ms, compare ~2 ms, depth walk ~0.8 ms on the shared VM). ``split_prompt_ids``
cuts the array out of the engine's bytes before parsing the rest, the delta log's common
prefix is found on the bytes (``common_prefix``), and the record is written with the
bytes spliced in (``orjson.Fragment``).

Exactness. The array is taken only when its body is *canonical*: decimal digits and
single commas, no sign, no leading zero, no space (what vLLM's and SGLang's compact
JSON gives). Each int then has exactly one spelling, so two bodies are equal byte for
byte exactly when their id lists are equal, and a common prefix of ids is a common
prefix of bytes that ends at a comma in both. Anything else (spaces, another layout, a
key that also appears elsewhere) is parsed as before: ``split_prompt_ids`` returns
``None`` and the caller parses the whole answer.
"""

from __future__ import annotations

from typing import Any

import orjson

NAME = b'"prompt_token_ids"'
KEY = NAME + b":["
_NOT_ID_BYTES = b"0123456789,"


class RawIds:
    """A list of token ids as the canonical body of its JSON array (between the brackets;
    digits and commas, or ``-`` from ``of``: never a ``]``), with its length; ``base``: ids
    these were checked to start with (whole ids) when they were cut out, so that
    ``common_prefix`` does not compare those bytes again. A hint, used once: a chain of
    them would keep every earlier prompt of a session alive.

    ``body`` is bytes, or (cut out of an engine's answer by ``split_prompt_ids``) a
    ``memoryview`` of the answer's bytes: copying 40,000 ids' 200 KB cost ~25 µs a call.
    A view is only read by bytes methods of other objects (``bytes.startswith`` takes
    it, ``b"[" + view`` copies it) or copied first: ``==`` between views compares item by
    item (~1.7 ms for 200 KB), and a view has no ``startswith``/``find``."""

    __slots__ = ("body", "count", "base")

    def __init__(self, body: bytes | memoryview, count: int, base: RawIds | None = None):
        self.body, self.count, self.base = body, count, base

    @classmethod
    def of(cls, ids: list | RawIds) -> RawIds:
        """``ids`` as RawIds (orjson writes ints canonically)."""
        return ids if isinstance(ids, RawIds) else cls(orjson.dumps(ids)[1:-1], len(ids))

    def __len__(self) -> int:
        return self.count

    def to_list(self) -> list[int]:
        return orjson.loads(b"[" + self.body + b"]")

    def plus(self, ids: list) -> RawIds:
        """These ids followed by ``ids``."""
        if not ids:
            return self
        more = orjson.dumps(ids)[1:-1]
        body = b"".join((self.body, b",", more)) if self.body else more  # a view has no +
        return RawIds(body, self.count + len(ids))


def canonical(body: bytes) -> bool:
    """Whether ``body`` is a canonical array body: ``1,22,0,333`` (or empty)."""
    if not body:
        return True
    if body.translate(None, _NOT_ID_BYTES) or body[0] == 44 or body[-1] == 44 or b",," in body:
        return False
    # No leading zero: an id starting with 0 is the id 0 itself.
    if body[0] == 48 and len(body) > 1 and body[1] != 44:
        return False
    at = body.find(b",0")
    while at != -1:
        if at + 2 < len(body) and body[at + 2] != 44:
            return False
        at = body.find(b",0", at + 2)
    return True


def _boundary(body: bytes | memoryview, at: int) -> bool:
    """Whether an id ends at byte ``at`` of ``body``."""
    return at == len(body) or body[at] == 44


def _extends(body: bytes, known: RawIds) -> bool:
    """Whether ``body`` (bytes) starts with all of ``known``'s ids (one ``memcmp``)."""
    return known.count > 0 and body.startswith(known.body) and _boundary(body, len(known.body))


def split_prompt_ids(data: bytes, known: RawIds | None = None) -> tuple[Any, RawIds, bytes] | None:
    """(the answer parsed with its prompt ids as RawIds in place, the ids, the bytes parsed:
    the answer with ``null`` for the ids) for
    an answer whose ``prompt_token_ids`` array (on the answer or on ``choices[0]``, where
    vLLM and SGLang put it) can be cut out exactly; None otherwise (parse it whole).

    The key's bytes must occur once and start a key (the quote is not escaped: inside a
    JSON string a quote is ``\\"``), its array body must be canonical, and after parsing
    the rest with ``null`` in its place the key must be on the answer or on ``choices[0]``.
    ``known`` is the previous call's prompt: when this prompt starts with it (an agent's
    next call), only the bytes after it are checked and counted — the gateway's cost per
    call then grows with what the call adds, not with the history (a byte pass over
    40,000 ids costs more than parsing them)."""
    # The name's first occurrence must be the key (one scan: the key's first occurrence
    # is the name's exactly when the name's first is followed by ":[")
    start = data.find(NAME)
    if start <= 0 or data[start - 1] == 92:  # 92: a backslash, the quote is escaped
        return None
    if not data.startswith(b":[", start + len(NAME)):
        return None
    begin = start + len(KEY)
    # The known prefix compared where it stands (one memcmp; its bytes hold no "]", so the
    # array's end is searched for only after it)
    extends = (
        known is not None
        and known.count > 0
        and data.startswith(known.body, begin)
        and data[begin + len(known.body) : begin + len(known.body) + 1] in (b",", b"]")
    )
    end = data.find(b"]", begin + len(known.body) if extends and known else begin)
    if end == -1 or data.find(NAME, end) != -1:
        return None
    # A view of the answer's bytes, not a copy (RawIds); only what is new is copied, to be
    # checked
    body = memoryview(data)[begin:end]
    if extends:
        assert known is not None
        checked, count = len(known.body) + 1, known.count
    else:
        checked, count = 0, 0
    new = bytes(body[checked:])
    if not canonical(new):
        return None
    ids = RawIds(body, count + (new.count(b",") + 1 if new else 0), known if extends else None)
    if known is not None:
        known.base = None  # no chain
    rest = data[:start] + b'"prompt_token_ids":null' + data[end + 1 :]
    try:
        parsed = orjson.loads(rest)
    except orjson.JSONDecodeError:
        return None
    if isinstance(parsed, dict) and "prompt_token_ids" in parsed:
        holder = parsed
    else:
        choices = parsed.get("choices") if isinstance(parsed, dict) else None
        first = choices[0] if isinstance(choices, list) and choices else None
        if not (isinstance(first, dict) and "prompt_token_ids" in first):
            return None
        holder = first
    holder["prompt_token_ids"] = ids  # the key's only occurrence: the null put there
    return parsed, ids, rest


def common_prefix(ids: RawIds, prompt: RawIds, output: list) -> tuple[int, RawIds]:
    """(how many leading ids ``ids`` shares with ``prompt`` + ``output`` (the previous
    call's prompt and sampled ids), the rest of ``ids``). An agent's next prompt starts
    with the previous prompt (one ``memcmp``), then with as many of the output ids as the
    chat template renders back (checked id by id, at most the output's length); a prompt
    that differs earlier (rare: the delta log starts a new chain when the messages
    differ) is compared on whole lists."""
    a = ids.body
    checked, ids.base = ids.base is prompt, None  # the hint is used once
    if prompt.count and not (checked or _extends(bytes(a), prompt)):
        base = prompt.to_list() + output
        mine = ids.to_list()
        kept = 0
        for x, y in zip(mine, base, strict=False):
            if x != y:
                break
            kept += 1
        return kept, RawIds.of(mine[kept:])
    kept = prompt.count
    # The ids after the previous prompt (what this call adds), copied out of a view: a
    # short tail, which bytes methods then read
    tail = bytes(a[len(prompt.body) :])
    more, at = _output_kept(tail, 0, kept > 0, output)
    kept += more
    if kept == 0:
        return 0, ids
    return kept, RawIds(tail[at + 1 :], ids.count - kept)


def _output_kept(a: bytes, at: int, lead: bool, output: list) -> tuple[int, int]:
    """(how many leading ids of ``output`` the canonical body ``a`` continues with at byte
    ``at``, each a whole id; the byte where the last of them ends). ``lead``: ids came
    before, so the first one is preceded by a comma.

    One comparison of bytes instead of one per id (an answer of 1,000 tokens made a Python
    loop of 1,000 steps per call): ``t`` is the output as ``a`` would spell it (its canonical
    body); the longest common prefix ``m`` of ``t`` and ``a[at:]`` (a binary search of
    ``startswith``) covers exactly the ids that end before ``m`` (each is followed by a
    comma in both), plus the one ending at ``m`` if ``a`` has an id boundary there. An
    output that is not all non-negative ints (never from a real engine) goes id by id."""
    try:
        t = orjson.dumps(output)[1:-1]
    except orjson.JSONEncodeError:  # e.g. an int past 64 bits
        return _output_kept_each(a, at, lead, output)
    if not output or not canonical(t):
        return _output_kept_each(a, at, lead, output)
    lead_len = 1 if lead else 0
    if lead:
        t = b"," + t
    if a.startswith(t, at) and _boundary(a, at + len(t)):
        return len(output), at + len(t)
    lo, hi = 0, min(len(t), len(a) - at)  # t[:lo] is a prefix of a[at:]; t[:hi + 1] is not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(t[:mid], at):
            lo = mid
        else:
            hi = mid - 1
    m = lo
    kept = t.count(b",", lead_len, m)  # the ids followed by a comma inside the match
    end = t.rfind(b",", lead_len, m) if kept else 0
    if m > lead_len and (m == len(t) or t[m] == 44) and _boundary(a, at + m):
        kept, end = kept + 1, m
    return kept, at + end


def _output_kept_each(a: bytes, at: int, lead: bool, output: list) -> tuple[int, int]:
    """``_output_kept`` one id at a time (any output)."""
    kept = 0
    for token in output:
        piece = (b"," if lead or kept else b"") + str(token).encode()
        if not (a.startswith(piece, at) and _boundary(a, at + len(piece))):
            break
        at, kept = at + len(piece), kept + 1
    return kept, at


def default(value: Any) -> Any:
    """``orjson.dumps(..., default=default)``: RawIds are written as their bytes."""
    if isinstance(value, RawIds):
        return orjson.Fragment(b"[" + value.body + b"]")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def materialized(value: Any) -> Any:
    """``value`` with every RawIds in it (in dicts and lists) as a list of ints."""
    if isinstance(value, RawIds):
        return value.to_list()
    if isinstance(value, dict):
        return {k: materialized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [materialized(v) for v in value]
    return value
