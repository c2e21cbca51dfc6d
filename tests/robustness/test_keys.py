"""Canary keys in every form seam says it handles, over every command that talks HTTP
(``seam judge --llm``, ``seam gateway --upstream`` and ``--judge URL``): after the run,
no file written and neither stdout nor stderr holds a canary (issue 27, item 5).

The forms: a key in the environment (``--api-key-env``), in the URL's userinfo
(``http://user:KEY@host``), in its query (``?key=``, ``?api_key=``); a server that
echoes the request's ``Authorization`` header back, and one whose answer holds every
canary written as ``\\uXXXX`` escapes. The stand-in servers are stdlib HTTP servers on
127.0.0.1 that record what they received, so the test also checks the keys were sent,
as headers, and never in the URL.
"""

from __future__ import annotations

import base64
import http.server
import json
import re
import signal
import subprocess
import threading
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from pipeline.common.credentials import split_url
from tests.robustness.conftest import SEAM, seam_env

CANARIES = {
    "env": "sk-canary-env-5f1e0c9a7b3d",
    "userinfo": "sk-canary-userinfo-8c2d4e6f",
    "query": "sk-canary-query-1a3b5c7d9e",
    "api_key": "sk-canary-apikey-2b4d6f8a0c",
}


def escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


def received_secrets(path: str, headers: dict[str, str]) -> list[str]:
    """What a server got that could be a key: the Authorization header's token (a Basic
    one decoded) and every query value."""
    found = [v for _, v in parse_qsl(urlsplit(path).query)]
    kind, _, token = headers.get("Authorization", "").partition(" ")
    if kind == "Basic":
        found += base64.b64decode(token).decode().split(":")
    elif token:
        found.append(token)
    return found


class StandIn(http.server.ThreadingHTTPServer):
    """A chat-completions endpoint (and an HTTP judge) that echoes the headers it got
    and answers with every key it received \\u-escaped; it records each request's path
    and headers."""

    def __init__(self):
        self.requests: list[tuple[str, dict[str, str]]] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        headers = dict(self.headers.items())
        self.server.requests.append((self.path, headers))
        echo = " ".join(headers.values())
        leak = " ".join(escaped(c) for c in received_secrets(self.path, headers))
        if self.path.endswith("/judge"):  # the gateway's HTTP judge: no correction
            body = {"correction": None, "note": echo}
        else:
            verdict = {
                "verdicts": [
                    {
                        "type": "state",
                        "verdict": "omission",
                        "rationale": "RATIONALE",
                        "evidence": [],
                        "omitted": [{"kind": "test_name", "value": "test_x"}],
                    }
                ]
            }
            # The answer's JSON holds the escapes as text: they become the keys only
            # when the answer is decoded.
            content = json.dumps(verdict).replace("RATIONALE", f"you sent {echo} | {leak}")
            body = {
                "id": "c1",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3},
            }
        status = 200
        if self.path.startswith("/refuse/") or request.get("model") == "refuse":
            # A server that refuses the key and echoes it back, as some gateways do.
            status, body = 401, {"error": f"bad key {echo} for {self.path} | {leak}"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.shutdown()
    server.server_close()


def assert_no_canary(folder: Path, *texts: str) -> None:
    for name, canary in CANARIES.items():
        for text in texts:
            assert canary not in text, f"the {name} key is printed"
        for path in folder.rglob("*"):
            if path.is_file():
                assert canary.encode() not in path.read_bytes(), f"the {name} key is in {path}"


def urls(port: int) -> dict[str, str]:
    base = f"http://127.0.0.1:{port}/v1"
    return {
        "env": base,
        "userinfo": f"http://seam:{CANARIES['userinfo']}@127.0.0.1:{port}/v1",
        "query": f"{base}?key={CANARIES['query']}&api_key={CANARIES['api_key']}&x=1",
        "refused": f"http://seam:{CANARIES['userinfo']}@127.0.0.1:{port}/refuse/v1"
        f"?key={CANARIES['query']}",
    }


def judge_rollouts_file(folder: Path) -> Path:
    from tests.judge.rollouts import Story

    rollout = (
        Story("r1")
        .act(("bash", {"command": "pytest"}, "FAILED test_x"))
        .compact("# Auto Context Summary\nx.\n## Next step\nFix.")
        .build(reward=1.0)
    )
    path = folder / "rollouts.jsonl"
    path.write_text(rollout.model_dump_json(exclude_none=True) + "\n")
    return path


def run_seam_here(argv: list[str]) -> int:
    """``seam ARGV`` in this process (a second interpreter costs seconds per run here)."""
    from pipeline.cli import build_parser

    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


@pytest.mark.parametrize("form", ["env", "userinfo", "query", "refused"])
def test_seam_judge_llm_writes_and_prints_no_key(form, stand_in, tmp_path, capfd, monkeypatch):
    rollouts = judge_rollouts_file(tmp_path)
    if form == "env":
        monkeypatch.setenv("SEAM_CANARY_KEY", CANARIES["env"])
    else:
        monkeypatch.delenv("SEAM_CANARY_KEY", raising=False)
    code = run_seam_here(
        [
            "judge",
            str(rollouts),
            "--llm",
            urls(stand_in.port)[form],
            "--model",
            "judge",
            "--api-key-env",
            "SEAM_CANARY_KEY",
            "--retries",
            "0",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "findings.jsonl"),
        ]
    )
    done = capfd.readouterr()
    assert_no_canary(tmp_path, done.out, done.err)
    if form == "refused":  # the step is unjudged: the error file holds the redacted echo
        errors = (tmp_path / "findings.jsonl.errors.jsonl").read_text()
        assert code == 1 and "HTTP 401" in errors and "***" in errors
        return
    assert code == 0, done.err
    findings = (tmp_path / "findings.jsonl").read_text()
    assert "you sent" in findings and "***" in findings
    path, headers = stand_in.requests[-1]
    assert not any(c in path for c in CANARIES.values())  # never in the URL sent
    expected = {
        "env": f"Bearer {CANARIES['env']}",
        "userinfo": "Basic " + base64.b64encode(f"seam:{CANARIES['userinfo']}".encode()).decode(),
        "query": f"Bearer {CANARIES['query']}",
    }[form]
    assert headers["Authorization"] == expected
    if form == "query":
        assert path == "/v1/chat/completions?x=1"  # the other parameters stay


def test_seam_gateway_upstream_and_judge_write_and_print_no_key(stand_in, tmp_path):
    upstream = urls(stand_in.port)["userinfo"] + f"?api_key={CANARIES['api_key']}"
    judge = f"http://127.0.0.1:{stand_in.port}/judge?token={CANARIES['query']}"
    command = [
        *SEAM,
        "gateway",
        "--upstream",
        upstream,
        "--judge",
        judge,
        "--api-key-env",
        "SEAM_CANARY_KEY",
        "--out",
        "collected",
        "--port",
        "0",
        "--token-ids",
        "off",
    ]
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=seam_env(SEAM_CANARY_KEY=CANARIES["env"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = process.stderr.readline()
        url = re.search(r"listening on (http://\S+)", banner).group(1)
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            f"{url}/s/t1/r1/v1/chat/completions",
            data=json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = response.read().decode()
        refused = urllib.request.Request(
            request.full_url,
            data=json.dumps({"model": "refuse", "messages": []}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(refused, timeout=60)
        answer += error.value.read().decode()  # the refusal the harness gets (and may log)
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert "choices" in answer and "bad key" in answer and "***" in answer
    assert_no_canary(tmp_path, banner + err, out, answer)
    sent = {path: headers for path, headers in stand_in.requests}
    basic = base64.b64encode(f"seam:{CANARIES['userinfo']}".encode()).decode()
    assert sent["/v1/chat/completions"]["Authorization"] == f"Basic {basic}"
    assert sent["/judge"]["Authorization"] == f"Bearer {CANARIES['query']}"
    manifest = json.loads((tmp_path / "collected" / "gateway.json").read_text())
    assert manifest["upstream"] == f"http://127.0.0.1:{stand_in.port}/v1"


@pytest.mark.parametrize(
    "url, clean, header",
    [
        ("http://h:1/v1", "http://h:1/v1", None),
        ("http://h/v1?x=1&y=2", "http://h/v1?x=1&y=2", None),
        ("https://KEY123@h/v1", "https://h/v1", "Basic " + base64.b64encode(b"KEY123:").decode()),
        ("https://u:p%40ss@[::1]:8/v1", "https://[::1]:8/v1", "Basic dTpwQHNz"),
        ("http://h/v1?api-key=K&model=m#frag", "http://h/v1?model=m", "Bearer K"),
        ("http://h/v1?access_token=K&sig=S", "http://h/v1", "Bearer K"),
    ],
)
def test_split_url_takes_every_credential_out(url, clean, header):
    endpoint = split_url(url)
    assert endpoint.url == clean
    assert endpoint.headers.get("Authorization") == header
    with_env = split_url(url, bearer="ENV")
    assert with_env.headers["Authorization"] == (header or "Bearer ENV")  # the URL's first
    assert "ENV" in with_env.secrets


def test_a_key_that_is_a_key_only_once_decoded_is_redacted_in_the_decoded_pass():
    """The second pass alone (``redact_decoded``), on an answer the text pass has not
    seen: each string of the answer's JSON is decoded, redacted, and re-encoded."""
    from judge.chat_client import redact_decoded
    from pipeline.common.redact import Redactor

    key = CANARIES["env"]
    answer = 'Here: {"rationale": "key ' + escaped(key) + '", "n": 1} done'
    cleaned = redact_decoded(Redactor(key), answer)
    assert cleaned == 'Here: {"rationale": "key ***", "n": 1} done'
    untouched = '{"rationale": "no key \\u0041"}'
    assert redact_decoded(Redactor(key), untouched) == untouched  # byte for byte
