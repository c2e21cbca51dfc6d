"""The LLM judge against a real HTTP server on 127.0.0.1 that answers from a script."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from judge.chat_client import ChatClient, ClientConfig
from judge.llm import judge_rollouts
from tests.judge.rollouts import Story

KEY = "sk-test-secret-123"
VERDICT = {
    "verdicts": [
        {
            "type": "state",
            "verdict": "omission",
            "rationale": "drops the failing test",
            "evidence": [{"message_id": "t4", "quote": "FAILED"}],
            "omitted": [{"kind": "test_name", "value": "test_parse_iso"}],
            "proposal": "# Auto Context Summary\n...",
        },
        {"type": "trigger", "verdict": "ok", "rationale": "fine"},
    ]
}


def completion(content: str) -> dict:
    return {
        "choices": [{"message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 50},
    }


class ScriptedServer:
    """Answers POSTs with the next scripted (status, body, delay_s, headers), or what the
    next scripted function of the request body returns; records requests."""

    def __init__(self, script):
        self.script = list(script)
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
                )
                item = outer.script.pop(0)  # or a function of the request body
                status, payload, delay, headers = item(body) if callable(item) else item
                time.sleep(delay)
                if payload is None:  # hang up without answering
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


MADE: list[ChatClient] = []


@pytest.fixture(autouse=True)
def close_clients():
    """Every client ``client()`` made is closed after the test (its event loop stops)."""
    yield
    while MADE:
        MADE.pop().close()


@pytest.fixture
def serve():
    servers = []

    def start(*script):
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def ok(content, delay=0.0, status=200, headers=None):
    return (
        status,
        completion(content) if isinstance(content, str) else content,
        delay,
        headers or {},
    )


def rollout():
    return (
        Story()
        .act(
            (
                "bash",
                {"command": "pytest tests/test_dates.py"},
                "FAILED tests/test_dates.py::test_parse_iso",
            )
        )
        .compact(
            "# Auto Context Summary\nWorking on src/dates.py.\n## Next step\nFix `parse_date`."
        )
        .build(reward=1.0, resolved=True)
    )


def client(server, tmp_path, **overrides) -> ChatClient:
    config = dict(
        url=server.url,
        model="judge-1",
        api_key_env="SEAM_TEST_KEY",
        timeout_s=2.0,
        max_retries=2,
        backoff_s=0.01,
        cache_dir=str(tmp_path / "cache"),
        price_in_per_mtok=1.0,
        price_out_per_mtok=2.0,
    )
    MADE.append(ChatClient(ClientConfig(**{**config, **overrides})))
    return MADE[-1]


def test_a_valid_answer_becomes_findings_and_is_accounted(serve, tmp_path, monkeypatch):
    monkeypatch.setenv("SEAM_TEST_KEY", KEY)
    server = serve(ok(json.dumps(VERDICT)))
    c = client(server, tmp_path)
    findings, failures = judge_rollouts([rollout()], c)
    assert failures == []
    assert [(f.call_index, f.type, f.verdict, f.judge_model) for f in findings] == [
        (1, "state", "omission", "judge-1")
    ]
    assert findings[0].omitted[0].value == "test_parse_iso" and findings[0].prompt_hash
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == f"Bearer {KEY}"
    assert request["body"]["model"] == "judge-1" and request["body"]["response_format"] == {
        "type": "json_object"
    }
    assert c.usage.as_dict(c.config) == {
        "requests": 1,
        "cache_hits": 0,
        "retries": 0,
        "answered": 1,
        "failures": 0,
        "prompt_tokens": 1000,
        "completion_tokens": 50,
        "cost": 0.0011,
    }


def test_the_prompt_shows_the_history_up_to_the_step_and_never_the_outcome(serve, tmp_path):
    story = (
        Story()
        .act(("read_file", {"path": "src/dates.py"}, "code"))
        .compact("# Auto Context Summary\nsrc/dates.py.\n## Next step\nFix `parse_date`.")
        .say("LATER-MARKER: I fixed it")
    )
    server = serve(ok(json.dumps({"verdicts": []})), ok(json.dumps({"verdicts": []})))
    judge_rollouts(
        [story.build(reward=1.0, resolved=True)], client(server, tmp_path), concurrency=1
    )
    prompt = json.dumps(server.requests[0]["body"]["messages"])
    assert "src/dates.py" in prompt and "LATER-MARKER" not in prompt
    assert "reward" not in prompt and "resolved" not in prompt


def test_malformed_json_from_the_server_is_a_failure_not_a_finding_and_is_not_cached(
    serve, tmp_path
):
    server = serve(ok("the summary looks fine to me {"), ok(json.dumps(VERDICT)))
    findings, failures = judge_rollouts([rollout()], client(server, tmp_path))
    assert findings == [] and len(failures) == 1
    assert failures[0].call_index == 1 and failures[0].reason.startswith("invalid answer: ")
    findings, failures = judge_rollouts(
        [rollout()], client(server, tmp_path)
    )  # asked again, not served from cache
    assert len(findings) == 1 and failures == [] and len(server.requests) == 2


def test_a_body_that_is_not_a_chat_completion_is_a_failure(serve, tmp_path):
    server = serve((200, b"<html>gateway</html>", 0.0, {}))
    _, failures = judge_rollouts([rollout()], client(server, tmp_path))
    assert failures[0].reason.startswith("malformed response from ")


def test_a_verdict_of_the_wrong_type_is_refused(serve, tmp_path):
    wrong = {"verdicts": [{"type": "state", "verdict": "redo"}]}
    server = serve(ok("```json\n" + json.dumps(wrong) + "\n```"))
    _, failures = judge_rollouts([rollout()], client(server, tmp_path))
    assert failures[0].reason == "invalid answer: verdict 'redo' does not belong to type 'state'"


def test_a_500_then_a_429_are_retried_until_success(serve, tmp_path):
    server = serve(
        ok({"error": "boom"}, status=500),
        ok({"error": "slow down"}, status=429, headers={"Retry-After": "0"}),
        ok(json.dumps(VERDICT)),
    )
    c = client(server, tmp_path)
    findings, failures = judge_rollouts([rollout()], c)
    assert failures == [] and len(findings) == 1
    assert (c.usage.requests, c.usage.retries) == (3, 2)


def test_a_dropped_connection_is_retried_and_prose_around_the_json_is_tolerated(serve, tmp_path):
    chatty = completion("Sure! Here is my verdict:\n" + json.dumps(VERDICT) + "\nHope this helps.")
    chatty["usage"] = {"prompt_tokens": "many"}
    server = serve((200, None, 0.0, {}), (200, chatty, 0.0, {}))
    c = client(server, tmp_path)
    findings, failures = judge_rollouts([rollout()], c)
    assert failures == [] and [f.verdict for f in findings] == ["omission"]
    assert (c.usage.requests, c.usage.retries, c.usage.prompt_tokens) == (2, 1, 0)


def test_a_server_slower_than_the_timeout_fails_after_the_retries(serve, tmp_path, monkeypatch):
    monkeypatch.setenv("SEAM_TEST_KEY", KEY)
    server = serve(ok(json.dumps(VERDICT), delay=1.0), ok(json.dumps(VERDICT), delay=1.0))
    c = client(server, tmp_path, timeout_s=0.2, max_retries=1)
    findings, failures = judge_rollouts([rollout()], c)
    assert findings == []
    assert (
        failures[0].reason
        == f"timeout after 0.2s from {server.url}/chat/completions (gave up after 2 attempts)"
    )
    assert KEY not in failures[0].reason and (c.usage.requests, c.usage.failures) == (2, 1)


def test_a_rerun_is_answered_from_the_cache_without_a_request(serve, tmp_path):
    server = serve(ok(json.dumps(VERDICT)))
    first, _ = judge_rollouts([rollout()], client(server, tmp_path))
    c = client(server, tmp_path)
    again, failures = judge_rollouts([rollout()], c)
    assert again == first and failures == []
    assert len(server.requests) == 1 and (
        c.usage.requests,
        c.usage.cache_hits,
        c.usage.cost(c.config),
    ) == (0, 1, 0.0)
    assert KEY not in "".join(p.read_text() for p in (tmp_path / "cache").rglob("*.json"))


def test_seam_judge_llm_writes_findings_errors_and_usage(serve, tmp_path, capsys):
    from pipeline.cli import main

    path = tmp_path / "in.jsonl"
    other = (
        Story("r2")
        .act(("read_file", {"path": "src/other.py"}, "code"))
        .compact("# Auto Context Summary\nsrc/other.py.\n## Next step\nFix `other`.")
        .build()
    )
    path.write_text("\n".join(r.model_dump_json() for r in (rollout(), other)))
    server = serve(ok(json.dumps(VERDICT)), ok("not json"))
    out = tmp_path / "findings.jsonl"
    code = main(
        [
            "judge",
            str(path),
            "--llm",
            server.url,
            "--model",
            "judge-1",
            "--out",
            str(out),
            "--concurrency",
            "1",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--retries",
            "0",
        ]
    )
    assert code == 1  # one of two steps could not be judged: the run failed
    assert [json.loads(line)["verdict"] for line in out.read_text().splitlines()] == ["omission"]
    (error,) = [
        json.loads(line)
        for line in (tmp_path / "findings.jsonl.errors.jsonl").read_text().splitlines()
    ]
    assert error["rollout_id"] == "r2" and error["reason"].startswith("invalid answer")
    assert '"requests": 2' in capsys.readouterr().err
