"""The gateway under a faulty fleet (issue 26's attack list, the parts fixed so far): a
400 about one prompt does not switch token ids off for everyone, a cut last line does
not swallow the next answered call, ids are matched whole, and a rollout gets one
finite reward."""

from __future__ import annotations

import json
import os
import time

import orjson
import pytest
import requests

from pipeline.gateway import recorder
from pipeline.gateway.recorder import LogFiles, _append_line, check_id
from tests.gateway.builds import calls_of

openai = pytest.importorskip("openai")


def test_a_400_about_one_prompt_keeps_token_ids_on_for_the_fleet(tiny_model_dir, start_gateway):
    """vLLM answers 400 to a prompt over its context length. That used to turn token-id
    recording off for every session until a restart."""
    from tests.gateway.model_server import ModelServer

    server = ModelServer(str(tiny_model_dir), max_prompt_tokens=40).start()
    try:
        gw = start_gateway(server.url)
        long_one = openai.OpenAI(base_url=gw.base("t", "long") + "/v1", api_key="none")
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            long_one.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "word " * 200}]
            )
        short = openai.OpenAI(base_url=gw.base("t", "short") + "/v1", api_key="none")
        short.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert gw.recorder.manifest["calls_with_token_ids"] == 1
        assert "token_id_params" not in gw.recorder.manifest
        (record,) = calls_of(gw.out / "calls" / "short.jsonl")
        assert record["response"]["choices"][0]["token_ids"]
    finally:
        server.stop()


def test_a_cut_last_line_does_not_swallow_the_next_call(tmp_path):
    log = tmp_path / "s.jsonl"
    _append_line(log, {"call": 1})
    with open(log, "ab") as fh:  # what a kill or a full disk mid-write leaves
        fh.write(b'{"call": 2, "respo')
    _append_line(log, {"call": 3})
    lines = log.read_bytes().splitlines()
    assert lines[0] == b'{"call":1}' and lines[1] == b'{"call": 2, "respo'
    assert orjson.loads(lines[2]) == {"call": 3}


def test_kept_open_logs_repair_a_cut_tail_after_a_failed_write(tmp_path, monkeypatch):
    """LogFiles keeps each log open between lines: a file is checked for a cut last line
    when opened, and a write that fails (a full disk after half the line) closes its
    descriptor, so the next line opens the file again and is not glued to the fragment."""
    files = LogFiles(cap=8)
    log = tmp_path / "s.jsonl"
    assert files.append(log, b'{"call":1}\n') is True  # new: its directory needs an fsync
    real_write = os.write

    def half_then_full(fd, data):
        monkeypatch.setattr(recorder.os, "write", real_write)
        real_write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(recorder.os, "write", half_then_full)
    with pytest.raises(OSError):
        files.append(log, b'{"call":2,"response":1}\n')
    assert files.append(log, b'{"call":3}\n') is False
    files.close()
    lines = log.read_bytes().splitlines()
    assert lines == [b'{"call":1}', b'{"call":2,"r', b'{"call":3}']


def test_kept_open_logs_are_capped(tmp_path):
    """At most ``cap`` logs stay open; the least recently written is closed first."""
    files = LogFiles(cap=2)
    paths = [tmp_path / f"s{i}.jsonl" for i in range(3)]
    for path in (*paths, paths[1], paths[0]):
        files.append(path, b"{}\n")
    assert list(files._fds) == [paths[1], paths[0]]
    fds = list(files._fds.values())
    files.close()
    assert files._fds == {}
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    assert [p.read_bytes() for p in paths] == [b"{}\n{}\n", b"{}\n{}\n", b"{}\n"]


@pytest.mark.parametrize("value", ["abc\n", "abc\n\n", "\nabc", "a/b", "..", "a..b", ""])
def test_ids_are_matched_whole(value):
    with pytest.raises(ValueError):
        check_id(value, "rollout id")


def test_a_known_session_is_found_only_under_its_own_ids():
    """``Gateway._session``'s shortcut for a session it knows (no pattern checks) takes
    only the ids that session was made with; another task id, or a rollout id that is not
    a known key, goes the whole way (its checks and their errors)."""
    from aiohttp.test_utils import make_mocked_request

    from pipeline.gateway.server import Gateway, GatewayConfig

    gateway = Gateway(GatewayConfig(upstream="http://127.0.0.1:9/v1"), recorder=None)

    def session(task: str | None, rollout: str | None, headers: dict | None = None):
        info = {"task_id": task, "rollout_id": rollout} if rollout else {}
        request = make_mocked_request("POST", "/x", headers=headers or {}, match_info=info)
        return gateway._session(request)

    first = session("t", "r1")
    assert session("t", "r1") is first
    assert session(None, None, {"X-Seam-Task-Id": "t", "X-Seam-Rollout-Id": "r1"}) is first
    with pytest.raises(ValueError, match="belongs to task t"):
        session("u", "r1")
    with pytest.raises(ValueError, match="belongs to task t"):
        session(None, "r1")  # no task id: the rollout id is its task, not t
    with pytest.raises(ValueError, match="must be 1-200"):
        session("t\n", "r1")
    with pytest.raises(ValueError, match="must be 1-200"):
        session("t", "r1\n")
    alone = session(None, "r2")
    assert alone.task_id == "r2" and session(None, "r2") is alone
    assert session("r2", "r2") is alone


def test_an_id_with_an_encoded_newline_names_no_file(model_server, start_gateway):
    gw = start_gateway(model_server.url)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    answer = requests.post(gw.url + "/s/t/abc%0A/v1/chat/completions", json=body)
    assert answer.status_code == 400
    assert list((gw.out / "calls").iterdir()) == []


def test_a_rollout_gets_one_finite_reward(model_server, start_gateway):
    gw = start_gateway(model_server.url)
    url = gw.base("t", "r1") + "/reward"
    for bad in ("NaN", "Infinity", "1e999"):
        answer = requests.post(
            url, data=f'{{"reward": {bad}}}', headers={"Content-Type": "application/json"}
        )
        assert answer.status_code == 400 and "finite" in answer.json()["error"]["message"]
    assert requests.post(url, json={"reward": 1.0}).status_code == 200
    assert requests.post(url, json={"reward": 1.0}).status_code == 200  # a retry: same outcome
    second = requests.post(url, json={"reward": 0.0})
    assert (
        second.status_code == 409 and "already has an outcome" in second.json()["error"]["message"]
    )
    rows = [json.loads(x) for x in (gw.out / "rewards.jsonl").read_text().splitlines()]
    assert rows == [{"rollout_id": "r1", "reward": 1.0, "task_id": "t"}]


def test_a_restarted_gateway_knows_the_earlier_rewards(tmp_path, model_server, start_gateway):
    first = start_gateway(model_server.url, name="c")
    assert requests.post(first.base("t", "r1") + "/reward", json={"reward": 1.0}).status_code == 200
    first.stop()
    second = start_gateway(model_server.url, name="c")
    again = requests.post(second.base("t", "r1") + "/reward", json={"reward": 0.5})
    assert again.status_code == 409


class _OddEngine:
    """An engine stand-in on 127.0.0.1 that answers every call with ``answer``."""

    def __init__(self, answer):
        from aiohttp import web

        from tests.gateway.serving import ThreadedApp

        async def handle(request):
            return web.json_response(self.answer)

        self.answer = answer
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        self.served = ThreadedApp(app)
        self.url = self.served.url + "/v1"


ODD_ANSWERS = {
    "a number for a choice": {"choices": [1]},
    "no message": {"choices": [{"index": 0}]},
    "content not text": {"choices": [{"message": {"role": "assistant", "content": {"a": 1}}}]},
    "arguments not text": {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"x": 1}}}],
                }
            }
        ]
    },
    "a tool call not an object": {
        "choices": [{"message": {"role": "assistant", "content": "", "tool_calls": ["x"]}}]
    },
}


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize("case", sorted(ODD_ANSWERS))
def test_an_odd_engine_answer_is_a_502_with_nothing_written(case, dialect, start_gateway):
    engine = _OddEngine(ODD_ANSWERS[case])
    try:
        gw = start_gateway(engine.url, token_ids="off")
        if dialect == "openai":
            url = gw.base("t", "odd") + "/v1/chat/completions"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        else:
            url = gw.base("t", "odd") + "/v1/messages"
            body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        answer = requests.post(url, json=body)
        assert answer.status_code == 502, answer.text
        assert "Traceback" not in answer.text
        assert not (gw.out / "calls" / "odd.jsonl").exists()
    finally:
        engine.served.stop()


def test_a_request_nested_a_thousand_deep_is_a_400(model_server, start_gateway):
    gw = start_gateway(model_server.url)
    deep = "[" * 1000 + "]" * 1000
    raw = '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "x": ' + deep + "}"
    answer = requests.post(
        gw.base("t", "deep") + "/v1/chat/completions",
        data=raw,
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400 and "max_depth" in answer.json()["error"]["message"]


def test_models_with_the_engine_down_is_a_502(start_gateway):
    gw = start_gateway("http://127.0.0.1:9/v1")  # nothing listens on the discard port
    answer = requests.get(gw.base("t", "r") + "/v1/models")
    assert answer.status_code == 502 and "upstream failed" in answer.json()["error"]["message"]


def test_a_cross_site_text_plain_post_records_nothing(model_server, start_gateway):
    """A page elsewhere may POST text/plain without a preflight: it used to record a
    reward for any rollout and forward chat calls with the gateway's key."""
    gw = start_gateway(model_server.url)
    foreign = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    reward = requests.post(gw.base("t", "r") + "/reward", data='{"reward": 1}', headers=foreign)
    chat = requests.post(
        gw.base("t", "r") + "/v1/chat/completions",
        data='{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}',
        headers={"Content-Type": "text/plain"},
    )
    assert reward.status_code == 403 and chat.status_code == 415
    assert not (gw.out / "rewards.jsonl").exists() and not list((gw.out / "calls").iterdir())


@pytest.mark.parametrize(
    "headers",
    [{"Host": "evil.example"}, {"Origin": "http://evil.example"}, {"Origin": "null"}],
    ids=["rebound host", "foreign origin", "null origin"],
)
def test_browser_requests_from_elsewhere_are_refused(headers, model_server, start_gateway):
    gw = start_gateway(model_server.url)
    answer = requests.post(gw.base("t", "r") + "/reward", json={"reward": 1}, headers=headers)
    assert answer.status_code == 403
    assert "--allow-host" in answer.json()["error"]["message"]


def test_names_given_with_allow_host_and_wildcard_listening(model_server, start_gateway):
    named = start_gateway(model_server.url, name="named", allow_hosts=("gw.fleet.internal",))
    ok = requests.post(
        named.base("t", "r") + "/reward",
        json={"reward": 1},
        headers={"Host": "gw.fleet.internal:80"},
    )
    assert ok.status_code == 200
    anywhere = start_gateway(model_server.url, name="wild", listen_host="0.0.0.0")
    ok = requests.post(
        anywhere.base("t", "r") + "/reward", json={"reward": 1}, headers={"Host": "10.0.0.7:8788"}
    )
    assert ok.status_code == 200


class _SlowEngine:
    """Answers after ``delay`` seconds and counts the calls in flight at once."""

    def __init__(self, delay: float, size: int = 0):
        import asyncio

        from aiohttp import web

        from tests.gateway.serving import ThreadedApp

        self.in_flight = self.most = 0

        async def handle(request):
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            await asyncio.sleep(delay)
            self.in_flight -= 1
            message = {"role": "assistant", "content": "x" * size or "ok"}
            return web.json_response({"choices": [{"index": 0, "message": message}]})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        self.served = ThreadedApp(app)
        self.url = self.served.url + "/v1"


def _concurrent_calls(gw, n: int) -> list[int]:
    import asyncio

    import aiohttp

    async def main():
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as client:

            async def one(i):
                body = {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]}
                url = gw.base("t", f"s{i}") + "/v1/chat/completions"
                async with client.post(url, json=body) as resp:
                    await resp.read()
                    return resp.status

            return await asyncio.gather(*(one(i) for i in range(n)))

    return asyncio.run(main())


def test_no_cap_on_connections_to_the_engine(start_gateway):
    """aiohttp's default connector holds 100 connections: the 101st session waited."""
    engine = _SlowEngine(delay=1.0)
    try:
        gw = start_gateway(engine.url, token_ids="off")
        assert _concurrent_calls(gw, 130) == [200] * 130
        assert engine.most > 100
    finally:
        engine.served.stop()


def test_an_answer_over_the_size_cap_is_a_502_with_nothing_written(start_gateway):
    engine = _SlowEngine(delay=0, size=300_000)
    try:
        gw = start_gateway(engine.url, token_ids="off", max_response_bytes=100_000)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        answer = requests.post(gw.base("t", "big") + "/v1/chat/completions", json=body)
        assert answer.status_code == 502 and "over 100,000" in answer.json()["error"]["message"]
        assert not (gw.out / "calls" / "big.jsonl").exists()
    finally:
        engine.served.stop()


class _ClosingEngine:
    """A raw HTTP/1.1 engine that closes every connection shortly after one answer
    without a ``Connection: close`` header (as some engines behind proxies do): the
    gateway has sent the next call on it by then."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        body = json.dumps(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        )
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, rest = data.split(b"\r\n\r\n", 1)
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                while len(rest) < length:
                    rest += conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
                )
                time.sleep(0.05)  # the client reuses the connection meanwhile


def test_an_engine_that_drops_kept_alive_connections_gives_no_502(start_gateway):
    engine = _ClosingEngine()
    try:
        gw = start_gateway(engine.url, token_ids="off")
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        statuses = [
            requests.post(gw.base("t", "k") + "/v1/chat/completions", json=body).status_code
            for _ in range(20)
        ]
        assert statuses == [200] * 20
    finally:
        engine.sock.close()
