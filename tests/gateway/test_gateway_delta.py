"""Delta call logs (--log delta), undelivered calls and client timeouts.

A call that extends its session's previous call is stored as what it adds
(pipeline/readers/call_delta.py): a long session's log grows about linearly, the build
reads the same rows from a delta log as from a full one, and a lost line costs at most the
calls up to the next full record, each with its reason. A call whose client was gone
before the answer is marked undelivered and left out, so the harness's retry is no seam.
A client that trickles its request is dropped after --client-timeout."""

from __future__ import annotations

import socket
import time

import orjson
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.engine_stub import make_app
from pipeline.readers import Accepted, Rejected, Skipped
from pipeline.readers.call_delta import FULL_EVERY, Resolver, is_delta
from pipeline.readers.openai_messages import UNDELIVERED, ChatCompletionsReader
from tests.examples import examples
from tests.gateway.builds import build_collection, calls_of, rewards_file, rows_of
from tests.gateway.serving import ThreadedApp

openai = pytest.importorskip("openai")

CALLS = 500


@pytest.fixture(scope="module")
def long_session(tmp_path_factory):
    """One 500-call session through a delta-logging gateway in front of the stand-in
    engine (10 prompt ids per message), as an agent makes it: each call sends the whole
    history plus the last answer and a tool result."""
    from tests.gateway.conftest import RunningGateway

    engine = ThreadedApp(make_app(tokens_per_message=10))
    gw = RunningGateway(tmp_path_factory.mktemp("delta") / "collect", engine.url + "/v1")
    try:
        url = gw.base("t", "long") + "/v1/chat/completions"
        history = [{"role": "system", "content": "You are a coding agent."}]
        history.append({"role": "user", "content": "Fix the failing test."})
        with requests.Session() as http:
            http.headers["Content-Type"] = "application/json"
            for i in range(CALLS):  # orjson both ways: the stdlib's json was most of the time
                sent = orjson.dumps({"model": "stub", "messages": history})
                answer = orjson.loads(http.post(url, data=sent).content)
                history.append(answer["choices"][0]["message"])
                history.append({"role": "user", "content": f"output of step {i}: " + "x" * 60})
    finally:
        gw.stop()
        engine.stop()
    return gw.out / "calls" / "long.jsonl"


def test_a_long_session_log_grows_linearly(long_session):
    lines = long_session.read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]
    assert len(records) == CALLS
    full_at = [i + 1 for i, r in enumerate(records) if not is_delta(r)]
    assert full_at == list(range(1, CALLS + 1, FULL_EVERY))  # call 1, 33, 65, ...
    deltas = [len(line) for line, r in zip(lines, records) if is_delta(r)]
    # A delta holds what the call adds, whatever the history: the last chain's deltas are
    # no larger than the first chain's (the history grew 250-fold in between).
    early, late = sorted(deltas[:20]), sorted(deltas[-20:])
    assert late[10] <= early[10] * 1.1, (early[10], late[10])
    assert max(deltas) <= 2 * early[10]
    # The same calls stored whole: the full log's quadratic size.
    whole = sum(len(orjson.dumps(r)) + 1 for r in calls_of(long_session))
    total = sum(len(line) + 1 for line in lines)
    assert total * 10 < whole, (total, whole)
    # The full records are the only part that grows: about history/FULL_EVERY per call.
    assert sum(deltas) > 0.3 * sum(len(line) for line, r in zip(lines, records) if not is_delta(r))


def test_a_lost_line_costs_the_calls_up_to_the_next_full_record(long_session, tmp_path):
    lines = long_session.read_bytes().splitlines()[:100]  # 100 calls: the reader is quick
    lines[39] = lines[39][:50]  # call 40 cut (a delta in the chain of call 33)
    damaged = tmp_path / "long.jsonl"
    damaged.write_bytes(b"\n".join(lines) + b"\n")
    items = list(ChatCompletionsReader().read(damaged))
    rejected = [i for i in items if isinstance(i, Rejected)]
    assert [r.line for r in rejected] == list(range(40, 65))  # 40 .. 64; 65 is full
    assert "invalid JSON" in rejected[0].reason
    assert all("stored as a change to call" in r.reason for r in rejected[1:])
    assert "call 41 is stored as a change to call 40" in rejected[1].reason
    (accepted,) = [i for i in items if isinstance(i, Accepted)]
    assert accepted.records == 100 - 25
    # The calls after the gap are the same as when nothing was lost.
    whole = calls_of(long_session)[:100]
    resolver, after = Resolver(), []
    for line in lines[64:]:  # from the full record of call 65 on
        full = resolver.resolve(orjson.loads(line))
        resolver.accept(full)
        after.append(full)
    assert after == whole[64:]


def _agent_session(client) -> None:
    """Eight calls with a compaction in the middle: the context is rewritten once."""
    history = [{"role": "system", "content": "Agent."}, {"role": "user", "content": "Fix it."}]
    for step in range(8):
        if step == 5:  # compaction: a new context with a summary
            history = [
                {"role": "system", "content": "Agent."},
                {"role": "user", "content": "Summary of the work so far: tests fail. Go on."},
            ]
        msg = client.chat.completions.create(model="tiny", messages=history).choices[0].message
        history += [
            {"role": "assistant", "content": msg.content},
            {"role": "user", "content": f"step {step} done"},
        ]


def test_delta_and_full_logs_build_the_same_rows(tmp_path, model_server, start_gateway):
    built = {}
    for log in ("delta", "full"):
        gw = start_gateway(model_server.url, name=log, log=log, full_every=3)
        client = openai.OpenAI(base_url=gw.base("t", "same") + "/v1", api_key="none")
        _agent_session(client)
        gw.stop()
        path = gw.out / "calls" / "same.jsonl"
        kinds = [
            "delta" if is_delta(orjson.loads(x)) else "full" for x in path.read_bytes().splitlines()
        ]
        if log == "delta":  # full at 1 and every 3rd; the compaction keeps the system message
            assert kinds == ["full", "delta", "delta", "full", "delta", "delta", "full", "delta"]
        else:
            assert set(kinds) == {"full"}
        out, result = build_collection(
            tmp_path, gw.out, name=f"rl-{log}", rewards=rewards_file(tmp_path, "same")
        )
        assert result.counts["accepted"] == 1 and result.counts["quarantined"] == 0
        built[log] = rows_of(out)
    produced = model_server.produced
    assert [p.output_ids for p in produced[:8]] == [p.output_ids for p in produced[8:]]
    assert len(built["delta"]) == 2  # the compaction is a seam in both
    assert built["delta"] == built["full"]


def test_an_undelivered_call_is_left_out_and_its_retry_is_no_seam(
    tmp_path, tiny_model_dir, start_gateway
):
    from tests.gateway.model_server import ModelServer

    server = ModelServer(str(tiny_model_dir), delay_s=1.0).start()
    try:
        gw = start_gateway(server.url)
        url = gw.base("t", "gone") + "/v1/chat/completions"
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(requests.exceptions.ReadTimeout):  # the harness gives up
            requests.post(url, json=body, timeout=0.3)
        time.sleep(1.5)  # the engine answers; the gateway records the call, undelivered
        assert requests.post(url, json=body, timeout=30).status_code == 200  # the retry
        first, second = calls_of(gw.out / "calls" / "gone.jsonl")
        assert first["seam"]["delivered"] is False and "delivered" not in second["seam"]
        assert second["seam"]["extends_previous"] is None  # compared with nothing before
        items = list(ChatCompletionsReader().read(gw.out / "calls" / "gone.jsonl"))
        assert [type(i) for i in items] == [Skipped, Accepted]
        assert items[0].reason == UNDELIVERED
        out, result = build_collection(tmp_path, gw.out, rewards=rewards_file(tmp_path, "gone"))
        rows = rows_of(out)
        assert len(rows) == 1 and rows[0]["num_calls"] == 1 and rows[0]["seam_kind"] == "none"
    finally:
        server.stop()


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` while we trickle bytes."""
    deadline = time.time() + seconds
    sock.settimeout(0.2)
    while time.time() < deadline:
        try:
            sock.send(b"X")
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def test_a_trickling_client_is_dropped(model_server, start_gateway):
    gw = start_gateway(model_server.url, client_timeout_s=1.0)
    host, port = gw.url.removeprefix("http://").split(":")
    headers = socket.create_connection((host, int(port)))
    headers.send(b"POST /s/t/r/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ")
    assert _closed_within(headers, 10)
    body = socket.create_connection((host, int(port)))
    body.send(
        b"POST /s/t/r/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    )
    body.settimeout(10)
    assert body.recv(4096).startswith(b"HTTP/1.1 408")


def test_a_restarted_session_is_loaded_off_the_event_loop(tmp_path, start_gateway, monkeypatch):
    """A restarted gateway reads a session's log on that session's first call, in a
    thread: while one session's long log loads, other sessions are answered."""
    import threading

    from pipeline.gateway.server import Gateway

    engine = ThreadedApp(make_app())
    try:
        first = start_gateway(engine.url + "/v1")
        body = {"model": "stub", "messages": [{"role": "user", "content": "hi"}]}
        assert requests.post(first.base("t", "old") + "/v1/chat/completions", json=body).ok
        first.stop()
        loading, release = threading.Event(), threading.Event()
        real_load = Gateway._load

        def slow_load(self, session):
            if session.rollout_id == "old":
                loading.set()
                release.wait(30)  # a 532 MB log takes seconds; this one until released
            return real_load(self, session)

        monkeypatch.setattr(Gateway, "_load", slow_load)
        second = start_gateway(engine.url + "/v1")  # same --out: nothing read at startup
        assert not loading.is_set()
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            old = pool.submit(
                requests.post, second.base("t", "old") + "/v1/chat/completions", json=body
            )
            assert loading.wait(30)
            started = time.monotonic()
            other = requests.post(second.base("t", "new") + "/v1/chat/completions", json=body)
            assert other.ok and time.monotonic() - started < 10 and not old.done()
            release.set()
            assert old.result(30).ok
        numbers = [c["seam"]["call"] for c in calls_of(second.out / "calls" / "old.jsonl")]
        assert numbers == [1, 2]
    finally:
        engine.stop()


def test_a_new_session_is_not_handed_to_a_thread_to_load_nothing(
    tmp_path, start_gateway, monkeypatch
):
    """A session with no log yet (most first calls) has nothing to load: its first call
    makes no hand-off to a thread (~0.1 ms of the event loop's CPU per new session); a
    session whose log is on disk is still loaded (the restart test above)."""
    from pipeline.gateway.server import Gateway

    loads: list[str] = []
    real_load = Gateway._load

    def counted(self, session):
        loads.append(session.rollout_id)
        return real_load(self, session)

    monkeypatch.setattr(Gateway, "_load", counted)
    engine = ThreadedApp(make_app())
    try:
        gw = start_gateway(engine.url + "/v1")
        body = {"model": "stub", "messages": [{"role": "user", "content": "hi"}]}
        for rollout in ("fresh-a", "fresh-b", "fresh-a"):
            assert requests.post(gw.base("t", rollout) + "/v1/chat/completions", json=body).ok
        assert loads == []
        gw.stop()
        again = start_gateway(engine.url + "/v1")  # same --out: fresh-a's log is there now
        assert requests.post(again.base("t", "fresh-a") + "/v1/chat/completions", json=body).ok
        assert loads == ["fresh-a"]
        numbers = [c["seam"]["call"] for c in calls_of(again.out / "calls" / "fresh-a.jsonl")]
        assert numbers == [1, 2, 3]
    finally:
        engine.stop()


def test_a_session_keeps_its_last_call_not_every_record(start_gateway):
    """Without a judge the gateway holds one call per session (the next delta's base and
    the extends-previous reference), however long the session (memory grew with every
    record: 630 → 1,852 MB over 1,200 calls)."""
    engine = ThreadedApp(make_app())
    try:
        gw = start_gateway(engine.url + "/v1")
        url = gw.base("t", "held") + "/v1/chat/completions"
        history = [{"role": "user", "content": "go"}]
        for _ in range(5):
            answer = requests.post(url, json={"model": "stub", "messages": history}).json()
            history += [answer["choices"][0]["message"], {"role": "user", "content": "more"}]
        session = gw.gateway.sessions["held"]
        assert session.calls == [] and session.base is not None
        assert session.same_prefix is None  # the depth check's finding is dropped after use
        assert session.base["seam"]["call"] == 5 and session.next_call == 6
        assert session.base["request"]["messages"] == history[:-2]
    finally:
        engine.stop()


_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": st.sampled_from(["a", "", None])},
    optional={"refusal": st.none(), "tool_calls": st.sampled_from([[], None])},
)


@settings(max_examples=examples(100, 300), deadline=None)  # a loaded machine: not a timing test
@given(st.lists(_message, max_size=4), _message, st.lists(_message, max_size=6))
def test_extends_previous_is_the_normalized_comparison(sent_before, answer, messages):
    """The raw-first comparison gives what normalizing every message gave (the online
    extends_previous test before), on requests that re-send the history or not."""
    from pipeline.gateway.server import _extends, _norm

    base = {"request": {"messages": sent_before}, "response": {"choices": [{"message": answer}]}}
    previous = [_norm(m) for m in sent_before] + [_norm(answer)]
    for request in (messages, sent_before + messages, [*sent_before, answer, *messages]):
        expected = [_norm(m) for m in request[: len(previous)]] == previous
        assert _extends(request, base) == expected


def test_a_prefix_known_equal_is_known_only_for_the_same_lists():
    """The depth check's finding (these leading messages equal the last checked request's)
    spares the later comparisons only for exactly the lists it compared: an equal copy,
    another request or another base compares again."""
    from pipeline.gateway.server import Session, _check_depth

    session = Session("r", "t")
    first = [{"role": "user", "content": "a"}]
    _check_depth({"messages": first}, b"", session)
    second = [*first, {"role": "assistant", "content": "b"}]
    _check_depth({"messages": second}, b"", session)
    assert session.known_equal(second, first) == 1
    assert session.known_equal(second, list(first)) == 0  # equal, but not what was compared
    assert session.known_equal(list(second), first) == 0
    rewritten = [{"role": "user", "content": "summary"}]
    _check_depth({"messages": rewritten}, b"", session)
    assert session.known_equal(rewritten, second) == 0  # it differed: nothing is known


@settings(max_examples=examples(40, 100), deadline=None)
@given(st.lists(_message, max_size=4), _message, st.lists(_message, max_size=4))
def test_a_known_prefix_gives_the_same_delta(sent_before, answer, more):
    """encode with the known prefix writes the same record as without it."""
    from pipeline.readers.call_delta import encode

    base = {
        "request": {"messages": sent_before},
        "response": {"choices": [{"message": answer}]},
        "seam": {"call": 1},
    }
    for messages in ([*sent_before, *more], [*sent_before, answer, *more]):
        record = {"request": {"messages": messages}, "response": {}, "seam": {"call": 2}}
        assert encode(record, base, 1, len(sent_before)) == encode(record, base, 1)
