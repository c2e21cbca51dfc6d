"""seam's own CPU per gateway call, without the HTTP legs (issue 26, item 4).

``bench/gateway_profile.py`` measures the whole gateway process: aiohttp's server, the
client to the engine, the kernel's sockets and seam's own work together, on a machine
shared with the stand-in engine and the client. This measures only what seam does per
call, in one process and one event loop (uvloop when installed): the gateway's middleware
and handler (``_guard`` → ``_call``: session, body read, parse, depth check, seams,
answer parse, delta record, write, reply) on requests built in memory
(``aiohttp.test_utils.make_mocked_request``), with the engine's POST replaced by the
stand-in's answer bytes computed beforehand (``bench/engine_stub.py``). The answer is
built but not sent. It is far less noisy than a three-process run, so two versions of
the code can be compared at the same moment on a loaded machine::

    PYTHONPATH=/path/to/a/checkout python -m bench.gateway_seam_cpu --history 400 --calls 100
    PYTHONPATH=/path/to/a/checkout python -m bench.gateway_seam_cpu --history 2 --calls 30 --passes 30

Each pass is one session (a first call, then ``--calls`` measured calls, each the whole
history plus the last answer and a new 400-byte tool output, from ``--history`` −
``--calls`` messages up), written with the defaults (``--durability group``, ``--log
delta``) to a temporary directory that is removed after. ``--profile`` prints a cProfile
of the measured calls timed by CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import shutil
import tempfile
import time
from pathlib import Path

import orjson
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from bench.engine_stub import answer
from bench.gateway_profile import TOOL_OUTPUT, _history
from pipeline.gateway.recorder import Recorder
from pipeline.gateway.server import TOKEN_ID_PARAMS, Gateway, GatewayConfig, event_loop_factory


class _Protocol:
    """The connection's protocol as the body's ``StreamReader`` sees it: reading is not
    paused (a ``mock.Mock`` here cost ~35 µs per call in attribute and call bookkeeping,
    which aiohttp's own protocol does not)."""

    _reading_paused = False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


class _Transport:
    """A client connection that stays open (the call is delivered)."""

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, *args, **kwargs):
        return None


def session_inputs(start: int, calls: int) -> tuple[list[bytes], list[bytes]]:
    """(the requests as an OpenAI client sends them, the stand-in's answers to them)."""
    history = _history(max(2, start))
    requests, answers = [], []
    for i in range(calls + 1):
        body = {"model": "stub", "messages": list(history)}
        requests.append(json.dumps(body).encode())  # aiohttp's json=: json.dumps
        whole = answer({**body, **TOKEN_ID_PARAMS})
        answers.append(orjson.dumps(whole))
        history.append(whole["choices"][0]["message"])
        history.append({"role": "user", "content": f"output of call {i}: {TOOL_OUTPUT}"})
    return requests, answers


async def measure(args: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp(prefix="seam-gw-cpu-"))
    recorder = Recorder(out, {"upstream": "bench"})
    gateway = Gateway(GatewayConfig(upstream="http://127.0.0.1:9/v1"), recorder)
    app = gateway.app()
    requests, answers = session_inputs(args.history - args.calls, args.calls)
    pending: list[bytes] = []

    async def post(payload: bytes) -> tuple[int, bytes]:
        return 200, pending.pop(0)

    gateway._post = post  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()

    def request(session: str, raw: bytes):
        payload = StreamReader(_Protocol(), 2**16, loop=loop)  # type: ignore[arg-type]
        payload.feed_data(raw)
        payload.feed_eof()
        headers = {"Host": "127.0.0.1:8788", "Content-Type": "application/json"}
        return make_mocked_request(
            "POST",
            f"/s/bench/{session}/v1/chat/completions",
            headers={**headers, "Content-Length": str(len(raw))},
            match_info={"task_id": "bench", "rollout_id": session},
            payload=payload,
            transport=_Transport(),
            app=app,
            client_max_size=2**28,
        )

    cpu, calls = 0.0, 0
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    try:
        for p in range(args.passes):
            made = [request(f"s{p}", raw) for raw in requests]
            pending[:] = answers
            first = await gateway._guard(made[0], gateway.chat_completions)
            assert first.status == 200, first
            # The previous pass's mocked requests (aiohttp's test helper builds them from
            # mocks: ~23,000 objects in reference cycles) are collected before the timer,
            # not by a collection the measured calls happen to trigger.
            gc.collect()
            started = time.process_time()
            if profiler is not None:
                profiler.enable()
            for one in made[1:]:
                resp = await gateway._guard(one, gateway.chat_completions)
                assert resp.status == 200, resp
            if profiler is not None:
                profiler.disable()
            cpu += time.process_time() - started
            calls += len(made) - 1
        await recorder.drain()
    finally:
        recorder.close()
        shutil.rmtree(out, ignore_errors=True)  # measured; nothing else reads it
    if profiler is not None:
        stats = pstats.Stats(profiler).strip_dirs()
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
    start = max(2, args.history - args.calls)
    return {
        "history_messages": f"{start}-{start + 2 * args.calls}",
        "calls": calls,
        "seam_cpu_ms_per_call": round(cpu * 1000 / calls, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--history", type=int, default=400, help="Messages at the middle call (default 400)."
    )
    parser.add_argument("--calls", type=int, default=100, help="Measured calls per pass.")
    parser.add_argument(
        "--passes", type=int, default=3, help="Sessions measured one after another."
    )
    parser.add_argument("--profile", action="store_true", help="Print a cProfile by CPU.")
    parser.add_argument("--top", type=int, default=30, help="Functions shown per ordering.")
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        result = runner.run(measure(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
