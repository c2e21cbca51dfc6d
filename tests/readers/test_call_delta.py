"""Delta call records (pipeline/readers/call_delta.py): a record rebuilt from its delta and
its base equals the record, whatever the two share; the common prefix is the longest."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.readers.call_delta import MissingBase, Resolver, _common_prefix, decode, encode
from tests.examples import examples

small = st.lists(st.integers(0, 3), max_size=30)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant"]), "content": st.text("ab", max_size=3)}
    ),
    max_size=8,
)


def _naive_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(small, small, st.none() | st.integers(0, 40))
def test_the_common_prefix_is_the_longest(a, b, guess):
    assert _common_prefix(a, b, guess) == _naive_prefix(a, b)


def _record(msgs, prompt, output, where, tools, call):
    response: dict = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
    if output is not None:
        response["choices"][0]["token_ids"] = output
    if prompt is not None:
        if where == "response":
            response["prompt_token_ids"] = prompt
        else:
            response["choices"][0]["prompt_token_ids"] = prompt
    request = {"model": "m", "messages": msgs}
    if tools is not None:
        request["tools"] = tools
    return {
        "session_id": "s",
        "request": request,
        "response": response,
        "seam": {"call": call},
    }


record = st.builds(
    _record,
    messages,
    st.none() | small,
    st.none() | small,
    st.sampled_from(["response", "choice"]),
    st.none() | st.sampled_from([[], ["t"]]),
    st.just(0),
)


@settings(max_examples=examples(60, 200))
@given(record, record, messages, small)
def test_a_delta_decodes_to_its_record(base, current, extra, extra_ids):
    base["seam"]["call"], current["seam"]["call"] = 1, 2
    # Often the current call extends its base, as an agent's next call does.
    from pipeline.readers.call_delta import base_ids, base_messages

    extended = _record(
        base_messages(base) + extra,
        base_ids(base) + extra_ids,
        [5],
        "response",
        base["request"].get("tools"),
        2,
    )
    for rec in (current, extended):
        stored = encode(rec, base, 1)
        assert (decode(stored, base) if stored is not rec else rec) == rec


def test_a_delta_whose_base_was_not_read_says_so():
    base = _record([{"role": "user", "content": "a"}], [1, 2], [3], "response", None, 1)
    nxt = _record(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "ok"}],
        [1, 2, 3, 4],
        [5],
        "response",
        None,
        2,
    )
    stored = encode(nxt, base, 1)
    assert stored["request_delta"]["keep_messages"] == 2
    assert stored["prompt_ids_delta"] == {"at": "response", "keep": 3, "ids": [4]}
    resolver = Resolver()
    try:
        resolver.resolve(stored)
    except MissingBase as exc:
        assert "call 2 is stored as a change to call 1, which was not read" in str(exc)
    else:
        raise AssertionError("a delta without its base was resolved")
    resolver.accept(base)
    assert resolver.resolve(stored) == nxt
