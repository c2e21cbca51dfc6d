"""Incremental streaming (pipeline/gateway/streaming.py): chunks reach the harness as the
engine produces them, through the real openai and anthropic SDKs; the call is recorded
when the stream completes, with the same record an unstreamed call gets; an engine
error mid-stream is an error event with nothing recorded; a harness that leaves
mid-stream gets its call recorded as undelivered."""

from __future__ import annotations

import asyncio
import threading
import time

import orjson
import pytest
import requests
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.engine_stub import make_app, stream_chunks
from pipeline.gateway.streaming import Assembler
from tests.gateway.builds import build_collection, calls_of, rewards_file, rows_of
from tests.gateway.serving import ThreadedApp

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

TIMING = ("upstream_ms", "gateway_ms")
HI = [{"role": "user", "content": "hi"}]


class Gate:
    """Holds a streamed answer after its first chunk until the test releases it."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def __call__(self) -> None:
        await asyncio.to_thread(self.release.wait, 30)


@pytest.fixture(scope="module")
def engine():
    served = ThreadedApp(make_app())
    yield served.url + "/v1"
    served.stop()


def _engine(**options) -> ThreadedApp:
    return ThreadedApp(make_app(**options))


def _comparable(log) -> list[bytes]:
    """A call log's lines as bytes, without the timing fields and the ``stream`` flag."""
    out = []
    for line in log.read_bytes().splitlines():
        record = orjson.loads(line)
        for key in (*TIMING, "stream"):
            record["seam"].pop(key, None)
        out.append(orjson.dumps(record))
    return out


def _openai_text(client, stream: bool, messages) -> str:
    if not stream:
        return (
            client.chat.completions.create(model="stub", messages=messages)
            .choices[0]
            .message.content
        )
    chunks = client.chat.completions.create(model="stub", messages=messages, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _anthropic_text(client, stream: bool, messages) -> str:
    if not stream:
        reply = client.messages.create(model="stub", max_tokens=64, messages=messages)
    else:
        with client.messages.stream(model="stub", max_tokens=64, messages=messages) as events:
            reply = events.get_final_message()
    return "".join(b.text for b in reply.content if b.type == "text")


def _responses_text(client, stream: bool, messages) -> str:
    items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in messages]
    if not stream:
        return client.responses.create(model="stub", input=items).output_text
    final = None
    for event in client.responses.create(model="stub", input=items, stream=True):
        if event.type == "response.completed":
            final = event.response
    assert final is not None
    return final.output_text


def _client(dialect: str, base: str):
    if dialect == "anthropic":
        return anthropic.Anthropic(base_url=base, api_key="none")
    return openai.OpenAI(base_url=base + "/v1", api_key="none")


TEXT_OF = {"openai": _openai_text, "anthropic": _anthropic_text, "responses": _responses_text}


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_a_streamed_call_is_recorded_as_an_unstreamed_one(dialect, engine, start_gateway):
    """Same engine answer, streamed or not: the same text for the harness and the same
    record bytes (a full record, then a delta record), but for timing and the flag."""
    texts, logs = {}, {}
    for stream in (False, True):
        gw = start_gateway(engine, name=f"collect-{stream}")
        logs[stream] = gw.out / "calls" / "s.jsonl"
        client = _client(dialect, gw.base("t", "s"))
        history = list(HI)
        for follow_up in ("go on", "and then"):
            text = TEXT_OF[dialect](client, stream, history)
            history += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": follow_up},
            ]
        texts[stream] = history
    assert texts[True] == texts[False] and texts[True][1]["content"] == "word " * 64
    plain, streamed = (_comparable(logs[s]) for s in (False, True))
    assert plain == streamed and len(plain) == 2
    records = calls_of(logs[True])
    assert [r["seam"]["stream"] for r in records] == [True, True]
    assert records[1]["seam"]["extends_previous"] is True
    assert records[0]["response"]["choices"][0]["token_ids"] == list(range(1000, 1064))


def test_streamed_and_unstreamed_sessions_build_the_same_rows(
    tmp_path, model_server, start_gateway
):
    """The tiny model's real ids and logprobs, streamed chunk by chunk, build the rows an
    unstreamed session builds (the model is greedy: both sessions sample the same)."""
    outs = {}
    for stream in (False, True):
        gw = start_gateway(model_server.url, name=f"collect-{stream}")
        client = openai.OpenAI(base_url=gw.base("task", "run") + "/v1", api_key="none")
        history = [{"role": "user", "content": "Fix the bug."}]
        for follow_up in ("Go on.", "Done?"):
            history += [
                {"role": "assistant", "content": _openai_text(client, stream, history)},
                {"role": "user", "content": follow_up},
            ]
        out, result = build_collection(
            tmp_path, gw.out, name=f"rows-{stream}", rewards=rewards_file(tmp_path, "run")
        )
        assert result.counts["accepted"] == 1
        outs[stream] = rows_of(out)
    assert outs[True] == outs[False]
    assert model_server.produced[0].output_ids == model_server.produced[2].output_ids


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_the_first_chunk_arrives_before_the_engine_produces_the_rest(dialect, start_gateway):
    """The engine holds everything after its first chunk until the harness has seen an
    event: a gateway that waited for the whole answer would never get there."""
    gate = Gate()
    served = _engine(after_first=gate)
    try:
        gw = start_gateway(served.url + "/v1")
        client = _client(dialect, gw.base("t", "ttft"))
        if dialect == "openai":
            events = iter(client.chat.completions.create(model="stub", messages=HI, stream=True))
        elif dialect == "anthropic":
            events = iter(
                client.messages.create(model="stub", max_tokens=8, messages=HI, stream=True)
            )
        else:
            events = iter(client.responses.create(model="stub", input="hi", stream=True))
        first = next(events)  # arrives while the engine still holds the rest
        assert not gate.release.is_set() and not (gw.out / "calls" / "ttft.jsonl").exists()
        gate.release.set()
        rest = list(events)
        assert first is not None and len(rest) > 5
        assert calls_of(gw.out / "calls" / "ttft.jsonl")[0]["seam"]["stream"] is True
    finally:
        gate.release.set()
        served.stop()


def test_a_harness_that_leaves_mid_stream_gets_its_call_recorded_undelivered(start_gateway):
    gate = Gate()
    served = _engine(after_first=gate)
    try:
        gw = start_gateway(served.url + "/v1")
        body = {"model": "stub", "messages": HI, "stream": True}
        url = gw.base("t", "left") + "/v1/chat/completions"
        with requests.post(url, json=body, stream=True, timeout=30) as resp:
            assert next(resp.iter_lines()).startswith(b"data: ")
        # The connection is closed; the engine goes on and the gateway reads it to the end.
        gate.release.set()
        log = gw.out / "calls" / "left.jsonl"
        for _ in range(100):
            if log.exists():
                break
            time.sleep(0.05)
        (call,) = calls_of(log)
        assert call["seam"]["delivered"] is False
        assert call["response"]["choices"][0]["message"]["content"] == "word " * 64
        # The retry is the session's first delivered call, not a rewrite of the lost one.
        again = requests.post(url, json={**body, "stream": False}, timeout=30)
        assert again.status_code == 200
        assert calls_of(log)[1]["seam"]["extends_previous"] is None
    finally:
        gate.release.set()
        served.stop()


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_an_engine_error_mid_stream_is_an_error_event_and_nothing_is_recorded(
    dialect, start_gateway
):
    served = _engine(fail_after=3)
    try:
        gw = start_gateway(served.url + "/v1")
        client = _client(dialect, gw.base("t", "broken"))
        if dialect == "responses":  # the SDK hands a failure over as an event
            events = list(client.responses.create(model="stub", input="hi", stream=True))
            assert events[-1].type == "response.failed"
            assert "failed mid-stream" in events[-1].response.error.message
        else:
            with pytest.raises((openai.APIError, anthropic.APIError), match="failed mid-stream"):
                TEXT_OF[dialect](client, True, HI)
        assert not (gw.out / "calls" / "broken.jsonl").exists()
        assert requests.get(gw.url + "/healthz").json()["errors"] == 1
    finally:
        served.stop()


def test_an_engine_that_cuts_the_stream_is_an_error_event(start_gateway):
    async def cut(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = stream_chunks(
            {"id": "x", "model": "m", "choices": [{"message": {"content": "ab"}}]}
        )[1]
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        request.transport.close()  # the engine dies mid-answer
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", cut)
    served = ThreadedApp(app)
    try:
        gw = start_gateway(served.url + "/v1")
        body = {"model": "m", "messages": HI, "stream": True}
        text = requests.post(gw.base("t", "cut") + "/v1/chat/completions", json=body).text
        *_, last = [line for line in text.splitlines() if line]
        assert (
            "the engine's stream failed"
            in orjson.loads(last.removeprefix("data: "))["error"]["message"]
        )
        assert "[DONE]" not in text and not (gw.out / "calls" / "cut.jsonl").exists()
    finally:
        served.stop()


def test_the_harness_gets_only_the_stream_fields_it_asked_for(engine, start_gateway):
    gw = start_gateway(engine)
    url = gw.base("t", "fields") + "/v1/chat/completions"

    def chunks(**extra) -> list[dict]:
        body = {"model": "stub", "messages": HI, "stream": True, **extra}
        lines = requests.post(url, json=body).text.split("\n\n")
        assert lines[-2] == "data: [DONE]"
        return [orjson.loads(line.removeprefix("data: ")) for line in lines[:-2]]

    plain = chunks()
    assert all("prompt_token_ids" not in c and "usage" not in c for c in plain)
    assert all(
        "token_ids" not in c["choices"][0] and "logprobs" not in c["choices"][0] for c in plain
    )
    asked = chunks(return_token_ids=True, logprobs=True, stream_options={"include_usage": True})
    assert asked[0]["prompt_token_ids"] == list(range(100))
    assert sum((c["choices"][0].get("token_ids") or [] for c in asked if c["choices"]), []) == list(
        range(1000, 1064)
    )
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == 64
    recorded = calls_of(gw.out / "calls" / "fields.jsonl")
    assert recorded[0] == {**recorded[0], "request": {"model": "stub", "messages": HI}}


def test_an_engine_that_does_not_stream_is_replayed(start_gateway):
    async def whole(request: web.Request) -> web.Response:
        body = await request.json()
        body.pop("stream")  # this engine ignores it
        from bench.engine_stub import answer

        return web.json_response(answer(body))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", whole)
    served = ThreadedApp(app)
    try:
        gw = start_gateway(served.url + "/v1")
        client = openai.OpenAI(base_url=gw.base("t", "whole") + "/v1", api_key="none")
        assert _openai_text(client, True, HI) == "word " * 64
        (call,) = calls_of(gw.out / "calls" / "whole.jsonl")
        assert call["response"]["choices"][0]["token_ids"] == list(range(1000, 1064))
    finally:
        served.stop()


def test_with_a_judge_the_answer_is_buffered(start_gateway):
    """A Judge may rewrite the answer, so the engine is asked for it whole."""
    from judge.loop_judge import RuleJudge

    seen: list[dict] = []
    served = _engine(seen=seen)
    try:
        gw = start_gateway(served.url + "/v1", lambda client: RuleJudge())
        client = openai.OpenAI(base_url=gw.base("t", "judged") + "/v1", api_key="none")
        assert _openai_text(client, True, HI) == "word " * 64
        assert [b.get("stream") for b in seen] == [None]
    finally:
        served.stop()


_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@st.composite
def _answers(draw) -> dict:
    message: dict = {"role": "assistant"}
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": draw(st.sampled_from(["bash", "edit"])), "arguments": draw(_text)},
        }
        for i in range(draw(st.integers(0, 3)))
    ]
    text = draw(_text)
    message["content"] = text if text or not calls else None
    if draw(st.booleans()):
        message[draw(st.sampled_from(["reasoning_content", "reasoning"]))] = draw(
            _text.filter(bool)
        )
    if calls:
        message["tool_calls"] = calls
    n = draw(st.integers(0, 30))
    choice: dict = {
        "index": 0,
        "message": message,
        "finish_reason": draw(st.sampled_from(["stop", "length", "tool_calls"])),
    }
    if draw(st.booleans()):
        choice["token_ids"] = list(range(n))
        choice["logprobs"] = {"content": [{"token": str(i), "logprob": -i / 7} for i in range(n)]}
    out: dict = {"id": "chatcmpl-x", "object": "chat.completion", "created": 5, "model": "m"}
    out["choices"] = [choice]
    out["usage"] = {"prompt_tokens": 3, "completion_tokens": n}
    if "token_ids" in choice:
        out["prompt_token_ids"] = [7, 8, 9]
    return out


@settings(max_examples=60, deadline=None)
@given(_answers(), st.integers(1, 9))
def test_the_assembled_stream_is_the_whole_answer(whole, pieces):
    """Any answer, cut into any number of chunks the way vLLM streams it, assembles back
    to the engine's unstreamed answer: the same keys in the same order."""
    assembler = Assembler()
    for chunk in stream_chunks(whole, include_usage=True, pieces=pieces):
        assembler.add(orjson.loads(orjson.dumps(chunk)))
    assert assembler.finished
    assert orjson.dumps(assembler.response()) == orjson.dumps(whole)


THINKING_AND_TOOLS = {
    "id": "chatcmpl-tools",
    "object": "chat.completion",
    "created": 5,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Let me look.",
                "reasoning_content": "The test fails; read it first.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "pytest -x"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "edit", "arguments": "not json"},
                    },
                ],
            },
            "finish_reason": "tool_calls",
            "token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9],
        }
    ],
    "usage": {"prompt_tokens": 11, "completion_tokens": 9},
    "prompt_token_ids": list(range(11)),
}


@pytest.fixture(scope="module")
def scripted():
    """An engine that answers every call with THINKING_AND_TOOLS, streamed or whole."""
    from bench.engine_stub import write_stream

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):
            return await write_stream(request, stream_chunks(THINKING_AND_TOOLS, pieces=3))
        return web.json_response(THINKING_AND_TOOLS)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    served = ThreadedApp(app)
    yield served.url + "/v1"
    served.stop()


def test_thinking_and_tool_calls_stream_as_they_are_answered_whole(scripted, start_gateway):
    """Anthropic thinking, text and tool_use blocks (a malformed input as _raw_arguments)
    and Responses reasoning, message and function_call items: streamed, the SDKs assemble
    what they get unstreamed; the records are equal."""
    gw = start_gateway(scripted)
    claude = anthropic.Anthropic(base_url=gw.base("t", "claude"), api_key="none")
    kw = {"model": "m", "max_tokens": 64, "messages": HI}
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as events:
        streamed = events.get_final_message()
    assert [b.type for b in streamed.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert streamed.content[3].input == {"_raw_arguments": "not json"}
    assert streamed.model_dump() == whole.model_dump()

    codex = openai.OpenAI(base_url=gw.base("t", "codex") + "/v1", api_key="none")
    whole_r = codex.responses.create(model="m", input="hi")
    events = list(codex.responses.create(model="m", input="hi", stream=True))
    final = events[-1].response
    assert [i.type for i in final.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    assert final.model_dump(exclude={"created_at"}) == whole_r.model_dump(exclude={"created_at"})
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == '{"command": "pytest -x"}not json'

    for rollout in ("claude", "codex"):  # whole (the first call) and streamed (the second)
        first, second = calls_of(gw.out / "calls" / f"{rollout}.jsonl")
        for call in (first, second):
            for key in (*TIMING, "stream", "call", "extends_previous"):
                call["seam"].pop(key)
        assert first == second


def test_sync_sends_the_last_event_only_after_the_record_is_fsynced(engine, start_gateway):
    """--durability sync: every chunk may reach the harness, but not the stream's end."""
    from tests.gateway.test_gateway_durability import Fsyncs

    fsyncs = Fsyncs(hold=True)
    gw = start_gateway(engine, recorder_options={"durability": "sync", "fsync": fsyncs})
    body = {"model": "stub", "messages": HI, "stream": True}
    url = gw.base("t", "sync") + "/v1/chat/completions"
    seen: list[bytes] = []

    def read() -> None:
        with requests.post(url, json=body, stream=True, timeout=30) as resp:
            seen.extend(line for line in resp.iter_lines() if line)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert fsyncs.started.wait(30)
        time.sleep(0.3)
        # The record is written and its fsync held: the chunks are through, not the end.
        assert len(seen) >= 9 and b"data: [DONE]" not in seen and not fsyncs.done
    finally:
        fsyncs.release.set()
        reader.join(30)
    assert seen[-1] == b"data: [DONE]" and fsyncs.done


def test_a_streamed_answer_over_the_size_cap_is_an_error_event(engine, start_gateway):
    gw = start_gateway(engine, max_response_bytes=4000)  # the stub's stream is ~5 KB
    body = {"model": "stub", "messages": HI, "stream": True}
    text = requests.post(gw.base("t", "big") + "/v1/chat/completions", json=body).text
    *_, last = [line for line in text.splitlines() if line]
    assert "over 4,000 bytes" in orjson.loads(last.removeprefix("data: "))["error"]["message"]
    assert not (gw.out / "calls" / "big.jsonl").exists()


def test_a_streamed_call_to_an_engine_without_token_ids_is_asked_again_without_them(
    start_gateway,
):
    from bench.engine_stub import answer, write_stream

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "return_token_ids" in body:
            return web.json_response(
                {"error": {"message": "unknown: return_token_ids"}}, status=400
            )
        return await write_stream(request, stream_chunks(answer(body)))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    served = ThreadedApp(app)
    try:
        gw = start_gateway(served.url + "/v1")
        client = openai.OpenAI(base_url=gw.base("t", "text") + "/v1", api_key="none")
        assert _openai_text(client, True, HI) == "word " * 64
        (call,) = calls_of(gw.out / "calls" / "text.jsonl")
        assert "token_ids" not in call["response"]["choices"][0]
        assert gw.recorder.manifest["token_id_params_rejected"] == ["stub"]
    finally:
        served.stop()


class _Pieces:
    """An aiohttp StreamReader's ``iter_any`` over given pieces."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def iter_any(self):
        for piece in self.pieces:
            yield piece


SSE = (
    b': a comment\r\ndata: {"a": 1}\r\n\r\n'
    b'event: x\ndata: {"b":\ndata: 2}\n\n'
    b"data:" + b"[" + b"7," * 5000 + b"7]\n\n"
    b"data: [DONE]"
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(SSE)), max_size=12))
def test_server_sent_events_are_read_however_the_bytes_arrive(cuts):
    from pipeline.gateway.streaming import sse_data

    edges = sorted({0, len(SSE), *cuts})
    pieces = [SSE[a:b] for a, b in zip(edges, edges[1:])]

    async def read() -> list[bytes]:
        return [data async for data in sse_data(_Pieces(pieces), 1 << 20)]

    events = asyncio.run(read())
    assert events == [b'{"a": 1}', b'{"b":\n2}', b"[" + b"7," * 5000 + b"7]", b"[DONE]"]
