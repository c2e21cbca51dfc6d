"""The gateway's per-call shortcuts (issue 26, item 4: CPU per call) give what the work
they skip gives: the summary-prompt search remembered for the same text only, the Host
check remembered per value (and bounded)."""

from __future__ import annotations

import orjson
import pytest

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
