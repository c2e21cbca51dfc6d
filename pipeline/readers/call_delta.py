"""Delta call logs: a call stored as what it adds to the previous call of its session.

An agent's call ``k`` sends the whole history again: the previous request's messages, the
previous answer, and a few new messages; the engine's ``prompt_token_ids`` are the
previous prompt's ids, the previous output's ids and a few new ones. Stored whole, a
session's log grows with the square of its length (256 KB per call at 400 messages).
``seam gateway --log delta`` (the default) stores such a call as a *delta record*
against its *base*, the previous call of its session::

    {"session_id": S, "task_id": T,
     "request_delta": {"base": 16,            # seam.call of the base record
                       "keep_messages": 40,   # the first 40 of base messages + base answer
                       "messages": [...],     # then these
                       "keep_fields": ["model", "tools", ...],  # equal to the base's
                       ...other request fields, as sent},
     "response": {... without prompt_token_ids ...},
     "prompt_ids_delta": {"at": "response" | "choice", "keep": 5120, "ids": [...]},
     "seam": {..., "call": 17}}

The whole request is ``base request messages + [base answer message]`` cut to
``keep_messages``, then ``messages``; the fields in ``keep_fields`` are the base's, the
rest are given. The prompt ids are ``base prompt ids + base output ids`` cut to
``keep``, then ``ids``; ``at`` says where they were (vLLM puts ``prompt_token_ids`` on
the response, some engines on ``choices[0]``). Each prefix is kept only where the items
are equal (``==`` on the parsed JSON), so the reconstruction is exact whatever the
harness re-sends.

The first call of a session, a call that shares nothing with its base (a compaction
rewrote the context), and at least every ``FULL_EVERY`` (32) calls are full records, so
a cut or unreadable line costs at most the calls up to the next full record: those
deltas are quarantined with the reason (their base was not read). The price of that
bound: full records add about ``history / FULL_EVERY`` bytes per call, so the log of an
``N``-call session is ``N × (new bytes per call) + N² × (bytes per call of history) /
(2 × FULL_EVERY)`` — 32 to 64 times less than full records' quadratic term, not zero
(any scheme in which one lost line costs at most K calls must store each history item
in at least (remaining calls)/K records, the same order).

Records are numbered per session (``seam.call``); a record whose answer was not
delivered (``seam.delivered: false``) is never a base. Full logs (``--log full``, and
every log written before deltas) are read as they always were.
"""

from __future__ import annotations

from typing import Any

from pipeline.readers.raw_ids import RawIds, common_prefix

FULL_EVERY = 32


class MissingBase(ValueError):
    """A delta record whose base was not read (quarantined, cut, or never written)."""


def _common_prefix(a: list, b: list, guess: int | None = None, known: int = 0) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (``==`` per item).
    Tried first: the whole of the shorter one (a call that extends its base whole) and
    ``guess`` (the base's request alone: a harness that re-sends the answer in another
    form; the prompt alone: an engine whose chat template renders the answer otherwise),
    each one C-level comparison; else a binary search on prefix equality (monotone: a
    prefix of an equal prefix is equal), ``O(log n)`` slice comparisons instead of a
    Python loop over every id. (A binary search for every call cost 1.8 ms at 6,000 ids.)
    ``known``: a length of prefix the caller already knows equal (not compared again)."""
    n = min(len(a), len(b))
    known = min(known, n)
    for k in (n, guess):
        if k is None or not (0 < k <= n and known <= k):
            continue
        if a[known:k] == b[known:k] and (k == n or a[k] != b[k]):
            return k
    lo, hi = known, n - 1  # a[:lo] == b[:lo] and a[:hi+1] != b[:hi+1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _answer_message(response: dict) -> dict | None:
    choice = (response.get("choices") or [None])[0]
    return choice.get("message") if isinstance(choice, dict) else None


def prompt_ids(response: dict) -> tuple[str, list | RawIds] | None:
    """(where, the prompt's ids) of a chat-completions response, if it has them (a list,
    or the gateway's RawIds: the engine's bytes, pipeline/readers/raw_ids.py)."""
    if isinstance(response.get("prompt_token_ids"), (list, RawIds)):
        return "response", response["prompt_token_ids"]
    choice = (response.get("choices") or [None])[0]
    if isinstance(choice, dict) and isinstance(choice.get("prompt_token_ids"), (list, RawIds)):
        return "choice", choice["prompt_token_ids"]
    return None


def _output_ids(response: dict) -> list:
    choice = (response.get("choices") or [None])[0]
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    return ids if isinstance(ids, list) else []


def base_messages(record: dict) -> list:
    """What a call that extends ``record`` starts with: its request's messages and its
    answer."""
    messages = list(record["request"].get("messages") or [])
    answer = _answer_message(record["response"])
    return messages + [answer] if answer is not None else messages


def base_ids(record: dict) -> list:
    found = prompt_ids(record["response"])
    prompt = found[1] if found else []
    if isinstance(prompt, RawIds):
        prompt = prompt.to_list()
    return prompt + _output_ids(record["response"])


def _ids_delta(ids: list | RawIds, base: dict) -> tuple[int, list | RawIds]:
    """(how many leading ids of ``ids`` the base's prompt + output ids give, the rest).
    On the engine's bytes when the gateway kept them (RawIds: byte comparisons instead
    of 40,000 int comparisons at a 400-message history), else on the lists."""
    base_found = prompt_ids(base["response"])
    base_prompt = base_found[1] if base_found else []
    if isinstance(ids, RawIds):
        return common_prefix(ids, RawIds.of(base_prompt), _output_ids(base["response"]))
    kept = _common_prefix(ids, base_ids(base), len(base_prompt) if base_found else None)
    return kept, ids[kept:]


def encode(record: dict, base: dict | None, base_call: int | None, known: int = 0) -> dict:
    """``record`` (a full call record, keys in the gateway's order, ``seam`` last) as a
    delta record against ``base`` (the full record of call ``base_call``), or ``record``
    itself when a delta would not help (no base, nothing shared). ``known``: how many
    leading messages the caller knows equal to the base request's (not compared again)."""
    if base is None or base_call is None:
        return record
    request, response = record["request"], record["response"]
    messages = request.get("messages") or []
    sent = len(base["request"].get("messages") or [])
    keep = _common_prefix(messages, base_messages(base), sent, min(known, sent))
    if keep == 0:
        return record  # a rewritten context: a full record starts a new chain
    delta: dict[str, Any] = {"base": base_call, "keep_messages": keep, "messages": messages[keep:]}
    base_request = base["request"]
    same = [
        k
        for k, v in request.items()
        if k != "messages" and k in base_request and base_request[k] == v
    ]
    delta["keep_fields"] = same
    for k, v in request.items():
        if k != "messages" and k not in same:
            delta[k] = v
    out: dict[str, Any] = {
        k: v for k, v in record.items() if k not in ("request", "response", "seam")
    }
    out["request_delta"] = delta
    found = prompt_ids(response)
    if found is not None:
        where, ids = found
        kept, rest = _ids_delta(ids, base)
        response = dict(response)
        if where == "response":
            response.pop("prompt_token_ids")
        else:
            choices = list(response["choices"])
            choices[0] = {k: v for k, v in choices[0].items() if k != "prompt_token_ids"}
            response["choices"] = choices
        out["response"] = response
        out["prompt_ids_delta"] = {"at": where, "keep": kept, "ids": rest}
    else:
        out["response"] = response
    out["seam"] = record["seam"]
    return out


def is_delta(record: dict) -> bool:
    return isinstance(record.get("request_delta"), dict)


def decode(record: dict, base: dict) -> dict:
    """The full record of delta ``record`` given its base's full record. A ValueError
    when the delta does not fit its base (a damaged line)."""
    delta = record["request_delta"]
    prefix = base_messages(base)
    keep = delta.get("keep_messages")
    new = delta.get("messages")
    if not isinstance(keep, int) or not 0 <= keep <= len(prefix) or not isinstance(new, list):
        raise ValueError(f"delta record: keep_messages {keep!r} does not fit its base")
    base_request = base["request"]
    request: dict[str, Any] = {}
    for k in delta.get("keep_fields") or []:
        if k not in base_request:
            raise ValueError(f"delta record: field {k!r} is kept but its base has none")
        request[k] = base_request[k]
    for k, v in delta.items():
        if k not in ("base", "keep_messages", "messages", "keep_fields"):
            request[k] = v
    request["messages"] = prefix[:keep] + new
    response = record.get("response")
    if not isinstance(response, dict):
        raise ValueError("delta record: no response object")
    ids_delta = record.get("prompt_ids_delta")
    if ids_delta is not None:
        prior = base_ids(base)
        kept, tail, where = ids_delta.get("keep"), ids_delta.get("ids"), ids_delta.get("at")
        if not isinstance(kept, int) or not 0 <= kept <= len(prior) or not isinstance(tail, list):
            raise ValueError(f"delta record: prompt ids keep {kept!r} does not fit its base")
        ids = prior[:kept] + tail
        response = dict(response)
        if where == "choice":
            choices = list(response.get("choices") or [])
            if not choices or not isinstance(choices[0], dict):
                raise ValueError("delta record: prompt ids on a response without choices")
            choices[0] = {**choices[0], "prompt_token_ids": ids}
            response["choices"] = choices
        else:
            response["prompt_token_ids"] = ids
    out = {
        k: v
        for k, v in record.items()
        if k not in ("request_delta", "prompt_ids_delta", "response", "seam")
    }
    out["request"] = request
    out["response"] = response
    if "seam" in record:
        out["seam"] = record["seam"]
    return out


def call_number(record: dict) -> int | None:
    seam = record.get("seam")
    number = seam.get("call") if isinstance(seam, dict) else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def delivered(record: dict) -> bool:
    seam = record.get("seam")
    return not (isinstance(seam, dict) and seam.get("delivered") is False)


class Resolver:
    """Turns one session's records, in file order, into full records: ``resolve`` a
    record (a MissingBase or ValueError says why it cannot be), then ``accept`` the full
    record if it may be a base (read, and its answer delivered). The last few accepted
    records are kept by number (a base is nearly always the last one)."""

    KEEP = 4

    def __init__(self) -> None:
        self.bases: dict[int, dict] = {}

    def resolve(self, record: dict) -> dict:
        if not is_delta(record):
            return record
        number = record["request_delta"].get("base")
        base = self.bases.get(number) if isinstance(number, int) else None
        if base is None:
            raise MissingBase(
                f"call {call_number(record)} is stored as a change to call {number}, which was "
                "not read (its line was cut or quarantined); the calls up to the next full "
                "record go with it"
            )
        return decode(record, base)

    def accept(self, full: dict) -> None:
        number = call_number(full)
        if number is None or not delivered(full):
            return
        self.bases[number] = full
        while len(self.bases) > self.KEEP:
            del self.bases[min(self.bases)]
