"""Where the gateway's CPU goes on one call of a long agent session (issue 26, item 4).

Three processes on 127.0.0.1: the engine stand-in (``bench/engine_stub.py``, vLLM-style
answers with token ids and logprobs, 100 prompt ids per message), a client that plays
one agent session, and this process, which runs ``seam gateway``'s application (the
defaults: ``--durability group``, ``--log delta``) and measures only itself. The client
first sends one call (a system prompt, a task, then alternating answers and 400-byte tool
outputs) and waits; then ``--calls`` calls, each the whole history plus the last answer
and a new tool output, as an agent sends them, with histories from ``--history`` −
``--calls`` to ``--history`` + ``--calls`` messages (200 to 600 by default: centred on 400).
Over those calls this process reports:

- ``cpu_ms_per_call``: its user + system CPU time (``os.times``) per call, everything
  the gateway does (HTTP in and out, parsing, comparing, recording, the background
  fsync rounds) — far less sensitive to a loaded machine than latency — and its two
  parts (``system``: the kernel's, mostly the loopback sockets carrying the history);
- ``engine_cpu_ms_per_call``: the stand-in engine's CPU for the same calls (from
  ``/proc``): it parses the same request and writes the answer with its ids, so it is a
  yardstick of how fast the machine is at the time;
- with ``--profile``: a second pass of the same calls under ``cProfile`` timed by
  ``time.process_time`` (CPU, not wall: waits for a core do not count), the top
  functions by own time and by cumulative time (cProfile slows Python code several
  times, so read it for proportions, not for the CPU per call).

Run: ``python -m bench.gateway_profile [--calls 200] [--history 400] [--profile]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL_OUTPUT = "x" * 400


def _history(messages: int) -> list[dict]:
    """A session's history of ``messages`` messages, as the stand-in engine would have
    produced it (its answers are 64 words)."""
    history = [{"role": "system", "content": "You are a coding agent. " * 20}]
    history.append({"role": "user", "content": "Fix the failing test in tests/test_parse.py."})
    step = 0
    while len(history) < messages:
        history.append({"role": "assistant", "content": "word " * 64})
        history.append({"role": "user", "content": f"output of step {step}: {TOOL_OUTPUT}"})
        step += 1
    return history[:messages]


async def _drive(url: str, history_len: int, calls: int, passes: int) -> None:
    """The client process: one long session. Prints ``ready`` after the first call of
    each pass and waits for a line on stdin before the measured calls."""
    import aiohttp

    async with aiohttp.ClientSession() as client:
        for p in range(passes):
            # Each call adds two messages: start below ``history_len`` so that the
            # measured calls' histories are centred on it.
            history = _history(max(2, history_len - calls))
            session_url = url.format(session=f"profile-{p}")
            for i in range(calls + 1):
                async with client.post(
                    session_url, json={"model": "stub", "messages": history}
                ) as resp:
                    answer = await resp.json()
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {answer}")
                history.append(answer["choices"][0]["message"])
                history.append({"role": "user", "content": f"output of call {i}: {TOOL_OUTPUT}"})
                if i == 0:  # the session exists and has a base: measure from here
                    print("ready", flush=True)
                    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            print("done", flush=True)


async def _start_stub() -> tuple[asyncio.subprocess.Process, int]:
    from bench.gateway_overhead import _free_port, _wait

    port = _free_port()
    stub = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.engine_stub", "--port", str(port), cwd=ROOT
    )
    await asyncio.to_thread(_wait, f"http://127.0.0.1:{port}/v1/chat/completions")
    return stub, port


async def _profile(args: argparse.Namespace) -> dict:
    from aiohttp import web

    from bench.gateway_overhead import _cpu_s
    from pipeline.gateway.recorder import Recorder
    from pipeline.gateway.server import Gateway, GatewayConfig

    stub, stub_port = await _start_stub()
    out = Path(tempfile.mkdtemp(prefix="seam-gw-profile-"))
    recorder = Recorder(out, {"upstream": "bench"}, durability=args.durability)
    gateway = Gateway(
        GatewayConfig(upstream=f"http://127.0.0.1:{stub_port}/v1", log=args.log), recorder
    )
    runner = web.AppRunner(gateway.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    passes = 2 if args.profile else 1
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.gateway_profile",
        "--drive",
        f"http://127.0.0.1:{port}/s/bench/{{session}}/v1/chat/completions",
        "--history",
        str(args.history),
        "--calls",
        str(args.calls),
        "--passes",
        str(passes),
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert client.stdin is not None and client.stdout is not None
    result: dict = {"history_messages": args.history, "calls": args.calls}
    try:
        for p in range(passes):
            assert (await client.stdout.readline()).strip() == b"ready"
            # CPU time, not wall time: on a shared machine a wall-clock profile shows
            # mostly the waits for a core (in poll, in send).
            profiler = cProfile.Profile(time.process_time) if p == 1 else None
            times, wall, engine = os.times(), time.perf_counter(), _cpu_s(stub.pid)
            if profiler is not None:
                profiler.enable()
            client.stdin.write(b"go\n")
            assert (await client.stdout.readline()).strip() == b"done"
            if profiler is not None:
                profiler.disable()
            after, wall = os.times(), time.perf_counter() - wall
            user, system = after.user - times.user, after.system - times.system
            if profiler is None:
                per_call = {
                    "cpu_ms_per_call": user + system,
                    "user_ms_per_call": user,
                    "system_ms_per_call": system,
                    "wall_ms_per_call": wall,
                    # the stand-in engine's own CPU for the same calls: it parses the same
                    # request and writes the answer, so it is a yardstick of the machine
                    "engine_cpu_ms_per_call": _cpu_s(stub.pid) - engine,
                }
                result |= {k: round(v * 1000 / args.calls, 3) for k, v in per_call.items()}
            else:
                result["profile"] = _top(profiler, args.top)
        await client.wait()
    finally:
        await runner.cleanup()
        recorder.close()
        stub.terminate()
        await stub.wait()
    log = out / "calls" / "profile-0.jsonl"
    result["log_bytes_per_call"] = round(log.stat().st_size / (args.calls + 1))
    shutil.rmtree(out, ignore_errors=True)  # measured; nothing else reads it
    return result


def _top(profiler: cProfile.Profile, n: int) -> str:
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(n)
    stats.sort_stats("cumulative").print_stats(n)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="Measured calls (default 200).")
    parser.add_argument("--history", type=int, default=400, help="Messages in the first call.")
    parser.add_argument("--durability", default="group", choices=("group", "sync", "none"))
    parser.add_argument("--log", default="delta", choices=("delta", "full"))
    parser.add_argument("--profile", action="store_true", help="Also a cProfile pass.")
    parser.add_argument(
        "--loop",
        default="auto",
        choices=("auto", "asyncio"),
        help="auto: uvloop when installed, as seam gateway runs (default); asyncio: the stdlib's",
    )
    parser.add_argument("--top", type=int, default=25, help="Functions shown per ordering.")
    parser.add_argument("--drive", help=argparse.SUPPRESS)  # the client process
    parser.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        asyncio.run(_drive(args.drive, args.history, args.calls, args.passes))
        return
    factory = None
    if args.loop == "auto":
        from pipeline.gateway.server import event_loop_factory

        factory = event_loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        result = runner.run(_profile(args))
    result["event_loop"] = "uvloop" if factory is not None else "asyncio"
    profile = result.pop("profile", None)
    print(json.dumps(result, indent=2))
    if profile:
        print(profile)


if __name__ == "__main__":
    main()
