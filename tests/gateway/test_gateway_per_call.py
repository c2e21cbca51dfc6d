"""The gateway's per-call shortcuts (issue 26, item 4: CPU per call) give what the work
they skip gives: the summary-prompt search remembered for the same text only, the Host
check remembered per value (and bounded)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("aiohttp")

from pipeline.gateway.recorder import Recorder
from pipeline.gateway.server import Gateway, GatewayConfig, Session


@pytest.fixture
def gateway(tmp_path):
    recorder = Recorder(tmp_path / "out", {"upstream": "test"})
    yield Gateway(GatewayConfig(upstream="http://127.0.0.1:9/v1"), recorder)
    recorder.close()


def _body(*users: str) -> dict:
    messages: list[dict] = [{"role": "system", "content": "s"}]
    for text in users:
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "a"}]
    return {"model": "m", "messages": messages[:-1]}


def test_the_summary_search_is_remembered_for_the_same_text_only(gateway):
    searched: list[str] = []
    real = gateway.summary_re

    class Counting:
        def search(self, text):
            searched.append(text)
            return real.search(text)

    gateway.summary_re = Counting()
    gateway.summary_starts = None  # every text searched (the shortcut has its own test)
    session = Session("r", "t")
    prompt = "Now create a detailed summary of the conversation so far."
    verdicts = [
        gateway._is_summary_request(_body(*users), session)
        for users in (["fix it"], ["fix it"], ["fix it", prompt], ["fix it", prompt], ["go on"])
    ]
    assert verdicts == [False, False, True, True, False]
    assert searched == ["fix it", prompt, "go on"]  # a repeated last user message: no search
    # Another session's memo is its own
    assert gateway._is_summary_request(_body(prompt), Session("r2", "t")) is True


def test_the_host_check_is_remembered_per_value_and_bounded(gateway):
    assert gateway._host_allowed("127.0.0.1:8788") is True
    assert gateway._host_allowed("evil.example") is False
    assert gateway._host_allowed("evil.example") is False
    assert gateway._host_allowed(None) is False
    for i in range(200):
        assert gateway._host_allowed(f"h{i}.example") is False
        assert len(gateway._hosts_seen) <= 64
    assert gateway._host_allowed("localhost:1") is True


def test_a_failed_summary_rewrite_does_not_fail_the_call(tmp_path, capfd):
    """gateway.json is rewritten by a thread the call does not wait for: a failure there
    (a full disk) is said on stderr, and the call, already written, is not failed."""
    import asyncio

    recorder = Recorder(tmp_path / "out", {"upstream": "test"})

    def failing() -> None:
        raise OSError(28, "No space left on device")

    recorder.write_manifest = failing  # type: ignore[method-assign]
    record = {"session_id": "r", "task_id": "t", "request": {}, "response": {}, "seam": {}}

    async def calls() -> None:
        for _ in range(2):
            await recorder.record_call("r", record, False)
        await recorder.drain()

    asyncio.run(calls())
    assert len((tmp_path / "out" / "calls" / "r.jsonl").read_bytes().splitlines()) == 2
    assert "gateway.json not updated" in capfd.readouterr().err
    del recorder.write_manifest
    recorder.close()


def test_the_depth_check_walks_only_what_changed(monkeypatch):
    """A re-sent history and re-sent members equal to the last checked request's are not
    walked again; a member that changed is, and fails the check when too deep."""
    from pipeline.gateway import server
    from pipeline.sources.limits import DepthError

    walked: list[dict] = []
    real = server.check_depth

    def watching(obj, raw=None):
        walked.append(obj)
        return real(obj, raw)

    monkeypatch.setattr(server, "check_depth", watching)
    session = Session("r", "t")
    tools = [{"type": "function", "function": {"parameters": {"a": {"b": [1]}}}}]
    history = [{"role": "user", "content": "go"}]
    body = {"model": "m", "messages": history, "tools": tools}
    server._check_depth(body, orjson.dumps(body), session)
    history = [*history, {"role": "assistant", "content": "ok"}]
    same = {"model": "m", "messages": history, "tools": [dict(t) for t in tools]}
    server._check_depth(same, orjson.dumps(same), session)
    assert walked[-1] == {"messages": history[1:]}  # tools and model: equal, not walked
    deep: dict = {}
    for _ in range(150):
        deep = {"x": deep}
    changed = {"model": "m", "messages": [*history, {"role": "user", "content": "x"}]}
    changed["tools"] = [{"type": "function", "function": {"parameters": deep}}]
    with pytest.raises(DepthError):
        server._check_depth(changed, orjson.dumps(changed), session)


class _Protocol:
    _reading_paused = False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


def _request(chunks: list[bytes], eof: bool = True, max_size: int = 1024):
    import asyncio
    from unittest import mock

    from aiohttp.streams import StreamReader
    from aiohttp.test_utils import make_mocked_request

    payload = StreamReader(_Protocol(), 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    for chunk in chunks:
        payload.feed_data(chunk)
    if eof:
        payload.feed_eof()
    transport = mock.Mock(is_closing=lambda: False)
    return make_mocked_request(
        "POST",
        "/v1/chat/completions",
        payload=payload,
        transport=transport,
        client_max_size=max_size,
    )


@pytest.mark.parametrize("chunks", [[], [b'{"a": 1}'], [b'{"a"', b": ", b"[1, 2]}"]])
def test_a_body_received_whole_is_its_chunks_joined(chunks):
    """The body at hand is taken as it came (one chunk: that very object, no copy), equal
    to what ``request.read()`` gives, and the size cap still holds."""
    import asyncio

    from pipeline.gateway.server import _read_body

    async def both() -> tuple[bytes | None, bytes]:
        fast = await _read_body(_request(chunks), 5.0)
        return fast, await _request(chunks).read()

    fast, slow = asyncio.run(both())
    assert fast == slow == b"".join(chunks) and type(fast) is bytes
    if len(chunks) == 1:
        assert fast is chunks[0]


def test_a_body_over_the_cap_is_refused_whole_or_arriving():
    import asyncio

    from aiohttp import web

    from pipeline.gateway.server import _read_body

    async def read(eof: bool) -> None:
        request = _request([b"x" * 600, b"y" * 600], eof=eof)
        if not eof:
            asyncio.get_running_loop().call_later(0.01, request.content.feed_eof)
        await _read_body(request, 5.0)

    for eof in (True, False):
        with pytest.raises(web.HTTPRequestEntityTooLarge):
            asyncio.run(read(eof))

    # At the cap exactly: taken
    async def at_cap() -> bytes | None:
        return await _read_body(_request([b"x" * 1024]), 5.0)

    assert asyncio.run(at_cap()) == b"x" * 1024


_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": _VALUE}
)
# One step of a session: how the next request's history is made from the previous one.
_STEP = st.tuples(
    st.sampled_from(["extend", "extend", "extend", "rewrite", "same", "cut"]),
    st.lists(_MESSAGE, max_size=3),
    st.dictionaries(st.sampled_from(["model", "tools", "temperature", "user"]), _VALUE),
    st.sampled_from([{}, {"logprobs": True, "return_token_ids": True}, {"stream": True}]),
)


@settings(max_examples=200, deadline=None)
@given(first=st.lists(_MESSAGE, min_size=1, max_size=4), steps=st.lists(_STEP, max_size=8))
def test_the_payload_is_the_serialized_request_byte_for_byte(first, steps):
    """The upstream payload made from the history sent before (``_payload``) is the
    bytes of ``orjson.dumps`` of the whole body, over sessions that extend, rewrite,
    re-send or cut their history and change their other members."""
    from pipeline.gateway.request_prefix import RequestParser
    from pipeline.gateway.server import _payload

    session = Session("r", "t", parser=RequestParser(min_bytes=0))
    history = list(first)
    for how, new, members, extra in steps:
        if how == "extend":
            history = [*history, *new]
        elif how == "rewrite":
            history = [*new, *history[1:]]
        elif how == "cut":
            history = history[: len(history) // 2]
        raw = orjson.dumps({**members, "messages": history})
        body = session.parser.parse(raw, "messages")
        assert b"".join(_payload(body, extra, session)) == orjson.dumps({**body, **extra})


def test_the_payload_reuses_the_history_sent_before():
    """An agent's session: from the second call on, only the new messages are serialized
    (counted by a watching ``orjson.dumps``), and the bytes are still the whole body's."""
    from pipeline.gateway import server
    from pipeline.gateway.request_prefix import RequestParser

    session = Session("r", "t", parser=RequestParser(min_bytes=0))
    history: list = [{"role": "system", "content": "s" * 100}]
    sizes: list[int] = []
    real = orjson.dumps

    def watching(value, *args, **kwargs):
        out = real(value, *args, **kwargs)
        sizes.append(len(out))
        return out

    for i in range(6):
        history = [*history, {"role": "user", "content": f"u{i} " * 50}]
        raw = real({"model": "m", "messages": history, "tools": [{"t": i % 2}]})
        body = session.parser.parse(raw, "messages")
        sizes.clear()
        server.orjson.dumps = watching  # type: ignore[attr-defined]
        try:
            payload = server._payload(body, {"logprobs": True}, session)
        finally:
            server.orjson.dumps = real  # type: ignore[attr-defined]
        assert b"".join(payload) == real({**body, "logprobs": True})
        if i:
            assert max(sizes) < 400, sizes  # never the whole history again


def test_kept_history_bytes_serve_only_the_list_they_were_made_from():
    """The kept bytes are used for a history that continues the very list they were made
    from (``parser.prior``), and none are kept for a history the parser does not follow
    (a translated dialect's)."""
    from pipeline.gateway.request_prefix import RequestParser
    from pipeline.gateway.server import _payload

    session = Session("r", "t", parser=RequestParser(min_bytes=0))
    history = [{"role": "user", "content": "a"}]
    body = session.parser.parse(orjson.dumps({"messages": history}), "messages")
    _payload(body, {}, session)
    assert session.sent is not None and session.sent[0] is body["messages"]
    session.sent = ([{"role": "user", "content": "other"}], [b'{"stale":1}'])
    history = [*history, {"role": "assistant", "content": "b"}]
    body = session.parser.parse(orjson.dumps({"messages": history}), "messages")
    assert session.parser.prior is not None  # continued, but not the list kept
    assert b"".join(_payload(body, {}, session)) == orjson.dumps(body)
    translated = {"messages": [dict(m) for m in body["messages"]]}
    assert b"".join(_payload(translated, {}, session)) == orjson.dumps(translated)
    assert session.sent is None


_PIECES = st.sampled_from(
    [
        "create a detailed summary of the conversation",
        "Context Checkpoint Compaction",
        "context-aware state summary",
        "summarize the conversation so far",
        "Summarise The Conversation Above",
        "summari",
        "compact",
        "ſummary",  # U+017F: case-equivalent to "s"
        "ſummarize the conversation so far",
        "chec\u212apoint",  # U+212A KELVIN SIGN: case-equivalent to "k"
        "K",
        " ",
        "x",
        "\u00e9",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.tuples(_PIECES, st.sampled_from(["same", "upper", "lower", "swap"]))),
    patterns=st.sampled_from(
        [
            None,
            ("summari[sz]e", r"check\s*point"),
            ("abc|compact",),
            ("ſummary",),
            ("CONTEXT CHECKPOINT", "summ?ary"),
        ]
    ),
)
def test_the_summary_search_shortcut_finds_what_the_regex_finds(tmp_path_factory, pieces, patterns):
    """ASCII text in which no prompt's leading text occurs is not searched; the verdict is
    the regex's on every text (mixed case, non-ASCII look-alikes, prompts that have no
    leading text to look for)."""
    cased = {"same": str, "upper": str.upper, "lower": str.lower, "swap": str.swapcase}
    text = "".join(cased[how](piece) for piece, how in pieces)
    config = GatewayConfig(upstream="http://127.0.0.1:9/v1")
    if patterns is not None:
        config.summary_prompts = patterns
    recorder = Recorder(tmp_path_factory.mktemp("out"), {"upstream": "test"})
    try:
        gateway = Gateway(config, recorder)
        body = {"messages": [{"role": "user", "content": text}]}
        expected = bool(gateway.summary_re.search(text))
        assert gateway._is_summary_request(body, Session("r", "t")) is expected
    finally:
        recorder.close()
