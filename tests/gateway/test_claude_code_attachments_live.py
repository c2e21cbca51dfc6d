"""The real Claude Code CLI, offline through ``seam gateway``: the context seam rebuilds
from the session file Claude Code wrote (attachments included: an ``@file`` mention, a
SessionStart hook's output, a prompt hook's context, the agent and skill listings) is
what the CLI sent to the gateway. This guards the captured fixtures
(tests/fixtures/claude_code_cli) against a change of the pinned CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from pipeline.readers import REGISTRY, Accepted
from schemas.replay import replay
from tests.gateway.builds import calls_of

pytestmark = pytest.mark.skipif(
    not os.environ.get("SEAM_CLAUDE_CLI"),
    reason="set SEAM_CLAUDE_CLI to a Claude Code CLI (npm install @anthropic-ai/claude-code)",
)

# Claude Code's currentDate context block: sent, never logged (like its system prompt).
NOT_LOGGED = re.compile(
    r"<system-reminder>\nAs you answer the user's questions.*?</system-reminder>", re.S
)
HOOKS = {
    "SessionStart": [{"hooks": [{"type": "command", "command": "echo start-context"}]}],
    "UserPromptSubmit": [
        {
            "hooks": [
                {
                    "type": "command",
                    "command": 'echo \'{"hookSpecificOutput":{"hookEventName":'
                    '"UserPromptSubmit","additionalContext":"prompt-context"}}\'',
                }
            ]
        }
    ],
}


def _turns(messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive messages of one role as one, whitespace and the unlogged block removed
    (the gateway joins an Anthropic message's blocks; seam keeps each attachment apart)."""
    out: list[tuple[str, str]] = []
    for role, text in messages:
        text = re.sub(r"\s+", "", NOT_LOGGED.sub("", text))
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + text)
        else:
            out.append((role, text))
    return out


def test_claude_code_attachments_through_the_gateway_are_the_context_seam_rebuilds(
    tmp_path, model_server, start_gateway
):
    gw = start_gateway(model_server.url)
    home, project = tmp_path / "home", tmp_path / "home" / "proj"
    (project / ".claude").mkdir(parents=True)
    (project / ".claude" / "settings.json").write_text(json.dumps({"hooks": HOOKS}))
    (project / "notes.md").write_text("first line\nsecond line\n")
    env = {
        **os.environ,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": gw.base("cc-task", "cc-att"),
        "ANTHROPIC_API_KEY": "sk-fake",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    model_server.script.append(" read")
    done = subprocess.run(
        [os.environ["SEAM_CLAUDE_CLI"], "-p", "summarize @notes.md", "--model", "tiny"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    calls = calls_of(gw.out / "calls" / "cc-att.jsonl")
    sent = [(m["role"], m.get("content") or "") for m in calls[-1]["request"]["messages"]]
    sent = [(r, c) for r, c in sent if not (r == "system" and c is sent[0][1])]  # system prompt
    (session,) = (home / ".claude" / "projects").glob("*/*.jsonl")
    (rollout,) = [
        i.rollout for i in REGISTRY["claude-code"].read(session) if isinstance(i, Accepted)
    ]
    seen = [(m.role, m.content) for m in replay(rollout)[-1].context]
    assert any("Result of calling the Read tool:\n1\tfirst line" in t for _, t in seen)
    assert _turns(seen) == _turns(sent)
