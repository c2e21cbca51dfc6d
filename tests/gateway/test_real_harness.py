"""A real harness through the gateway: mini-swe-agent (from PyPI) with its own model
client (litellm) and its own bash environment, against the tiny-model server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# litellm fetches a price list from the network on import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
minisweagent = pytest.importorskip("minisweagent")
yaml = pytest.importorskip("yaml")

from tests.gateway.builds import build_collection, calls_of, rewards_file, rows_of, trained_ids  # noqa: E402


def _call(command: str) -> str:
    body = json.dumps({"name": "bash", "arguments": {"command": command}})
    return f"<tool_call>\n{body}\n</tool_call>"


@pytest.mark.slow
def test_mini_swe_agent_session_through_the_gateway_trains_exactly_the_sampled_ids(
    tmp_path, model_server, start_gateway
):
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_model import LitellmModel

    gw = start_gateway(model_server.url)
    work = tmp_path / "repo"
    work.mkdir()
    (work / "bug.py").write_text("print('hello')\n")
    model_server.script.extend(
        [_call("ls"), _call("python bug.py"), _call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]
    )
    config = yaml.safe_load(
        (Path(minisweagent.__file__).parent / "config" / "mini.yaml").read_text()
    )
    model = LitellmModel(
        model_name="openai/tiny",
        model_kwargs={"api_base": gw.base("swe-task", "mini-1") + "/v1", "api_key": "none"},
        cost_tracking="ignore_errors",
    )
    agent = DefaultAgent(
        model, LocalEnvironment(cwd=str(work)), **{**config["agent"], "step_limit": 6}
    )
    agent.run(task="Run bug.py and report what it prints.")
    assert len(model_server.produced) == 3
    tool_outputs = [m["content"] for m in agent.messages if m.get("role") == "tool"]
    assert any("bug.py" in t for t in tool_outputs) and any("hello" in t for t in tool_outputs)

    out, result = build_collection(tmp_path, gw.out, rewards=rewards_file(tmp_path, "mini-1"))
    assert result.counts["accepted"] == 1
    rows = rows_of(out)
    assert len(rows) == 1 and rows[0]["task_id"] == "swe-task" and rows[0]["num_calls"] == 3
    trained = trained_ids(rows[0])
    assert trained == [t for p in model_server.produced for t in p.output_ids]
    # The tool outputs the harness sent are context the model saw, never trained.
    last = model_server.produced[-1]
    assert rows[0]["input_ids"] == last.prompt_ids + last.output_ids


@pytest.mark.skipif(
    not os.environ.get("SEAM_CLAUDE_CLI"),
    reason="set SEAM_CLAUDE_CLI to a Claude Code CLI (npm install @anthropic-ai/claude-code)",
)
def test_claude_code_through_the_gateway_tool_use_and_compaction_become_a_seam(
    tmp_path, model_server, start_gateway
):
    """The real Claude Code CLI, offline, with ANTHROPIC_BASE_URL on the gateway: a Bash tool
    call it executes, then /compact; the build has the compaction as a seam and trains
    exactly the sampled ids."""
    import subprocess

    gw = start_gateway(model_server.url)
    home, project = tmp_path / "home", tmp_path / "home" / "proj"
    project.mkdir(parents=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": gw.base("cc-task", "cc-1"),
        "ANTHROPIC_API_KEY": "sk-fake",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    bash = json.dumps(
        {"name": "Bash", "arguments": {"command": "echo seam-was-here", "description": "Say it"}}
    )
    model_server.script.extend(
        [f"<tool_call>\n{bash}\n</tool_call>", " done", " Summary: ran echo; next: nothing"]
    )
    for prompt, flags in (
        ("run echo", ["--allowedTools", "Bash"]),
        ("/compact", ["--continue"]),
        ("what next?", ["--continue"]),
    ):
        done = subprocess.run(
            [os.environ["SEAM_CLAUDE_CLI"], "-p", prompt, "--model", "tiny", *flags],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    calls = calls_of(gw.out / "calls" / "cc-1.jsonl")
    assert len(calls) == len(model_server.produced) == 4
    tool_results = [m for m in calls[1]["request"]["messages"] if m["role"] == "tool"]
    assert "seam-was-here" in tool_results[0]["content"]  # Claude Code ran the command
    assert calls[1]["seam"]["extends_previous"] is True
    # Claude Code (2.1) leaves the previous turn's final text out of its /compact request,
    # so the summary call's context is a rewrite too (seen on the real CLI; seam cuts there).
    assert calls[2]["seam"].get("kind") == "summary"
    assert calls[2]["seam"]["extends_previous"] is False
    assert calls[3]["seam"]["extends_previous"] is False

    out, result = build_collection(tmp_path, gw.out, rewards=rewards_file(tmp_path, "cc-1"))
    assert result.counts["accepted"] == 1
    rows = rows_of(out)
    assert [r["seam_kind"] for r in rows] == ["none", "edit", "compaction"]
    trained = [t for r in rows for t in trained_ids(r)]
    assert trained == [t for p in model_server.produced for t in p.output_ids]
