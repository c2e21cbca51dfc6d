"""seam gateway: token-exact collection through real clients, a compaction that becomes a
seam, the Judge in the loop, rewards, and crash safety."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import requests
from aiohttp import web

from tests.gateway.builds import build_collection, calls_of, rewards_file, rows_of, trained_ids
from tests.gateway.serving import ThreadedApp

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

SYSTEM = "You are a coding agent."
SUMMARY_PROMPT = "Your task is to create a detailed summary of the conversation so far."


def _chat(client, messages, **kw):
    reply = client.chat.completions.create(model="tiny", messages=messages, **kw)
    return reply.choices[0].message


def _session_with_compaction(client) -> list[str]:
    """Two action calls, a summary call, then a call on the compacted context."""
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the bug."}]
    texts = []
    for follow_up in ("Go on.", SUMMARY_PROMPT):
        msg = _chat(client, history)
        texts.append(msg.content)
        history += [
            {"role": "assistant", "content": msg.content},
            {"role": "user", "content": follow_up},
        ]
    summary = _chat(client, history).content
    texts.append(summary)
    compacted = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Summary of the work so far:{summary}\nContinue."},
    ]
    texts.append(_chat(client, compacted).content)
    return texts


def test_openai_session_is_recorded_token_exact_and_its_compaction_is_a_seam(
    tmp_path, model_server, start_gateway
):
    gw = start_gateway(model_server.url)
    client = openai.OpenAI(base_url=gw.base("task-1", "run-a") + "/v1", api_key="none")
    texts = _session_with_compaction(client)
    assert texts == [p.text for p in model_server.produced]
    requests.post(gw.base("task-1", "run-a") + "/reward", json={"reward": 1.0})

    calls = calls_of(gw.out / "calls" / "run-a.jsonl")
    assert len(calls) == 4
    assert [c["seam"]["extends_previous"] for c in calls] == [None, True, True, False]
    assert [c["seam"].get("kind") for c in calls] == [None, None, "summary", None]
    for call, produced in zip(calls, model_server.produced):
        assert call["response"]["prompt_token_ids"] == produced.prompt_ids
        assert call["response"]["choices"][0]["token_ids"] == produced.output_ids
    gw.recorder.write_manifest()  # kept current within a second; now, for the test
    manifest = json.loads((gw.out / "gateway.json").read_text())
    assert manifest["calls"] == 4 and manifest["token_ids"] == "all"

    out, result = build_collection(tmp_path, gw.out, rewards=str(gw.out / "rewards.jsonl"))
    assert result.counts["accepted"] == 1 and result.counts["quarantined"] == 0
    rows = rows_of(out)
    assert [r["seam_kind"] for r in rows] == ["none", "compaction"]
    assert [r["reward"] for r in rows] == [1.0, 1.0] and rows[0]["task_id"] == "task-1"
    produced = model_server.produced
    # Segment 1 trains exactly the three sampled outputs; segment 2 the fourth.
    assert (
        trained_ids(rows[0])
        == produced[0].output_ids + produced[1].output_ids + produced[2].output_ids
    )
    assert trained_ids(rows[1]) == produced[3].output_ids
    assert rows[1]["input_ids"] == produced[3].prompt_ids + produced[3].output_ids


def test_the_harness_gets_only_the_fields_it_asked_for(model_server, start_gateway):
    gw = start_gateway(model_server.url)
    raw = requests.post(
        gw.base("t", "r") + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    ).json()
    assert "prompt_token_ids" not in raw and "token_ids" not in raw["choices"][0]
    assert "logprobs" not in raw["choices"][0]
    recorded = calls_of(gw.out / "calls" / "r.jsonl")[0]
    assert recorded["response"]["choices"][0]["logprobs"]["content"]


def test_openai_streaming_replays_the_whole_answer(model_server, start_gateway):
    gw = start_gateway(model_server.url)
    client = openai.OpenAI(base_url=gw.base("t", "stream") + "/v1", api_key="none")
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == model_server.produced[-1].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(
        model_server.produced[-1].output_ids
    )


def test_anthropic_client_with_tools_streaming_and_not(tmp_path, model_server, start_gateway):
    gw = start_gateway(model_server.url)
    client = anthropic.Anthropic(base_url=gw.base("t", "claude"), api_key="none")
    tools = [
        {
            "name": "bash",
            "description": "Run a command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]
    call = json.dumps({"name": "bash", "arguments": {"command": "pytest -x"}})
    model_server.script.append(f"<tool_call>\n{call}\n</tool_call>")
    first = client.messages.create(
        model="tiny",
        max_tokens=16,
        system=SYSTEM,
        tools=tools,
        messages=[{"role": "user", "content": "Run the tests."}],
    )
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "bash" and use.input == {"command": "pytest -x"}
    messages = [
        {"role": "user", "content": "Run the tests."},
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "1 failed"}],
        },
    ]
    with client.messages.stream(
        model="tiny", max_tokens=16, system=SYSTEM, tools=tools, messages=messages
    ) as stream:
        streamed = stream.get_final_message()
    assert "".join(b.text for b in streamed.content if b.type == "text") == (
        model_server.produced[-1].text
    )
    calls = calls_of(gw.out / "calls" / "claude.jsonl")
    assert calls[1]["seam"] == {
        **calls[1]["seam"],
        "dialect": "anthropic",
        "extends_previous": True,
    }
    sent = calls[1]["request"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[3] == {"role": "tool", "tool_call_id": use.id, "content": "1 failed"}

    out, result = build_collection(tmp_path, gw.out, rewards=rewards_file(tmp_path, "claude"))
    rows = rows_of(out)
    assert len(rows) == 1 and rows[0]["num_calls"] == 2
    produced = model_server.produced
    assert trained_ids(rows[0]) == produced[0].output_ids + produced[1].output_ids


def test_an_engine_without_token_ids_is_recorded_as_text_and_the_manifest_says_so(
    tmp_path, tiny_model_dir, start_gateway
):
    from tests.gateway.model_server import ModelServer

    server = ModelServer(str(tiny_model_dir), reject_token_id_params=True).start()
    try:
        gw = start_gateway(server.url)
        client = openai.OpenAI(base_url=gw.base("t", "text") + "/v1", api_key="none")
        _chat(client, [{"role": "user", "content": "hi"}])
        gw.recorder.write_manifest()
        manifest = json.loads((gw.out / "gateway.json").read_text())
        assert manifest["token_ids"] == "none"
        assert manifest["token_id_params"] == "rejected by the upstream"
        out, result = build_collection(tmp_path, gw.out, rewards=rewards_file(tmp_path, "text"))
        assert result.counts["accepted"] == 1
    finally:
        server.stop()


class _Judge:
    """An HTTP judge on 127.0.0.1: corrects summary calls, or misbehaves on request."""

    def __init__(self, mode: str):
        self.mode, self.seen = mode, []
        app = web.Application()
        app.router.add_post("/judge", self._handle)
        self.url = ThreadedApp(app).url + "/judge"

    async def _handle(self, request):
        body = await request.json()
        self.seen.append(body)
        if self.mode == "slow":
            await asyncio.sleep(3)
        if self.mode == "broken":
            return web.Response(status=500, text="boom")
        kinds = [e.get("kind") for e in body["rollout"]["events"] if e.get("role") == "assistant"]
        if kinds[body["call_index"]] != "summary":
            return web.json_response({"correction": None})
        return web.json_response(
            {
                "correction": {
                    "type": "state",
                    "verdict": "omission",
                    "replacement": "Summary: tests in tests/test_x.py fail; next: fix parse().",
                    "rationale": "the summary dropped the failing test",
                    "judge_model": "test-judge",
                }
            }
        )


def test_the_judge_replaces_a_summary_before_the_harness_sees_it(
    tmp_path, model_server, start_gateway
):
    from pipeline.gateway.judging import HttpJudge
    from pipeline.sft.filters import FilterOptions
    from pipeline.sft.stage import SftStage

    judge = _Judge("correct")
    gw = start_gateway(model_server.url, lambda client: HttpJudge(judge.url, client, 5.0))
    client = openai.OpenAI(base_url=gw.base("task-j", "judged") + "/v1", api_key="none")
    texts = _session_with_compaction(client)
    replacement = "Summary: tests in tests/test_x.py fail; next: fix parse()."
    assert texts[2] == replacement  # the harness received the judge's replacement
    assert texts[2] != model_server.produced[2].text
    corrections = [json.loads(x) for x in (gw.out / "corrections.jsonl").read_text().splitlines()]
    assert len(corrections) == 1
    c = corrections[0]
    assert (c["rollout_id"], c["call_index"], c["type"], c["verdict"]) == (
        "judged",
        2,
        "state",
        "omission",
    )
    assert c["original"] == model_server.produced[2].text and c["replacement"] == replacement
    calls = calls_of(gw.out / "calls" / "judged.jsonl")
    assert calls[2]["response"]["choices"][0]["message"]["content"] == replacement
    assert calls[2]["seam"]["correction"]["original_response"]["choices"][0]["token_ids"]

    out, result = build_collection(
        tmp_path,
        gw.out,
        name="sft",
        kind="sft",
        rewards=rewards_file(tmp_path, "judged"),
        stage=SftStage(str(gw.out / "corrections.jsonl"), FilterOptions()),
    )
    assert result.counts["accepted"] == 1
    attached = duckdb.sql(
        f"SELECT c.verdict, c.replacement FROM (SELECT unnest(corrections) AS c "
        f"FROM '{out}/train-*.parquet')"
    ).fetchall()
    assert attached == [("omission", replacement)]


@pytest.mark.parametrize("mode", ["slow", "broken"])
def test_a_failing_judge_lets_the_original_through_and_says_why(mode, model_server, start_gateway):
    from pipeline.gateway.judging import HttpJudge

    judge = _Judge(mode)
    gw = start_gateway(model_server.url, lambda client: HttpJudge(judge.url, client, 1.0))
    client = openai.OpenAI(base_url=gw.base("t", "r") + "/v1", api_key="none")
    msg = _chat(client, [{"role": "user", "content": "hi"}])
    assert msg.content == model_server.produced[-1].text
    call = calls_of(gw.out / "calls" / "r.jsonl")[0]
    assert ("timed out" if mode == "slow" else "HTTP 500") in call["seam"]["judge"]["error"]
    assert not (gw.out / "corrections.jsonl").exists()


def test_the_rule_judge_reviews_every_call(model_server, start_gateway):
    from judge.loop_judge import RuleJudge

    gw = start_gateway(model_server.url, lambda client: RuleJudge())
    client = openai.OpenAI(base_url=gw.base("t", "rules") + "/v1", api_key="none")
    _session_with_compaction(client)
    calls = calls_of(gw.out / "calls" / "rules.jsonl")
    from judge.rules import RULE_JUDGE

    assert [c["seam"]["judge"]["name"] for c in calls] == [RULE_JUDGE] * 4
    # The tiny model's summary keeps no next step: the rule judge says so on that call.
    verdicts = [f["verdict"] for f in calls[2]["seam"]["judge"]["findings"]]
    assert "missing_next_step" in verdicts


def test_sessions_need_an_id_and_a_safe_one(model_server, start_gateway):
    gw = start_gateway(model_server.url)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    plain = requests.post(gw.url + "/v1/chat/completions", json=body)
    assert plain.status_code == 400 and "/s/TASK_ID/ROLLOUT_ID" in plain.json()["error"]["message"]
    evil = requests.post(
        gw.url + "/v1/chat/completions",
        json=body,
        headers={"X-Seam-Rollout-Id": "../../etc/x", "X-Seam-Task-Id": "t"},
    )
    assert evil.status_code == 400 and not (gw.out.parent / "etc").exists()
    ok = requests.post(
        gw.url + "/v1/chat/completions",
        json=body,
        headers={"X-Seam-Rollout-Id": "by-header", "X-Seam-Task-Id": "t"},
    )
    assert ok.status_code == 200 and (gw.out / "calls" / "by-header.jsonl").exists()


def test_a_second_gateway_on_the_same_out_is_refused(tmp_path, model_server, start_gateway):
    from pipeline.gateway.recorder import Recorder, RecorderError

    gw = start_gateway(model_server.url)
    with pytest.raises(RecorderError, match="another seam gateway"):
        Recorder(gw.out, {})


def test_kill_9_loses_no_completed_call(tmp_path, model_server):
    """Every --durability mode writes a call's line before answering it: a killed gateway
    keeps every answered call (what the modes differ in, an OS crash, a kill cannot show).
    One gateway process per mode, started together (a start costs seconds here)."""
    modes = ("group", "sync", "none")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = {
        mode: subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "gateway", "--upstream", model_server.url]
            + ["--out", str(tmp_path / mode), "--port", "0", "--durability", mode],
            env=env,
            stderr=subprocess.PIPE,
        )
        for mode in modes
    }
    produced: dict[str, list] = {}
    try:
        for mode in modes:
            manifest = tmp_path / mode / "gateway.json"
            deadline = time.time() + 60
            while time.time() < deadline:
                if manifest.exists() and "listening" in json.loads(manifest.read_text()):
                    break
                time.sleep(0.1)
            url = json.loads(manifest.read_text())["listening"]
            client = openai.OpenAI(base_url=f"{url}/s/t/crash/v1", api_key="none")
            history = [{"role": "user", "content": "go"}]
            before = len(model_server.produced)
            for _ in range(3):
                msg = _chat(client, history)
                history += [
                    {"role": "assistant", "content": msg.content},
                    {"role": "user", "content": "more"},
                ]
            produced[mode] = model_server.produced[before:]
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    for mode in modes:
        out = tmp_path / mode
        # A call cut mid-write by the kill: one torn line at the end of the log.
        with open(out / "calls" / "crash.jsonl", "a") as fh:
            fh.write('{"session_id": "crash", "request": {"messa')
        built, result = build_collection(
            tmp_path, out, name=f"rl-{mode}", rewards=rewards_file(tmp_path, "crash")
        )
        assert result.counts["accepted"] == 1 and result.counts["quarantined"] == 1, mode
        rows = rows_of(built)
        assert sum(r["num_calls"] for r in rows) == 3
        trained = [t for r in rows for t in trained_ids(r)]
        assert trained == [t for p in produced[mode] for t in p.output_ids], mode


def test_a_restarted_gateway_continues_its_sessions(tmp_path, model_server, start_gateway):
    first = start_gateway(model_server.url)
    client = openai.OpenAI(base_url=first.base("t", "long") + "/v1", api_key="none")
    history = [{"role": "user", "content": "go"}]
    msg = _chat(client, history)
    first.stop()
    second = start_gateway(model_server.url)  # same --out
    client = openai.OpenAI(base_url=second.base("t", "long") + "/v1", api_key="none")
    history += [{"role": "assistant", "content": msg.content}, {"role": "user", "content": "more"}]
    _chat(client, history)
    calls = calls_of(second.out / "calls" / "long.jsonl")
    assert [c["seam"]["extends_previous"] for c in calls] == [None, True]
    assert [c["seam"]["call"] for c in calls] == [1, 2]
    # The restarted gateway read call 1 back and stored call 2 as a delta to it.
    raw = (second.out / "calls" / "long.jsonl").read_bytes().splitlines()
    assert json.loads(raw[1])["request_delta"]["base"] == 1
    out, result = build_collection(tmp_path, second.out, rewards=rewards_file(tmp_path, "long"))
    rows = rows_of(out)
    assert len(rows) == 1 and rows[0]["num_calls"] == 2


def test_responses_api_client_with_function_calls_streaming_and_not(
    tmp_path, model_server, start_gateway
):
    """Codex's dialect: OpenAI Responses, function tools, streamed and not."""
    gw = start_gateway(model_server.url)
    client = openai.OpenAI(base_url=gw.base("t", "codex") + "/v1", api_key="none")
    tools = [
        {
            "type": "function",
            "name": "shell",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]
    call = json.dumps({"name": "shell", "arguments": {"command": "ls"}})
    model_server.script.append(f"<tool_call>\n{call}\n</tool_call>")
    first = client.responses.create(
        model="tiny", instructions=SYSTEM, input="List the files.", tools=tools
    )
    fc = next(o for o in first.output if o.type == "function_call")
    assert (fc.name, json.loads(fc.arguments)) == ("shell", {"command": "ls"})
    follow = [
        {"type": "message", "role": "user", "content": "List the files."},
        {
            "type": "function_call",
            "call_id": fc.call_id,
            "name": fc.name,
            "arguments": fc.arguments,
        },
        {"type": "function_call_output", "call_id": fc.call_id, "output": "bug.py"},
    ]
    events = list(
        client.responses.create(
            model="tiny", instructions=SYSTEM, input=follow, tools=tools, stream=True
        )
    )
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.output_text == model_server.produced[-1].text
    calls = calls_of(gw.out / "calls" / "codex.jsonl")
    assert calls[1]["seam"]["extends_previous"] is True
    assert [m["role"] for m in calls[1]["request"]["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    out, result = build_collection(tmp_path, gw.out, rewards=rewards_file(tmp_path, "codex"))
    rows = rows_of(out)
    assert len(rows) == 1
    produced = model_server.produced
    assert trained_ids(rows[0]) == produced[0].output_ids + produced[1].output_ids


def test_responses_items_the_gateway_cannot_translate_are_refused_with_the_reason(
    model_server, start_gateway
):
    gw = start_gateway(model_server.url)
    reply = requests.post(
        gw.base("t", "r") + "/v1/responses",
        json={"model": "tiny", "input": [{"type": "web_search_call", "id": "ws_1"}]},
    )
    assert reply.status_code == 400
    assert "web_search_call" in reply.json()["error"]["message"]
    assert not (gw.out / "calls" / "r.jsonl").exists()
