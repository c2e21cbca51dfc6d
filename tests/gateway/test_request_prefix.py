"""A session's requests parsed from the previous one's bytes (pipeline/gateway/
request_prefix.py) are exactly ``orjson.loads`` of them, byte for byte once dumped,
whatever the layout, and the history is not parsed again when the bytes continue."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.gateway import request_prefix
from pipeline.gateway.request_prefix import RequestParser
from tests.examples import examples

text = st.lists(
    st.sampled_from(list('ab "\\]}[{,:\n\té日') + ['"messages": [', "]}"]), max_size=8
).map("".join)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": text},
    optional={"tool_calls": st.lists(st.fixed_dictionaries({"id": text}), max_size=2)},
)
# How a harness writes its body: Python's json (spaces, \u escapes), compact orjson, or
# indented (whose items do not continue each other's bytes).
DUMPS = {
    "json": lambda b: json.dumps(b).encode(),
    "json-utf8": lambda b: json.dumps(b, ensure_ascii=False).encode(),
    "orjson": orjson.dumps,
    "indent": lambda b: orjson.dumps(b, option=orjson.OPT_INDENT_2),
}


def _check(parser: RequestParser, raw: bytes, key: str = "messages") -> None:
    try:
        want = orjson.loads(raw)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            parser.parse(raw, key)
        return
    got = parser.parse(raw, key)
    assert got == want
    assert orjson.dumps(got) == orjson.dumps(want)


@settings(max_examples=examples(60, 400), deadline=None)
@given(
    first=st.lists(message, min_size=1, max_size=4),
    steps=st.lists(
        st.tuples(st.lists(message, min_size=0, max_size=3), st.integers(0, 9)), max_size=6
    ),
    layout=st.sampled_from(["first", "last", "middle"]),
    dumps=st.sampled_from(sorted(DUMPS)),
)
def test_a_session_of_requests_parses_as_orjson_does(first, steps, layout, dumps):
    """An agent's requests: each the previous history plus new messages (sometimes a
    rewritten history: a compaction), with the history first, last or between the other
    members, in four serializations."""
    parser = RequestParser(min_bytes=0)
    history = list(first)
    for new, rewrite in [([], 1), *steps]:
        if rewrite == 0:  # a compaction: the history starts again
            history = history[-1:]
        history = history + new
        other = {"model": "m", "tools": [{"name": "t", "messages": ["x"]}], "n": 1.5}
        if layout == "first":
            body = {"messages": history, **other}
        elif layout == "last":
            body = {**other, "messages": history}
        else:
            body = {"model": "m", "messages": history, "tools": other["tools"]}
        _check(parser, DUMPS[dumps](body))


@pytest.mark.parametrize("ascii_only", [True, False])
def test_the_history_is_not_parsed_again_when_the_bytes_continue(ascii_only):
    parser = RequestParser(min_bytes=0)
    history = [{"role": "user", "content": "task: é 日本"}]
    previous: list = []
    for i in range(6):
        raw = json.dumps({"messages": history, "model": "m"}, ensure_ascii=ascii_only).encode()
        got = parser.parse(raw, "messages")
        assert got == orjson.loads(raw)
        if i:  # the items it already had are the previous request's objects
            assert got["messages"][0] is previous[0]
        previous = got["messages"]
        history = history + [{"role": "assistant", "content": f"a{i}"}]
    assert parser.hits == 5


@pytest.mark.parametrize(
    "second",
    [
        # a later member with the history's name replaces it (orjson keeps the last)
        b'{"model": "m", "messages": [{"a": 1}, {"b": 2}], "messages": [{"b": 2}]}',
        b'{"model": "m", "messages": [{"a": 1}, {"b": 2}], "messages": null}',
        # an earlier one is replaced by it
        b'{"model": "m", "messages": [{"a": 1}, {"b": 2}], "model": "n"}',
        # a trailing comma, an unclosed array, garbage after the object
        b'{"model": "m", "messages": [{"a": 1}, ]}',
        b'{"model": "m", "messages": [{"a": 1}, {"b": 2}',
        b'{"model": "m", "messages": [{"a": 1}, {"b": 2}]} x',
        # new items that hold the array's closing bytes inside strings
        b'{"model": "m", "messages": [{"a": 1}, {"b": "]}, \\"messages\\": ["}]}',
        # the first item continued inside the old bytes' last item is not a continuation
        b'{"model": "m", "messages": [{"a": 1}], "x": [1, 2]}',
    ],
)
def test_odd_next_requests_parse_as_orjson_does(second):
    parser = RequestParser(min_bytes=0)
    _check(parser, b'{"model": "m", "messages": [{"a": 1}]}')
    assert parser.raw is not None  # it found the array to continue from
    _check(parser, second)


def test_a_harness_whose_bytes_never_continue_searches_less_and_less():
    """A cache marker moved on every call: every request misses; the history array is
    searched for (a second parse of the history) on fewer and fewer of them."""
    searches = 0

    class Counting(RequestParser):
        def _find(self, *args):
            nonlocal searches
            searches += 1
            return super()._find(*args)

    parser = Counting(min_bytes=0)
    history: list[dict] = []
    for i in range(100):
        history = [{**m, "mark": False} for m in history] + [{"content": i, "mark": True}]
        _check(parser, json.dumps({"messages": history}).encode())
    assert parser.hits == 0
    assert searches <= 10


def test_the_sentinel_is_a_string_no_request_holds():
    assert orjson.dumps(request_prefix.NONCE) == request_prefix.SENTINEL
    assert len(request_prefix.NONCE) > 40


def test_an_item_continued_across_the_old_end_is_not_a_continuation():
    """A history of numbers: ``[1, 2`` then ``[1, 234, 5]`` starts with the old bytes but
    its second item is another one (only a comma right after them continues the array)."""
    parser = RequestParser(min_bytes=0)
    _check(parser, b'{"messages": [1, 2]}')
    assert parser.raw is not None
    _check(parser, b'{"messages": [1, 234, 5]}')
    assert parser.hits == 0


def test_a_small_request_is_parsed_whole():
    """Under MIN_BYTES one parse is cheaper than the shortcut's three."""
    parser = RequestParser()
    history = [{"role": "user", "content": "x" * 100}]
    for _ in range(4):
        _check(parser, json.dumps({"messages": history}).encode())
        history = history + [{"role": "assistant", "content": "y" * 100}]
    assert parser.hits == 0 and parser.raw is None
    history = [{"role": "user", "content": "x" * request_prefix.MIN_BYTES}]
    for _ in range(3):
        _check(parser, json.dumps({"messages": history}).encode())
        history = history + [{"role": "assistant", "content": "y"}]
    assert parser.hits == 2
