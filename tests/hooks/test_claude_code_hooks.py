"""``seam hooks``: the Claude Code capture hook is merged into settings (never clobbering
them), the capture command snapshots what the hook receives without printing, and the
reader joins the snapshots to the session's compactions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pipeline.hooks.claude_code import STATUS_MARK, capture, capture_command, install
from schemas.rollout import RewriteEvent
from tests.readers.util import fixture

ROOT = Path(__file__).resolve().parents[2]
SESSION_FILE = fixture("claude_code", "judge_compactions.jsonl")
SESSION = "7c2f0d1e-0000-4000-8000-00000000ju18"


def seam(*args, stdin: str = "", env_extra=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pipeline.cli import main; sys.exit(main())",
            *args,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
    )


def hook_input(transcript: Path, event="PreCompact", trigger="auto", **extra) -> dict:
    """What Claude Code sends a compaction hook on stdin (its hook documentation)."""
    return {
        "session_id": SESSION,
        "transcript_path": str(transcript),
        "cwd": "/work/app",
        "permission_mode": "default",
        "hook_event_name": event,
        "trigger": trigger,
        **extra,
    }


def test_install_merges_into_existing_settings_and_is_idempotent(tmp_path):
    settings = tmp_path / "settings.json"
    other = {"type": "command", "command": "backup-transcript.sh"}
    settings.write_text(
        json.dumps(
            {
                "model": "opus",
                "permissions": {"allow": ["Bash(ls:*)"]},
                "hooks": {
                    "PreCompact": [{"matcher": "manual", "hooks": [other]}],
                    "Stop": [{"hooks": [{"type": "command", "command": "notify"}]}],
                },
            }
        )
    )
    command = capture_command(tmp_path / "cap", program=["/opt/seam"])
    assert install(settings, command, ("PreCompact", "PostCompact")) == {
        "PreCompact": "added",
        "PostCompact": "added",
    }
    data = json.loads(settings.read_text())
    assert data["model"] == "opus" and data["permissions"] == {"allow": ["Bash(ls:*)"]}
    assert data["hooks"]["Stop"] == [{"hooks": [{"type": "command", "command": "notify"}]}]
    assert data["hooks"]["PreCompact"][0] == {"matcher": "manual", "hooks": [other]}
    ours = data["hooks"]["PreCompact"][1]["hooks"][0]
    assert ours == {
        "type": "command",
        "command": f"/opt/seam hooks capture claude-code --capture {tmp_path / 'cap'}",
        "timeout": 60,
        "statusMessage": STATUS_MARK,
    }
    before = settings.stat().st_mtime_ns
    assert set(install(settings, command, ("PreCompact",)).values()) == {"unchanged"}
    assert settings.stat().st_mtime_ns == before
    # Another capture folder replaces seam's entry, and only seam's.
    moved = capture_command(tmp_path / "elsewhere", program=["/opt/seam"])
    assert install(settings, moved, ("PreCompact",)) == {"PreCompact": "updated"}
    groups = json.loads(settings.read_text())["hooks"]["PreCompact"]
    assert groups == [
        {"matcher": "manual", "hooks": [other]},
        {"hooks": [{**ours, "command": moved}]},
    ]


def test_install_refuses_a_settings_file_that_is_not_json_and_leaves_it(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text('{"model": "opus",')
    run = seam(
        "hooks",
        "install",
        "claude-code",
        "--settings",
        str(settings),
        "--capture",
        str(tmp_path / "cap"),
        "--no-post-compact",
    )
    assert run.returncode == 2 and "is not JSON" in run.stderr
    assert settings.read_text() == '{"model": "opus",'


def test_install_cli_adds_pre_compact_only_without_a_known_claude_version(tmp_path):
    settings = tmp_path / "s.json"
    run = seam(
        "hooks",
        "install",
        "claude-code",
        "--settings",
        str(settings),
        "--capture",
        str(tmp_path / "cap"),
        env_extra={"PATH": "/nonexistent"},
    )
    assert run.returncode == 0, run.stderr
    assert list(json.loads(settings.read_text())["hooks"]) == ["PreCompact"]
    assert "PostCompact: not installed" in run.stdout


def test_capture_snapshots_the_transcript_and_prints_nothing(tmp_path):
    given = hook_input(SESSION_FILE, trigger="manual", custom_instructions="keep the PR number")
    run = seam(
        "hooks", "capture", "claude-code", "--capture", str(tmp_path), stdin=json.dumps(given)
    )
    assert run.returncode == 0 and run.stdout == "" and run.stderr == ""
    (side,) = (tmp_path / SESSION).glob("*.capture")
    record = json.loads(side.read_text())
    assert (record["event"], record["trigger"], record["custom_instructions"]) == (
        "PreCompact",
        "manual",
        "keep the PR number",
    )
    snapshot = side.with_suffix(".jsonl")
    assert snapshot.read_bytes() == SESSION_FILE.read_bytes()
    assert record["transcript"]["records"] == len(SESSION_FILE.read_text().splitlines())


def test_a_broken_hook_input_never_fails_the_hook(tmp_path):
    run = seam("hooks", "capture", "claude-code", "--capture", str(tmp_path), stdin="not json")
    assert run.returncode == 0 and run.stdout == ""
    assert "seam hooks capture: JSONDecodeError" in run.stderr


def _lines_until(uuid: str) -> list[str]:
    lines = SESSION_FILE.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if json.loads(line)["uuid"] == uuid)
    return lines[: at + 1]


def test_the_reader_joins_captures_and_a_pruned_session_is_whole_again(tmp_path):
    from pipeline.cli.judge import iter_input_rollouts

    captures = tmp_path / "captures"
    for last, trigger, extra in (
        ("mc1", "auto", {}),
        ("a10", "manual", {"custom_instructions": "keep the PR number"}),
    ):
        transcript = tmp_path / f"live-{last}.jsonl"
        transcript.write_text("".join(_lines_until(last)))
        capture(hook_input(transcript, trigger=trigger, **extra), captures)
    # The session file was later pruned: its first eight records are gone.
    pruned = tmp_path / "sessions" / "pruned.jsonl"
    pruned.parent.mkdir()
    pruned.write_text("".join(SESSION_FILE.read_text().splitlines(keepends=True)[8:]))
    alone = list(iter_input_rollouts([str(pruned)], "auto", Counter()))
    assert "slice_start" in [e["reason"] for e in alone[0].meta.get("fidelity", [])]
    (rollout,) = iter_input_rollouts([str(pruned.parent), str(captures)], "auto", Counter())
    assert "slice_start" not in [e["reason"] for e in rollout.meta.get("fidelity", [])]
    assert rollout.calls()[0].id == "msg_01"  # the pruned start is back, from the snapshot
    boundaries = [e for e in rollout.events if isinstance(e, RewriteEvent) and "capture" in e.meta]
    assert [
        (e.id, e.meta["capture"].get("trigger"), e.meta["capture"].get("custom_instructions"))
        for e in boundaries
    ] == [
        ("cb1", "auto", None),
        ("cb2", "manual", "keep the PR number"),
    ]


class FakeAnthropic:
    """A Messages API on 127.0.0.1 answering every request with one text turn (streamed
    when asked), so the real Claude Code CLI runs offline."""

    SUMMARY = "<analysis>a</analysis>\n<summary>1. Primary Request: say hi.\n9. Optional Next Step: None</summary>"

    def __init__(self):
        import itertools
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        ids = itertools.count()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path.startswith("/v1/messages/count_tokens"):
                    return self._send("application/json", json.dumps({"input_tokens": 10}))
                last = json.dumps(body.get("messages", [])[-1:])
                text = FakeAnthropic.SUMMARY if "summary" in last.lower() else "hi"
                message = {
                    "id": f"msg_fake{next(ids)}",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model"),
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 10, "output_tokens": 1},
                }
                if not body.get("stream"):
                    done = {**message, "content": [{"type": "text", "text": text}]}
                    return self._send(
                        "application/json", json.dumps({**done, "stop_reason": "end_turn"})
                    )
                events = [
                    ("message_start", {"type": "message_start", "message": message}),
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": 0,
                            "content_block": {"type": "text", "text": ""},
                        },
                    ),
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": text},
                        },
                    ),
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    (
                        "message_delta",
                        {
                            "type": "message_delta",
                            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                            "usage": {"output_tokens": 5},
                        },
                    ),
                    ("message_stop", {"type": "message_stop"}),
                ]
                self._send(
                    "text/event-stream",
                    "".join(f"event: {n}\ndata: {json.dumps(d)}\n\n" for n, d in events),
                )

            def do_GET(self):
                self._send("application/json", "{}")

            def _send(self, kind, text):
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.skipif(
    not os.environ.get("SEAM_CLAUDE_CLI"),
    reason="set SEAM_CLAUDE_CLI to a Claude Code CLI (npm install @anthropic-ai/claude-code)",
)
def test_the_real_claude_cli_runs_the_installed_hooks_and_the_reader_joins_them(tmp_path):
    from pipeline.cli.judge import iter_input_rollouts

    cli = Path(os.environ["SEAM_CLAUDE_CLI"]).absolute()  # on PATH by this name
    server = FakeAnthropic()
    home, project, cap = tmp_path / "home", tmp_path / "home" / "proj", tmp_path / "cap"
    project.mkdir(parents=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{cli.parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": "sk-fake",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    try:
        run = seam("hooks", "install", "claude-code", "--capture", str(cap), env_extra=env)
        assert run.returncode == 0 and "PostCompact: added" in run.stdout, run.stdout + run.stderr
        for args in (
            ["hello"],
            ["--continue", "turn 1"],
            ["--continue", "turn 2"],
            ["--continue", "/compact keep the greeting"],
        ):
            done = subprocess.run(
                [str(cli), "-p", *args],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
    finally:
        server.close()
    (rollout,) = iter_input_rollouts(
        [str(home / ".claude" / "projects"), str(cap)], "auto", Counter()
    )
    (boundary,) = [e for e in rollout.events if isinstance(e, RewriteEvent)]
    captured = boundary.meta["capture"]
    assert (boundary.trigger, captured["trigger"], captured["custom_instructions"]) == (
        "manual",
        "manual",
        "keep the greeting",
    )
    assert captured["compact_summary"] == FakeAnthropic.SUMMARY  # PostCompact (2.1.76+)
