"""The judge's HTTP client against hostile or broken endpoints: real sockets on 127.0.0.1
served by threads in the test, each answering with raw bytes it controls (a trickle,
a flood, the key echoed back in many encodings, nothing listening at all)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import zlib
from pathlib import Path

import pytest

from judge.chat_client import ChatClient, ChatError, ClientConfig
from judge.llm import judge_rollouts
from tests.judge.rollouts import Story

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-proj-Zq8Xv3LmN0pR7tW2yB5cE9gH4jK6"
ANSWER = {"verdicts": [{"type": "state", "verdict": "omission", "rationale": "drops it"}]}


def completion(content: str) -> bytes:
    return json.dumps(
        {"choices": [{"message": {"role": "assistant", "content": content}}]}
    ).encode()


def response(body: bytes, status: int = 200, headers: dict | None = None) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class RawServer:
    """Accepts connections on 127.0.0.1; for each, reads one HTTP request and calls
    ``handler(conn, request_bytes)``, which writes whatever bytes it wants."""

    def __init__(self, handler):
        self.handler = handler
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + body)
            with contextlib.suppress(OSError):  # the client left
                self.handler(conn, head)

    def close(self):
        self.closed.set()
        self.sock.close()


@pytest.fixture
def serve():
    servers = []

    def start(handler):
        servers.append(RawServer(handler))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def make_client(tmp_path, monkeypatch):
    monkeypatch.setenv("SEAM_TEST_KEY", KEY)
    made = []

    def make(url, **overrides):
        config = dict(
            url=url,
            model="judge-1",
            api_key_env="SEAM_TEST_KEY",
            timeout_s=2.0,
            max_retries=0,
            backoff_s=0.01,
            cache_dir=str(tmp_path / "cache"),
        )
        made.append(ChatClient(ClientConfig(**{**config, **overrides})))
        return made[-1]

    yield make
    for c in made:
        c.close()


def ask(client) -> object:
    return client.complete([{"role": "user", "content": "judge"}], json.loads)[0]


def cached_text(tmp_path) -> str:
    return "".join(p.read_text() for p in (tmp_path / "cache").rglob("*.json"))


# -- total timeouts ---------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["headers", "body"])
def test_a_server_trickling_one_byte_at_a_time_is_cut_off_at_the_timeout(phase, serve, make_client):
    whole = response(completion(json.dumps(ANSWER)) + b" " * 1000)
    start_at = 0 if phase == "headers" else whole.index(b"\r\n\r\n") + 4

    def trickle(conn, _):
        conn.sendall(whole[:start_at])
        for i in range(start_at, len(whole)):  # ~100 s in all: far past any timeout
            conn.sendall(whole[i : i + 1])
            time.sleep(0.1)

    client = make_client(serve(trickle).url, timeout_s=1.0, max_retries=1)
    start = time.monotonic()
    with pytest.raises(ChatError, match=r"timeout after 1s from .* \(gave up after 2 attempts\)"):
        ask(client)
    elapsed = time.monotonic() - start
    assert elapsed < 2 * 1.0 + 1.5, elapsed  # two attempts of 1 s, plus slack


# -- bounded responses ------------------------------------------------------------------
FLOOD_SCRIPT = """
import json, resource, sys
from judge.chat_client import ChatClient, ChatError, ClientConfig
client = ChatClient(ClientConfig(url=sys.argv[1], model="m", api_key_env=None, timeout_s=60,
                                 max_retries=0, cache_dir=sys.argv[2]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    client.complete([{"role": "user", "content": "x"}], json.loads)
    print("answered")
except ChatError as exc:
    print(exc)
client.close()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""
FLOOD_BYTES = 300 << 20
CHUNK = b'{"filler": "' + b"x" * (1 << 20)


def deflate_bomb(chunk: bytes, count: int) -> bytes:
    """A raw deflate stream of ``chunk`` × ``count`` in ~1 KB per MB: after a full flush
    the compressor starts afresh, so every chunk compresses to the same bytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    return block * count + c.flush()


def flood_handler(kind: str):
    """300 MB of body: with no length (read until close), declaring its length, or
    deflate-encoded, inflating to 300 MB from 300 KB on the wire."""

    def handler(conn, _):
        if kind == "deflate":
            body = deflate_bomb(CHUNK, FLOOD_BYTES // len(CHUNK))
            head = (
                f"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: {len(body)}\r\n"
            )
            conn.sendall(head.encode() + b"\r\n" + body)
            return
        head = "HTTP/1.1 200 OK\r\nConnection: close\r\n"
        if kind == "declared":
            head += f"Content-Length: {FLOOD_BYTES}\r\n"
        conn.sendall(head.encode() + b"\r\n")
        for _ in range(FLOOD_BYTES // len(CHUNK)):
            conn.sendall(CHUNK)

    return handler


@pytest.mark.parametrize("kind", ["undeclared", "declared", "deflate"])
def test_a_flood_is_read_only_up_to_the_limit_in_little_memory_and_never_cached(
    kind, serve, tmp_path
):
    server = serve(flood_handler(kind))
    done = subprocess.run(
        [sys.executable, "-c", FLOOD_SCRIPT, server.url, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    message, growth_mb = done.stdout.splitlines()
    what = f"declares {FLOOD_BYTES:,} bytes" if kind == "declared" else "sent more"
    assert message == (
        f"response from {server.url}/chat/completions {what} than the limit of 4,194,304 bytes"
    )
    # Peak RSS growth during the request: the 4 MiB kept plus what one network read
    # inflates to (deflate: up to ~1000× of a 64 KB read); reading it whole: > 300 MB.
    assert int(growth_mb) < 150, growth_mb
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.json"))


def test_an_answer_over_the_limit_fails_and_is_not_cached(serve, make_client, tmp_path):
    big = json.dumps({**ANSWER, "pad": "y" * 200_000})
    server = serve(lambda conn, _: conn.sendall(response(completion(big))))
    with pytest.raises(ChatError, match="than the limit of 100,000 bytes"):
        ask(make_client(server.url, max_response_bytes=100_000))
    assert cached_text(tmp_path) == ""


# -- redaction ------------------------------------------------------------------------
def encodings(secret: str) -> dict[str, str]:
    raw = secret.encode()
    return {
        "plain": secret,
        "json_escaped": "".join(f"\\u{ord(c):04x}" for c in secret),
        "json_escaped_upper_mixed": "".join(
            f"\\u{ord(c):04X}" if i % 2 else c for i, c in enumerate(secret)
        ),
        "percent": urllib.parse.quote(secret, safe=""),
        "percent_twice": urllib.parse.quote(urllib.parse.quote(secret, safe=""), safe=""),
        "html_entities": "".join(f"&#{ord(c)};" for c in secret),
        "base64_bearer": base64.b64encode(b"Bearer " + raw).decode(),
        "base64_urlsafe": base64.urlsafe_b64encode(raw).decode(),
        "hex": raw.hex(),
        "utf16": secret.encode("utf-16-le").decode("latin-1"),
    }


LEAKS = encodings(KEY)
# The part of each form that would give the key away (Base64 around the key's edges
# encodes bits of the neighbouring bytes too, so only its middle is checked).
TELLS = {name: (form[12:-4] if name.startswith("base64") else form) for name, form in LEAKS.items()}


def assert_no_leak(*texts: str) -> None:
    for text in texts:
        for name, tell in TELLS.items():
            assert tell not in text, f"the key leaked ({name}) in {text[:300]!r}"
        assert KEY[:8] not in text and KEY[5:25] not in text  # no part of it cut short


def echo_everything(conn, head: bytes):
    """Echo the request's Authorization header back in every encoding, in the answer."""
    secret = next(
        line.split(b"Bearer ")[1].decode()
        for line in head.split(b"\r\n")
        if line.startswith(b"Authorization:")
    )
    forms = encodings(secret)
    verdict = {**ANSWER["verdicts"][0], "rationale": "you sent " + " | ".join(forms.values())}
    content = json.dumps({"verdicts": [verdict]})
    body = json.dumps(
        {"choices": [{"message": {"content": content}}], "debug": forms}, ensure_ascii=True
    ).encode()
    conn.sendall(response(body))


def test_a_key_echoed_in_any_encoding_never_reaches_findings_cache_or_errors(
    serve, make_client, tmp_path
):
    server = serve(echo_everything)
    rollout = (
        Story()
        .act(("bash", {"command": "pytest"}, "FAILED test_x"))
        .compact("# Auto Context Summary\nx.\n## Next step\nFix.")
        .build(reward=1.0)
    )
    findings, failures = judge_rollouts([rollout], make_client(server.url))
    assert failures == [] and findings[0].rationale.startswith("you sent ***")
    assert_no_leak(findings[0].model_dump_json(), cached_text(tmp_path))


@pytest.mark.parametrize(
    "status, body",
    [
        (400, lambda forms: json.dumps({"error": "bad key", "echo": forms}).encode()),
        (200, lambda forms: b"<html>gateway saw " + " ".join(forms.values()).encode()),
        (503, lambda forms: ("x" * 290 + forms["plain"]).encode()),  # a key across the cut
        (200, lambda forms: ("x" * 190 + forms["plain"]).encode()),  # the same, malformed
    ],
    ids=["http-400", "malformed", "error-across-the-cut", "malformed-across-the-cut"],
)
def test_a_key_echoed_in_an_error_body_never_reaches_the_error(status, body, serve, make_client):
    server = serve(lambda conn, _: conn.sendall(response(body(encodings(KEY)), status)))
    with pytest.raises(ChatError) as raised:
        ask(make_client(server.url))
    assert_no_leak(str(raised.value))
    assert "***" in str(raised.value)


@pytest.mark.parametrize("placeholder", ["null", "EMPTY", "sk-1", "true"])
def test_a_placeholder_key_is_sent_but_never_redacts_ordinary_text(
    placeholder, serve, make_client, monkeypatch
):
    answer = {
        "verdicts": [
            {"type": "state", "verdict": "omission", "rationale": "EMPTY null true sk-1 ok"}
        ]
    }
    server = serve(lambda conn, _: conn.sendall(response(completion(json.dumps(answer)))))
    monkeypatch.setenv("SEAM_TEST_KEY", placeholder)
    client = make_client(server.url, cache_dir=None)
    assert ask(client) == answer
    assert f"Bearer {placeholder}".encode() in server.requests[-1]


# -- fail fast on a dead endpoint -----------------------------------------------------
def dead_url() -> str:
    """A port on 127.0.0.1 with nothing listening (bound, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def many_rollouts(n: int):
    return [
        Story(f"r{i}")
        .act(("bash", {"command": "pytest"}, "FAILED"))
        .compact("# Auto Context Summary\nx.\n## Next step\nFix.")
        .build(reward=1.0)
        for i in range(n)
    ]


def test_a_dead_endpoint_gets_a_few_connection_attempts_not_one_per_step(make_client):
    client = make_client(dead_url(), max_retries=4, max_connect_failures=5)
    findings, failures = judge_rollouts(many_rollouts(60), client, concurrency=4)
    assert findings == [] and len(failures) == 60
    assert client.usage.requests <= 5 + 4, client.usage.requests  # the limit + in flight
    down = [f for f in failures if f.reason.startswith("not sent: ")]
    assert len(down) >= 60 - 4
    assert re.fullmatch(
        r"not sent: .* is down \(\d connection failures in a row\)", down[-1].reason
    )


def test_seam_judge_exits_non_zero_with_counts_when_steps_fail(tmp_path, capsys):
    from pipeline.cli import main

    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(r.model_dump_json() + "\n" for r in many_rollouts(12)))
    out = tmp_path / "findings.jsonl"
    code = main(
        ["judge", str(inputs), "--llm", dead_url(), "--model", "m", "--out", str(out)]
        + ["--no-cache", "--retries", "1", "--max-connect-failures", "2"]
    )
    err = " ".join(capsys.readouterr().err.split())  # as printed, unwrapped
    assert code == 1
    assert "12 of 12 step(s) could not be judged" in err and "is down" in err
    assert len((tmp_path / "findings.jsonl.errors.jsonl").read_text().splitlines()) == 12


# -- the cache ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "damage",
    [b"", b"{not json", b'{"content": 7}', b'["content"]', b"\xff\xfe", b'{"content": "nope"}'],
    ids=["empty", "truncated", "not-text", "not-an-entry", "not-utf8", "no-longer-valid"],
)
def test_a_corrupt_cache_entry_is_a_miss_and_is_rewritten(damage, serve, make_client, tmp_path):
    server = serve(lambda conn, _: conn.sendall(response(completion(json.dumps(ANSWER)))))
    client = make_client(server.url)
    assert ask(client) == ANSWER
    (entry,) = (tmp_path / "cache").rglob("*.json")
    entry.write_bytes(damage)
    assert ask(client) == ANSWER
    assert len(server.requests) == 2 and client.usage.cache_hits == 0
    assert json.loads(entry.read_text())["content"] == json.dumps(ANSWER)
    assert ask(client) == ANSWER and client.usage.cache_hits == 1
