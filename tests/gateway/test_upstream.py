"""The gateway's upstream HTTP/1.1 client (pipeline/gateway/upstream.py) against real
servers on 127.0.0.1 whose every byte the test scripts: Content-Length, chunked and
close-delimited answers, keep-alive reuse and its end, an engine that closes a kept-alive
connection silently, resets mid-answer, trickles, answers too much, streams; TLS; the
cap on connections. Each runs on asyncio's loop and, where installed, uvloop's."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import struct
import subprocess
from collections.abc import Awaitable, Callable

import pytest

from pipeline.gateway.upstream import (
    HIGH_WATER,
    AnswerTooLarge,
    Upstream,
    UpstreamError,
    UpstreamTimeout,
)

LOOPS = ["asyncio"]
try:
    import uvloop

    LOOPS.append("uvloop")
except ImportError:  # the gateway extra brings it where it builds
    uvloop = None


def run(loop_name: str, main: Awaitable):
    factory = uvloop.new_event_loop if loop_name == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(asyncio.wait_for(main, 10))


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One request from the client: (head, body), or None when it closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Engine"], Awaitable[None]]


class Engine:
    """A scripted server: ``handler(reader, writer, engine)`` serves one connection."""

    def __init__(self, handler: Handler, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl_context = ssl_context
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.open = self.most_open = 0

    async def __aenter__(self) -> Engine:
        async def serve(reader, writer):
            self.connections += 1
            self.open += 1
            self.most_open = max(self.most_open, self.open)
            try:
                await self.handler(reader, writer, self)
            except (asyncio.CancelledError, ConnectionError):
                pass  # the test is over, or the client reset: nothing to report
            finally:
                self.open -= 1
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    def url(self, scheme: str = "http", path: str = "/v1") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    async def next_request(self, reader) -> bytes | None:
        got = await read_request(reader)
        if got is None:
            return None
        self.requests.append(got)
        return got[1]


async def keep_alive(reader, writer, engine: Engine) -> None:
    """Answers every request on the connection with its own body, Content-Length framed."""
    while (body := await engine.next_request(reader)) is not None:
        writer.write(answer(b"echo:" + body, "Content-Type: application/json"))
        await writer.drain()


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as an engine that dies does."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.mark.parametrize("loop", LOOPS)
def test_answers_are_read_whole_and_the_connection_is_kept(loop):
    async def main():
        async with Engine(keep_alive) as engine:
            up = Upstream(engine.url(), {"Authorization": "Bearer k"})
            got = [await up.post("/chat/completions", b'{"n":%d}' % i) for i in range(3)]
            await up.close()
            return engine, got

    engine, got = run(loop, main())
    assert got == [(200, b'echo:{"n":%d}' % i) for i in range(3)]
    assert engine.connections == 1  # one connection, kept alive across the calls
    head = engine.requests[0][0].decode()
    lines = head.split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    assert f"Host: 127.0.0.1:{engine.port}" in lines
    assert {
        "Content-Type: application/json",
        "Content-Length: 7",
        "Authorization: Bearer k",
    } <= set(lines)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_body_in_pieces_is_sent_as_its_pieces_joined(loop):
    """The gateway hands its payload over in pieces (``server._payload``: the history's
    bytes are not joined into one buffer); the engine gets them joined, with the joined
    length as Content-Length, on a kept-alive connection as for bytes."""
    pieces = [b'{"messages":[', b'{"a":1}', b",", b'{"b":' + b"2" * 70_000 + b"}", b"]}"]

    async def main():
        async with Engine(keep_alive) as engine:
            up = Upstream(engine.url(), {})
            got = [await up.post("/x", pieces), await up.post("/x", [b"{}"])]
            got.append(await up.post("/x", []))
            await up.close()
            return engine, got

    engine, got = run(loop, main())
    whole = b"".join(pieces)
    assert got == [(200, b"echo:" + whole), (200, b"echo:{}"), (200, b"echo:")]
    assert b"Content-Length: %d\r\n" % len(whole) in engine.requests[0][0]
    assert engine.connections == 1


def test_the_target_keeps_the_query_and_a_default_port_is_not_in_the_host():
    up = Upstream("https://engine.example/base/v1/?api-version=2024", {})
    assert up.target("/chat/completions") == "/base/v1/chat/completions?api-version=2024"
    assert up.host_header == "engine.example" and up.port == 443
    assert Upstream("http://[::1]:8000/v1").host_header == "[::1]:8000"
    with pytest.raises(ValueError, match="line break"):
        Upstream("http://h/v1", {"Authorization": "Bearer a\r\nX-Injected: 1"})
    with pytest.raises(ValueError, match="http"):
        Upstream("ftp://h/v1")


@pytest.mark.parametrize("loop", LOOPS)
def test_chunked_and_close_delimited_bodies(loop):
    whole = b'{"choices": [' + b"7," * 5000 + b"7]}"

    async def chunked(reader, writer, engine):
        while await engine.next_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(whole), 3000):
                piece = whole[i : i + 3000]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")

    async def until_close(reader, writer, engine):
        await engine.next_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n")
        for i in range(0, len(whole), 4096):
            writer.write(whole[i : i + 4096])
            await writer.drain()
        # the close (the handler's end) is the body's end

    async def main():
        got = {}
        for name, handler in (("chunked", chunked), ("close", until_close)):
            async with Engine(handler) as engine:
                up = Upstream(engine.url())
                got[name] = [await up.post("/x", b"{}") for _ in range(2)], engine.connections
                await up.close()
        return got

    got = run(loop, main())
    assert got["chunked"] == ([(200, whole)] * 2, 1)  # kept alive
    assert got["close"] == ([(200, whole)] * 2, 2)  # the close ended it: a new one each


@pytest.mark.parametrize(
    "status_line, header", [("HTTP/1.1 200 OK", "Connection: close"), ("HTTP/1.0 200 OK", "")]
)
def test_an_answer_that_says_close_is_not_kept(status_line, header):
    async def closing(reader, writer, engine):
        if await engine.next_request(reader) is not None:
            head = "\r\n".join(x for x in (status_line, "Content-Length: 2", header) if x)
            writer.write(head.encode() + b"\r\n\r\nok")
            await writer.drain()
            await asyncio.sleep(0.3)  # the engine would close it soon; the client must not reuse

    async def main():
        async with Engine(closing) as engine:
            up = Upstream(engine.url())
            got = [await up.post("/x", b"{}")]
            assert up.open == 0 and not up._idle  # closed at once, not kept for the next
            got.append(await up.post("/x", b"{}"))
            await up.close()
            return got, engine.connections

    assert run("asyncio", main()) == ([(200, b"ok")] * 2, 2)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_kept_alive_connection_closed_before_answering_is_retried_once_fresh(loop):
    async def one_answer_per_connection(reader, writer, engine):
        """Answers one call, then takes the next and closes without a word."""
        if await engine.next_request(reader) is not None:
            writer.write(answer(b"ok"))
            await writer.drain()
        await engine.next_request(reader)  # the client reused the connection: drop it

    async def main():
        async with Engine(one_answer_per_connection) as engine:
            up = Upstream(engine.url())
            got = [await up.post("/x", b"{}") for _ in range(3)]
            await up.close()
            return got, engine.connections, len(engine.requests)

    got, connections, requests = run(loop, main())
    assert got == [(200, b"ok")] * 3
    # Calls 2 and 3 were each sent on the connection the call before used, which the
    # engine dropped, then once more on a new one.
    assert (connections, requests) == (3, 5)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_fresh_connection_closed_or_reset_is_not_retried(loop):
    async def close_at_once(reader, writer, engine):
        await engine.next_request(reader)

    async def reset_mid_answer(reader, writer, engine):
        await engine.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)

    async def main():
        errors = []
        for handler in (close_at_once, reset_mid_answer):
            async with Engine(handler) as engine:
                up = Upstream(engine.url())
                with pytest.raises(UpstreamError) as caught:
                    await up.post("/x", b"{}")
                errors.append((str(caught.value), len(engine.requests)))
                await up.close()
        return errors

    (before, n1), (mid, n2) = run(loop, main())
    assert "before answering" in before and "mid-answer" in mid
    assert n1 == n2 == 1  # sent once: the engine may have done the work


def test_a_reset_kept_alive_connection_after_the_answer_began_is_not_retried():
    async def second_call_cut(reader, writer, engine):
        if await engine.next_request(reader) is not None:
            writer.write(answer(b"ok"))
            await writer.drain()
        if await engine.next_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{")
            await writer.drain()
            await asyncio.sleep(0.05)
            reset(writer)

    async def main():
        async with Engine(second_call_cut) as engine:
            up = Upstream(engine.url())
            assert await up.post("/x", b"{}") == (200, b"ok")
            with pytest.raises(UpstreamError, match="mid-answer"):
                await up.post("/x", b"{}")
            await up.close()
            return len(engine.requests)

    assert run("asyncio", main()) == 2


@pytest.mark.parametrize("loop", LOOPS)
def test_an_answer_over_the_cap_is_refused(loop):
    cap = 10_000

    async def sized(reader, writer, engine):
        while (body := await engine.next_request(reader)) is not None:
            n = int(body)
            if body.startswith(b"0"):  # chunked: the size is known only as it comes
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in range(n // 1000):
                    writer.write(b"3e8\r\n" + b"x" * 1000 + b"\r\n")
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(answer(b"x" * n))
            await writer.drain()

    async def main():
        async with Engine(sized) as engine:
            up = Upstream(engine.url(), max_body=cap)
            assert await up.post("/x", b"%d" % cap) == (200, b"x" * cap)  # exactly: taken
            assert await up.post("/x", b"0%d" % cap) == (200, b"x" * cap)
            messages = []
            for body in (b"%d" % (cap + 1), b"0%d" % (cap + 1000)):
                with pytest.raises(AnswerTooLarge) as caught:
                    await up.post("/x", body)
                messages.append(str(caught.value))
            await up.close()
            return messages

    declared, counted = run(loop, main())
    assert declared == "the engine's answer has 10,001 bytes, over 10,000"
    assert counted == "the engine's answer is over 10,000 bytes"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_trickling_engine_times_out(loop):
    async def trickle(reader, writer, engine):
        await engine.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.02)

    async def main():
        async with Engine(trickle) as engine:
            up = Upstream(engine.url(), timeout=0.3)
            started = asyncio.get_running_loop().time()
            with pytest.raises(UpstreamTimeout, match=r"within 0.3 s"):
                await up.post("/x", b"{}")
            await up.close()
            return asyncio.get_running_loop().time() - started

    assert 0.25 < run(loop, main()) < 2


def test_connect_failures_are_one_line_errors():
    async def main():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()  # nobody listens there
        up = Upstream(f"http://127.0.0.1:{port}/v1")
        with pytest.raises(
            UpstreamError, match=f"cannot connect to the engine at 127.0.0.1:{port}"
        ):
            await up.post("/x", b"{}")
        assert up.open == 0

        # A TLS engine that never finishes its handshake: the connect timeout.
        async def silent(reader, writer, engine):
            await asyncio.sleep(5)

        async with Engine(silent) as engine:
            up = Upstream(engine.url("https"), connect_timeout=0.2)
            with pytest.raises(UpstreamTimeout, match="no connection to the engine"):
                await up.post("/x", b"{}")
            assert up.open == 0

    run("asyncio", main())


@pytest.mark.parametrize("loop", LOOPS)
def test_odd_answers_are_errors_and_interim_answers_are_skipped(loop):
    async def odd(reader, writer, engine):
        body = await engine.next_request(reader)
        if body == b"gzip":
            writer.write(answer(b"\x1f\x8b", "Content-Encoding: gzip"))
        elif body == b"junk":
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        elif body == b"interim":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"after"))
        elif body == b"two":
            writer.write(answer(b"one") + answer(b"unasked"))
        await writer.drain()
        await asyncio.sleep(0.1)

    async def main():
        async with Engine(odd) as engine:
            up = Upstream(engine.url())
            with pytest.raises(UpstreamError, match="encoded"):
                await up.post("/x", b"gzip")
            with pytest.raises(UpstreamError, match="not valid HTTP"):
                await up.post("/x", b"junk")
            assert await up.post("/x", b"interim") == (200, b"after")
            with pytest.raises(UpstreamError, match="more than one answer"):
                await up.post("/x", b"two")
            await up.close()

    run(loop, main())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stream_arrives_piece_by_piece_with_no_line_limit(loop):
    line = b"data: {" + b"1," * 300_000 + b"1}\n\n"  # ~600 KB: one event, one line
    go_on = asyncio.Event

    async def main():
        second = go_on()

        async def stream(reader, writer, engine):
            while await engine.next_request(reader) is not None:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                first = b"data: first\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(first), first))
                await writer.drain()
                await second.wait()  # held until the client has read the first piece
                for i in range(0, len(line), 50_000):
                    piece = line[i : i + 50_000]
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                writer.write(b"0\r\n\r\n")
                await writer.drain()

        async with Engine(stream) as engine:
            up = Upstream(engine.url())
            resp = await up.post_stream("/x", b"{}")
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            pieces = resp.iter_any()
            assert await anext(pieces) == b"data: first\n\n"  # before the rest exists
            second.set()
            rest = b"".join([p async for p in pieces])
            resp.release()
            again = await up.post_stream("/x", b"{}")
            whole = await again.read()
            again.release()
            await up.close()
            return rest, whole, engine.connections

    rest, whole, connections = run(loop, main())
    assert rest == line and whole == b"data: first\n\n" + line
    assert connections == 1  # a stream read to its end leaves its connection reusable


def test_a_slow_reader_pauses_the_engine_and_loses_nothing():
    total = 8 * HIGH_WATER

    async def flood(reader, writer, engine):
        await engine.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for _ in range(total // 65536):
            writer.write(b"y" * 65536)
            await writer.drain()

    async def main():
        async with Engine(flood) as engine:
            up = Upstream(engine.url(), max_body=total)
            resp = await up.post_stream("/x", b"{}")
            largest = got = 0
            async for piece in resp.iter_any():
                largest, got = max(largest, len(piece)), got + len(piece)
                await asyncio.sleep(0.01)  # slower than the engine
            await up.close()
            return largest, got

    largest, got = run("asyncio", main())
    assert got == total and largest <= 2 * HIGH_WATER


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cut_stream_raises_after_its_bytes_and_release_closes_an_unfinished_one(loop):
    async def cut(reader, writer, engine):
        while (body := await engine.next_request(reader)) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            await writer.drain()
            if body == b"cut":
                await asyncio.sleep(0.05)
                reset(writer)
                return
            await asyncio.sleep(5)

    async def main():
        async with Engine(cut) as engine:
            up = Upstream(engine.url())
            resp = await up.post_stream("/x", b"cut")
            seen = []
            with pytest.raises(UpstreamError, match="mid-answer"):
                async for piece in resp.iter_any():
                    seen.append(piece)
            resp.release()
            held = await up.post_stream("/x", b"hold")
            assert await anext(held.iter_any()) == b"hello"
            held.release()  # unfinished: its connection is closed, not reused
            assert up.open == 0 and not up._idle
            await up.close()
            return seen

    assert run(loop, main()) == [b"hello"]


@pytest.mark.parametrize("loop", LOOPS)
def test_the_connection_cap_queues_calls_and_no_cap_opens_one_per_call(loop):
    async def slow(reader, writer, engine):
        while await engine.next_request(reader) is not None:
            await asyncio.sleep(0.1)
            writer.write(answer(b"ok"))
            await writer.drain()

    async def main():
        most = []
        for cap in (2, 0):
            async with Engine(slow) as engine:
                up = Upstream(engine.url(), connections=cap)
                got = await asyncio.gather(*(up.post("/x", b"{}") for _ in range(12)))
                assert got == [(200, b"ok")] * 12
                most.append(engine.most_open)
                await up.close()
        return most

    assert run(loop, main()) == [2, 12]


def test_a_call_waiting_under_the_cap_times_out_and_a_cancelled_call_frees_its_place():
    async def stuck(reader, writer, engine):
        await engine.next_request(reader)
        await asyncio.sleep(5)

    async def main():
        async with Engine(stuck) as engine:
            up = Upstream(engine.url(), connections=1, timeout=5)
            first = asyncio.create_task(up.post("/x", b"{}"))
            await asyncio.sleep(0.05)
            up.timeout = 0.2  # the next call's
            with pytest.raises(UpstreamTimeout, match=r"came free within 0.2 s"):
                await up.post("/x", b"{}")
            assert up.open == 1
            first.cancel()  # a cancelled call closes its connection: the place is free
            with pytest.raises(asyncio.CancelledError):
                await first
            assert up.open == 0 and not up._waiters
            await up.close()

    run("asyncio", main())


def test_unasked_bytes_on_an_idle_connection_drop_it():
    async def chatty(reader, writer, engine):
        while await engine.next_request(reader) is not None:
            writer.write(answer(b"ok"))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\n")  # nobody asked

    async def main():
        async with Engine(chatty) as engine:
            up = Upstream(engine.url())
            assert await up.post("/x", b"{}") == (200, b"ok")
            await asyncio.sleep(0.15)
            assert await up.post("/x", b"{}") == (200, b"ok")
            await up.close()
            return engine.connections

    assert run("asyncio", main()) == 2


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1: (server context, client context)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        + ["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


@pytest.mark.parametrize("loop", LOOPS)
def test_https_engines_are_verified(loop, tls_pair):
    server_context, client_context = tls_pair

    async def main():
        async with Engine(keep_alive, ssl_context=server_context) as engine:
            up = Upstream(engine.url("https"), ssl_context=client_context)
            got = [await up.post("/x", b"{}") for _ in range(2)]
            await up.close()
            untrusted = Upstream(engine.url("https"))  # the system's roots: refused
            with pytest.raises(UpstreamError, match="cannot connect"):
                await untrusted.post("/x", b"{}")
            return got, engine.connections

    got, connections = run(loop, main())
    assert got == [(200, b"echo:{}")] * 2 and connections == 1  # kept; the refused one never served


def test_the_gateway_gives_an_engine_that_never_answers_a_502_in_its_upstream_timeout(
    start_gateway, capsys
):
    """The gateway's options reach the client: --upstream-timeout bounds the call (a 502
    with nothing written), and timeouts that are not positive are refused at the start."""
    import requests
    from aiohttp import web

    from pipeline.cli import main
    from tests.gateway.serving import ThreadedApp

    async def never(request: web.Request) -> web.Response:
        await asyncio.sleep(0.6)  # past the gateway's 0.3 s (the server's stop waits for it)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", never)
    served = ThreadedApp(app)
    try:
        gw = start_gateway(served.url + "/v1", token_ids="off", upstream_timeout_s=0.3)
        assert gw.gateway.upstream.connect_timeout == 30.0  # the default
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        answer = requests.post(gw.base("t", "slow") + "/v1/chat/completions", json=body)
        assert answer.status_code == 502
        assert "did not answer within 0.3 s" in answer.json()["error"]["message"]
        assert not (gw.out / "calls" / "slow.jsonl").exists()
    finally:
        served.stop()
    args = ["gateway", "--upstream", served.url + "/v1", "--out", str(gw.out.parent / "cli")]
    assert main([*args, "--upstream-connect-timeout", "0"]) == 2
    assert "--upstream-connect-timeout must be positive" in capsys.readouterr().err


def test_the_gateway_raises_its_open_files_limit_to_the_hard_limit():
    """Two sockets per concurrent session: a soft limit of 1,024 would cap it near 500."""
    resource = pytest.importorskip("resource")
    from pipeline.cli.gateway import raise_open_files_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("the hard limit leaves nothing to raise")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        expected = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
        assert raise_open_files_limit() == expected
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (expected, hard)
        assert raise_open_files_limit(ceiling=100) == expected  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
