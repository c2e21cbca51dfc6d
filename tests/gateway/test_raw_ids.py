"""The prompt's ids kept as the engine's bytes (pipeline/readers/raw_ids.py) give exactly
what parsing them gives: the same delta records, byte for byte, the same full records,
and a whole parse whenever the bytes are not the canonical compact form."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.readers import call_delta, raw_ids
from pipeline.readers.raw_ids import RawIds, canonical, common_prefix, split_prompt_ids
from tests.examples import examples

ids_st = st.lists(st.integers(0, 200_000), max_size=40)


def _answer(prompt: list, output: list, at: str = "response") -> dict:
    out: dict = {
        "id": "x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    }
    out["choices"][0]["token_ids"] = output
    if at == "response":
        out["prompt_token_ids"] = prompt
    else:
        out["choices"][0]["prompt_token_ids"] = prompt
    return out


def _record(n: int, messages: list, response: dict) -> dict:
    return {
        "session_id": "s",
        "task_id": "t",
        "request": {"model": "m", "messages": messages},
        "response": response,
        "seam": {"call": n},
    }


def _line(record: dict) -> bytes:
    return orjson.dumps(record, default=raw_ids.default)


@settings(max_examples=examples(60, 300), deadline=None)
@given(
    prompt=ids_st,
    output=ids_st,
    keep=st.integers(0, 80),
    extra=ids_st,
    at=st.sampled_from(["response", "choice"]),
    known=st.booleans(),
)
def test_a_delta_from_the_engines_bytes_equals_the_parsed_one(
    prompt, output, keep, extra, at, known
):
    """The next prompt shares any prefix with the previous prompt + output (the whole
    prompt and part of the output, as a chat template renders it back; or less): the
    delta record written from RawIds is the one written from the parsed lists."""
    following = (prompt + output)[:keep] + extra
    first = orjson.dumps(_answer(prompt, output, at))
    second = orjson.dumps(_answer(following, output[:3], at))
    messages = [{"role": "user", "content": "a"}]
    parsed_base = _record(1, messages, orjson.loads(first))
    parsed_next = _record(
        2, [*messages, {"role": "assistant", "content": "hi"}], orjson.loads(second)
    )
    base_split = split_prompt_ids(first)
    assert base_split is not None
    next_split = split_prompt_ids(second, base_split[1] if known else None)
    assert next_split is not None
    assert next_split[1].count == len(following)
    raw_base = _record(1, messages, base_split[0])
    raw_next = _record(2, parsed_next["request"]["messages"], next_split[0])
    assert _line(raw_next) == orjson.dumps(parsed_next)  # a full record: the same bytes
    want = call_delta.encode(parsed_next, parsed_base, 1)
    got = call_delta.encode(raw_next, raw_base, 1)
    assert _line(got) == orjson.dumps(want)
    # and the reader rebuilds the engine's ids from it
    resolver = call_delta.Resolver()
    resolver.accept(parsed_base)
    rebuilt = resolver.resolve(orjson.loads(_line(got)))
    assert rebuilt == parsed_next


@settings(max_examples=examples(60, 300), deadline=None)
@given(a=ids_st, b=ids_st, output=ids_st)
def test_common_prefix_counts_whole_ids(a, b, output):
    kept, rest = common_prefix(RawIds.of(a), RawIds.of(b), output)
    base = b + output
    want = next((i for i, (x, y) in enumerate(zip(a, base)) if x != y), min(len(a), len(base)))
    assert (kept, rest.to_list(), rest.count) == (want, a[want:], len(a) - want)


@pytest.mark.parametrize(
    "body",
    [b"1, 2", b"01,2", b"1,02", b"-1,2", b"1.0,2", b"1,,2", b",1", b"1,", b"1e3", b" 1"],
)
def test_a_body_not_in_canonical_form_is_parsed_whole(body):
    assert not canonical(body)
    data = b'{"id":"x","prompt_token_ids":[' + body + b'],"choices":[]}'
    assert split_prompt_ids(data) is None
    # also when only the part after a known prefix is odd
    known = RawIds(b"5,6", 2)
    assert split_prompt_ids(b'{"prompt_token_ids":[5,6,' + body + b"]}", known) is None


@pytest.mark.parametrize(
    "data",
    [
        # the key's text inside a string (escaped quotes), then the real key
        b'{"content":"\\"prompt_token_ids\\":[1]","prompt_token_ids":[2,3]}',
        # the key twice (once nested elsewhere)
        b'{"prompt_token_ids":[1],"x":{"prompt_token_ids":[2]}}',
        # the key twice on the answer: the parse keeps the last value, not the first cut
        b'{"prompt_token_ids":[1],"prompt_token_ids":[2]}',
        # the name first as a value, then the key
        b'{"x":"prompt_token_ids","prompt_token_ids":[1,2]}',
        # the name first as a key of something else than an array
        b'{"x":{"prompt_token_ids":7},"prompt_token_ids":[1,2]}',
        # nested where neither vLLM nor SGLang puts it
        b'{"usage":{"prompt_token_ids":[1,2]},"choices":[{}]}',
        # a key ending in the name
        b'{"x\\"prompt_token_ids":[1,2]}',
        # spaced JSON (Python's json.dumps)
        b'{"prompt_token_ids": [1, 2]}',
    ],
)
def test_an_answer_it_cannot_cut_exactly_is_parsed_whole(data):
    split = split_prompt_ids(data)
    if split is not None:  # only where the cut is provably the answer's own ids
        assert raw_ids.materialized(split[0]) == orjson.loads(data)
        assert split[0]["prompt_token_ids"] is split[1]
    else:
        assert orjson.loads(data)  # valid JSON, left to the whole parse


def test_the_first_case_is_cut_at_the_real_key():
    data = b'{"content":"\\"prompt_token_ids\\":[1]","prompt_token_ids":[2,3]}'
    split = split_prompt_ids(data)
    assert split is not None and split[1].to_list() == [2, 3]
    assert split[0]["content"] == '"prompt_token_ids":[1]'


def test_a_known_prefix_is_not_checked_again():
    """With the previous prompt known, only the new bytes are checked: the count comes
    from the known prefix plus the new ids."""
    known = RawIds.of(list(range(1000)))
    data = b'{"prompt_token_ids":[' + known.body + b',7,8],"choices":[{"message":{}}]}'
    split = split_prompt_ids(data, known)
    assert split is not None and split[1].count == 1002
    assert split[1].to_list() == [*range(1000), 7, 8]


def test_a_known_prefix_ends_at_a_whole_id():
    """``12,3`` is not a prefix of the ids ``12,345,6``: the count is 3, not 4."""
    split = split_prompt_ids(b'{"prompt_token_ids":[12,345,6]}', RawIds(b"12,3", 2))
    assert split is not None and split[1].count == 3
    assert split[1].to_list() == [12, 345, 6]


small_ids = st.lists(st.one_of(st.integers(0, 12), st.integers(0, 200_000)), max_size=12)


@settings(max_examples=examples(100, 500), deadline=None)
@given(
    prompt=small_ids,
    output=small_ids,
    keep=st.integers(0, 12),
    change=st.one_of(st.none(), st.tuples(st.integers(0, 11), st.integers(0, 200_000))),
    extra=small_ids,
)
def test_the_output_ids_are_matched_as_the_id_by_id_loop_matches_them(
    prompt, output, keep, change, extra
):
    """``_output_kept`` (one byte comparison and a binary search) counts the same output
    ids, ending at the same byte, as comparing them one by one: on a prompt that renders
    back any part of the output, with one id changed (a shorter or longer spelling) or not."""
    rendered = output[:keep]
    if change is not None and rendered:
        rendered[change[0] % len(rendered)] = change[1]
    a = RawIds.of(prompt + rendered + extra).body
    at = len(RawIds.of(prompt).body)
    lead = bool(prompt)
    got = raw_ids._output_kept(a, at, lead, output)
    assert got == raw_ids._output_kept_each(a, at, lead, output)
    assert got[0] == next(
        (i for i, (x, y) in enumerate(zip(rendered + extra, output)) if x != y),
        min(len(rendered + extra), len(output)),
    )


def test_an_output_not_all_ints_is_matched_id_by_id():
    """Ids that are not non-negative ints (never from a real engine) go the slow way and
    count as they always did."""
    a = RawIds.of([1, 2, 3]).body
    for output in ([2, "x"], [2, -3], [2, 2**70], [2.0]):
        assert raw_ids._output_kept(a, 1, True, output) == raw_ids._output_kept_each(
            a, 1, True, output
        )


def test_the_checked_prefix_hint_is_used_once_and_never_chains():
    """Ids cut out after a known prefix remember it (``base``) for the delta's common
    prefix, which then needs no second comparison; the hint goes once used, and an
    earlier prompt is never kept alive by a chain of them."""
    first = split_prompt_ids(b'{"prompt_token_ids":[1,2],"choices":[]}')
    assert first is not None and first[1].base is None
    second = split_prompt_ids(b'{"prompt_token_ids":[1,2,3],"choices":[]}', first[1])
    assert second is not None and second[1].base is first[1]
    third = split_prompt_ids(b'{"prompt_token_ids":[1,2,3,4],"choices":[]}', second[1])
    assert third is not None and third[1].base is second[1] and second[1].base is None
    kept, rest = common_prefix(third[1], second[1], [4])
    assert (kept, rest.count, third[1].base) == (4, 0, None)
    # not a prefix: no hint
    other = split_prompt_ids(b'{"prompt_token_ids":[1,2,5],"choices":[]}', RawIds(b"1,2,3", 3))
    assert other is not None and other[1].base is None
    short = split_prompt_ids(b'{"prompt_token_ids":[1,23],"choices":[]}', RawIds(b"1,2", 2))
    assert short is not None and short[1].base is None and short[1].count == 2


def test_the_cut_ids_are_a_view_of_the_answer_and_read_as_bytes():
    """The prompt ids cut out of an answer are a view of its bytes (no 200 KB copy at
    40,000 ids), and every reader of RawIds gives what it gives on bytes."""
    data = (
        b'{"choices":[{"message":{"content":"x"},"token_ids":[7,8]}],"prompt_token_ids":[1,22,333]}'
    )
    split = split_prompt_ids(data)
    assert split is not None
    parsed, ids, _ = split
    assert isinstance(ids.body, memoryview) and ids.body.obj is data
    assert ids.to_list() == [1, 22, 333] and len(ids) == 3
    assert orjson.dumps(parsed, default=raw_ids.default) == orjson.dumps(orjson.loads(data))
    assert ids.plus([4]).to_list() == [1, 22, 333, 4]
    # the next answer is cut against the view, and its delta taken from it
    after = b'{"choices":[{"message":{"content":"y"}}],"prompt_token_ids":[1,22,333,7,8,9]}'
    split = split_prompt_ids(after, ids)
    assert split is not None and split[1].base is ids
    kept, rest = common_prefix(split[1], ids, [7, 8])
    assert kept == 5 and rest.to_list() == [9] and isinstance(rest.body, bytes)
    # a prompt that does not extend the view: compared on lists, as on bytes
    other = RawIds(memoryview(b"1,22,4"), 3)
    assert common_prefix(other, ids, [7])[0] == 2
