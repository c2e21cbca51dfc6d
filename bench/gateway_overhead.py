"""The gateway's cost at 1, 8, 64 and 256 concurrent sessions, versus straight to the engine.

Three processes on 127.0.0.1: the engine stand-in (``bench/engine_stub.py``: vLLM-style
answers with token ids and logprobs, at once or after a fixed delay per call),
``seam gateway`` in front of it (``--durability group``, ``--log delta``: the defaults),
and this client. For each engine (instant, and 200 ms per call like a real engine) and
each number of sessions, rounds straight to the engine and through the gateway
alternate (direct, gateway, direct, gateway, ...), so a change in the machine's load
hits both sides alike. Every session sends calls with a growing history, as an agent
does (each call: the whole history, plus the last answer and a 400-byte tool output).

Reported per engine and number of sessions:
- ``added_median_ms`` / ``added_p99_ms``: the median (p99) latency of a call through the
  gateway minus straight to the engine, over all calls of all rounds of each side;
- ``calls_per_s_ratio``: calls per second through the gateway / straight (each side's
  best round);
- ``gateway_cpu_ms_per_call``: the gateway process's CPU time (user + system, from
  ``/proc/PID/stat``) over its rounds, per call, and ``gateway_loop_cpu_ms_per_call``, the
  part of it on the event loop's thread (``/proc/PID/task/PID/stat``; the rest is the
  fsync rounds' and other helper threads'): one thread, so the loop's CPU per call bounds
  the gateway's calls/s;
- ``engine_cpu_ms_per_call``: the stand-in engine's CPU per call in the direct rounds,
  and ``gateway_to_engine_cpu``, the ratio of the two: each is one process, so with a
  core each the gateway keeps up with the engine while the ratio is under 1, and passes
  at least 70% of its calls/s while it is under 1/0.7 ≈ 1.43 — a measure a loaded
  machine changes far less than latencies;
and once, from the gateway's call logs: bytes logged per call against the history
length (messages in the call's request), for the delta log and for the same calls stored
whole; and once, streamed (``ttft``): the time to the first text chunk and to the whole
answer, straight and through the gateway, from an engine that streams its text in 8
chunks 20 ms apart (``bench_ttft``).

Run alone: ``python bench/gateway_overhead.py [--quick]``; ``make bench`` includes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = (1, 8, 64, 256)
DELAYS_MS = (0.0, 200.0)
# Calls per session in one round. An agent's session makes tens to hundreds of calls; with
# 3-8 calls per session at 64 and 256 sessions (before), a third to an eighth of the calls
# measured were a session's first (its log created, its directory entry fsync'd, its whole
# history new), so those rows measured session start-up more than a fleet's steady state.
CALLS = {1: 60, 8: 30, 64: 25, 256: 10}
QUICK_CALLS = {1: 30, 8: 10, 64: 12, 256: 5}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, timeout: float = 120) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError as exc:
            if getattr(exc, "code", None):  # an HTTP error: the server is up
                return
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def _cpu_s(pid: int, thread: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat`` fields 14,
    15, in clock ticks); ``thread``: of its main thread only."""
    stat = f"/proc/{pid}/task/{pid}/stat" if thread else f"/proc/{pid}/stat"
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _session(client, url: str, calls: int, latencies: list[float]) -> None:
    history = [{"role": "system", "content": "You are a coding agent. " * 20}]
    history.append({"role": "user", "content": "Fix the failing test in tests/test_parse.py."})
    for i in range(calls):
        started = time.perf_counter()
        async with client.post(url, json={"model": "stub", "messages": history}) as resp:
            answer = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"{url}: HTTP {resp.status}: {answer}")
        latencies.append(time.perf_counter() - started)
        history.append(answer["choices"][0]["message"])
        history.append({"role": "user", "content": f"output of step {i}: " + "x" * 400})


async def _round(urls: list[str], calls: int) -> tuple[float, list[float]]:
    import aiohttp

    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)  # one connection per session, no queue
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as client:
        await asyncio.gather(*(_session(client, u, calls, latencies) for u in urls))
    return time.perf_counter() - started, latencies


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _log_sizes(calls_dir: Path) -> dict:
    """Bytes logged per call against history length, delta log vs the same calls whole."""
    import orjson

    from pipeline.readers.call_delta import Resolver

    buckets: dict[int, list[tuple[int, int]]] = {}
    for log in calls_dir.glob("*.jsonl"):
        resolver = Resolver()
        for line in log.read_bytes().splitlines():
            full = resolver.resolve(orjson.loads(line))
            resolver.accept(full)
            history = len(full["request"]["messages"])
            bucket = 10 ** len(str(history)) // 10  # 1-9, 10-99, 100-999 messages
            buckets.setdefault(bucket, []).append((len(line) + 1, len(orjson.dumps(full)) + 1))
    out = {}
    for bucket in sorted(buckets):
        pairs = buckets[bucket]
        out[f"{bucket}-{bucket * 10 - 1} messages"] = {
            "calls": len(pairs),
            "delta_log_bytes_per_call": round(statistics.mean(p[0] for p in pairs)),
            "full_log_bytes_per_call": round(statistics.mean(p[1] for p in pairs)),
        }
    return out


def _start(args: list[str], env: dict) -> subprocess.Popen:
    quiet = None if os.environ.get("SEAM_BENCH_VERBOSE") else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, *args], env=env, stderr=quiet)


def bench_gateway(quick: bool = False, rounds: int = 2) -> dict:
    """The table described in the module docstring, one entry per engine delay."""
    calls_per = QUICK_CALLS if quick else CALLS
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: dict = {
        "sessions": list(SESSIONS),
        "calls_per_session": {str(k): v for k, v in calls_per.items()},
        "rounds_per_side": rounds,
        "engines": {},
    }
    work = Path(tempfile.mkdtemp(prefix="seam-gw-bench-"))
    for delay in DELAYS_MS:
        stub_port, gw_port = _free_port(), _free_port()
        collect = work / f"collect-{int(delay)}ms"
        stub = _start(
            ["-m", "bench.engine_stub", "--port", str(stub_port), "--delay-ms", str(delay)], env
        )
        gateway = _start(
            ["-m", "pipeline.cli", "gateway", "--port", str(gw_port)]
            + ["--upstream", f"http://127.0.0.1:{stub_port}/v1", "--out", str(collect)],
            env,
        )
        rows = {}
        try:
            _wait(f"http://127.0.0.1:{stub_port}/v1/chat/completions")
            _wait(f"http://127.0.0.1:{gw_port}/healthz")
            for sessions in SESSIONS:
                calls = calls_per[sessions]
                direct = [f"http://127.0.0.1:{stub_port}/v1/chat/completions"] * sessions
                lat: dict[str, list[float]] = {"direct": [], "gateway": []}
                best: dict[str, float] = {}
                cpu = loop_cpu = engine_cpu = 0.0
                for r in range(rounds):
                    via = [
                        f"http://127.0.0.1:{gw_port}/s/bench/d{int(delay)}-s{sessions}-r{r}-{i}"
                        "/v1/chat/completions"
                        for i in range(sessions)
                    ]
                    for side, urls in (("direct", direct), ("gateway", via)):
                        before, engine_before = _cpu_s(gateway.pid), _cpu_s(stub.pid)
                        loop_before = _cpu_s(gateway.pid, thread=True)
                        wall, latencies = asyncio.run(_round(urls, calls))
                        if side == "gateway":
                            cpu += _cpu_s(gateway.pid) - before
                            loop_cpu += _cpu_s(gateway.pid, thread=True) - loop_before
                        else:
                            engine_cpu += _cpu_s(stub.pid) - engine_before
                        lat[side] += latencies
                        best[side] = min(best.get(side, wall), wall)
                total = sessions * calls
                d_med, g_med = statistics.median(lat["direct"]), statistics.median(lat["gateway"])
                d_p99 = _percentile(lat["direct"], 0.99)
                g_p99 = _percentile(lat["gateway"], 0.99)
                rows[str(sessions)] = {
                    "direct_median_ms": round(d_med * 1000, 2),
                    "gateway_median_ms": round(g_med * 1000, 2),
                    "added_median_ms": round((g_med - d_med) * 1000, 2),
                    "added_p99_ms": round((g_p99 - d_p99) * 1000, 2),
                    "median_ratio": round(g_med / d_med, 3),
                    "calls_per_s_direct": round(total / best["direct"], 1),
                    "calls_per_s_gateway": round(total / best["gateway"], 1),
                    "calls_per_s_ratio": round(best["direct"] / best["gateway"], 3),
                    "gateway_cpu_ms_per_call": round(cpu * 1000 / (total * rounds), 3),
                    "gateway_loop_cpu_ms_per_call": round(loop_cpu * 1000 / (total * rounds), 3),
                    "engine_cpu_ms_per_call": round(engine_cpu * 1000 / (total * rounds), 3),
                    "gateway_to_engine_cpu": round(cpu / engine_cpu, 2) if engine_cpu else None,
                }
        finally:
            for proc in (gateway, stub):
                proc.terminate()
                proc.wait(30)
        results["engines"][f"{int(delay)} ms per call"] = rows
        if delay == 0.0:
            results["bytes_logged_per_call"] = _log_sizes(collect / "calls")
    results["ttft"] = bench_ttft(work, env, calls=10 if quick else 30)
    shutil.rmtree(work, ignore_errors=True)  # the logs were measured; nothing else reads them
    results["note"] = (
        "added latency: median (p99) through the gateway minus straight to the engine, all "
        "calls of all rounds; calls/s: each side's best round; CPU: the gateway process"
    )
    return results


async def _streamed(client, url: str, calls: int, ttft: list[float], total: list[float]) -> None:
    """``calls`` streamed calls, one at a time: the time to the first chunk with text, and
    to the end of the stream."""
    body = {"model": "stub", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    for _ in range(calls):
        started, first = time.perf_counter(), None
        async with client.post(url, json=body) as resp:
            async for line in resp.content:
                if first is None and line.startswith(b"data: {") and b"word" in line:
                    first = time.perf_counter() - started
        if first is None:
            raise RuntimeError(f"{url}: no text chunk")
        ttft.append(first)
        total.append(time.perf_counter() - started)


def bench_ttft(work: Path, env: dict, calls: int = 30, chunk_ms: float = 20.0) -> dict:
    """Time to first token and to the whole answer, straight and through the gateway, one
    session, rounds alternating (the gateway relays each chunk as it comes)."""
    import aiohttp

    stub_port, gw_port = _free_port(), _free_port()
    stub = _start(
        ["-m", "bench.engine_stub", "--port", str(stub_port), "--chunk-ms", str(chunk_ms)], env
    )
    gateway = _start(
        ["-m", "pipeline.cli", "gateway", "--port", str(gw_port)]
        + ["--upstream", f"http://127.0.0.1:{stub_port}/v1", "--out", str(work / "collect-ttft")],
        env,
    )
    sides = {
        "direct": f"http://127.0.0.1:{stub_port}/v1/chat/completions",
        "gateway": f"http://127.0.0.1:{gw_port}/s/bench/ttft/v1/chat/completions",
    }
    ttft: dict[str, list[float]] = {side: [] for side in sides}
    total: dict[str, list[float]] = {side: [] for side in sides}

    async def run(side: str) -> None:
        async with aiohttp.ClientSession() as client:
            await _streamed(client, sides[side], calls // 2 or 1, ttft[side], total[side])

    try:
        _wait(f"http://127.0.0.1:{stub_port}/v1/chat/completions")
        _wait(f"http://127.0.0.1:{gw_port}/healthz")
        for _ in range(2):
            for side in sides:
                asyncio.run(run(side))
    finally:
        for proc in (gateway, stub):
            proc.terminate()
            proc.wait(30)
    out: dict = {"chunk_ms": chunk_ms, "calls_per_side": len(ttft["direct"])}
    for side in sides:
        out[f"{side}_ttft_median_ms"] = round(statistics.median(ttft[side]) * 1000, 2)
        out[f"{side}_total_median_ms"] = round(statistics.median(total[side]) * 1000, 2)
    out["added_ttft_median_ms"] = round(
        out["gateway_ttft_median_ms"] - out["direct_ttft_median_ms"], 2
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Fewer calls per session.")
    parser.add_argument("--rounds", type=int, default=2, help="Rounds of each side (default 2).")
    parser.add_argument(
        "--ttft", action="store_true", help="Only the streamed time to first token."
    )
    args = parser.parse_args()
    if args.ttft:
        work = Path(tempfile.mkdtemp(prefix="seam-gw-ttft-"))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        print(json.dumps(bench_ttft(work, env), indent=2))
        shutil.rmtree(work, ignore_errors=True)
        return
    print(json.dumps(bench_gateway(args.quick, args.rounds), indent=2))


if __name__ == "__main__":
    main()
