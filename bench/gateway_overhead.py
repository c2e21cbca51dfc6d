"""The gateway's cost: added latency per call, and calls/s, versus straight to the engine.

Three processes on 127.0.0.1: an engine stub (answers at once with a vLLM-style response
carrying token ids and logprobs), ``seam gateway`` in front of it, and this client. The
same calls go straight to the stub and through the gateway, alternately, ``repeats``
times; the fastest run of each side counts. Each call carries a growing session
history (as an agent's does), so the gateway's per-call work (translate, compare with
the previous request, append + fsync the line) is measured at a realistic size.

Run alone: ``python bench/gateway_overhead.py``; ``make bench`` includes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_STUB = r"""
import json, sys
from aiohttp import web
OUT = list(range(1000, 1064))
async def chat(request):
    body = await request.json()
    out = {"id": "x", "object": "chat.completion", "model": "stub",
           "choices": [{"index": 0, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "word " * 64}}],
           "usage": {"prompt_tokens": 100, "completion_tokens": 64}}
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = list(range(100 * len(body["messages"])))
        out["choices"][0]["token_ids"] = OUT
    if body.get("logprobs"):
        out["choices"][0]["logprobs"] = {"content": [{"token": "w", "logprob": -0.5}] * 64}
    return web.json_response(out)
app = web.Application(client_max_size=1 << 28)
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, timeout: float = 60) -> None:
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


async def _session(client, url: str, calls: int, latencies: list[float]) -> None:
    history = [{"role": "system", "content": "You are a coding agent. " * 20}]
    history.append({"role": "user", "content": "Fix the failing test in tests/test_parse.py."})
    for i in range(calls):
        started = time.perf_counter()
        async with client.post(url, json={"model": "stub", "messages": history}) as resp:
            answer = await resp.json()
        latencies.append(time.perf_counter() - started)
        history.append(answer["choices"][0]["message"])
        history.append({"role": "user", "content": f"output of step {i}: " + "x" * 400})


async def _run(urls: list[str], calls: int) -> tuple[float, list[float]]:
    import aiohttp

    latencies: list[float] = []
    started = time.perf_counter()
    async with aiohttp.ClientSession() as client:
        await asyncio.gather(*(_session(client, u, calls, latencies) for u in urls))
    return time.perf_counter() - started, latencies


def bench_gateway(calls: int = 100, sessions: int = 8, repeats: int = 3) -> dict:
    stub_port, gw_port = _free_port(), _free_port()
    work = Path(tempfile.mkdtemp(prefix="seam-gw-bench-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stub = subprocess.Popen([sys.executable, "-c", _STUB, str(stub_port)])
    gateway = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "gateway", "--port", str(gw_port)]
        + ["--upstream", f"http://127.0.0.1:{stub_port}/v1", "--out", str(work / "collect")],
        env=env,
        stderr=None if os.environ.get("SEAM_BENCH_VERBOSE") else subprocess.DEVNULL,
    )
    try:
        _wait(f"http://127.0.0.1:{stub_port}/v1/chat/completions")
        _wait(f"http://127.0.0.1:{gw_port}/healthz")
        direct = [f"http://127.0.0.1:{stub_port}/v1/chat/completions"] * sessions
        best: dict[str, tuple[float, list[float]]] = {}
        for r in range(repeats):
            via = [
                f"http://127.0.0.1:{gw_port}/s/bench/r{r}-{i}/v1/chat/completions"
                for i in range(sessions)
            ]
            for side, urls in (("direct", direct), ("gateway", via)):
                wall, lat = asyncio.run(_run(urls, calls))
                if side not in best or wall < best[side][0]:
                    best[side] = (wall, lat)
                one = asyncio.run(_run(urls[:1], calls))  # one session: latency without queueing
                key = side + "_one"
                if key not in best or one[0] < best[key][0]:
                    best[key] = one
        recorded = sum(1 for f in (work / "collect" / "calls").glob("*.jsonl") for _ in f.open())
    finally:
        for proc in (gateway, stub):
            proc.terminate()
            proc.wait(10)
    d_ms = statistics.median(best["direct_one"][1]) * 1000
    g_ms = statistics.median(best["gateway_one"][1]) * 1000
    total = calls * sessions
    return {
        "calls_per_session": calls,
        "sessions": sessions,
        "latency_direct_ms": round(d_ms, 2),
        "latency_gateway_ms": round(g_ms, 2),
        "added_latency_ms": round(g_ms - d_ms, 2),
        "calls_per_s_direct": round(total / best["direct"][0], 1),
        "calls_per_s_gateway": round(total / best["gateway"][0], 1),
        "calls_recorded": recorded,
        "note": "median per call over one session (no queueing); calls/s with all sessions at once",
    }


if __name__ == "__main__":
    print(json.dumps(bench_gateway(), indent=2))
