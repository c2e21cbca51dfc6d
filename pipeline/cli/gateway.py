"""``seam gateway --upstream URL --out DIR``: record token-exact rollouts between any harness
and an OpenAI-compatible engine, with the Judge in the loop (``pipeline/gateway/``)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.common.errors import UsageError


def register(sub) -> None:
    p = sub.add_parser(
        "gateway",
        help="Serve an OpenAI/Anthropic-compatible endpoint that records every call as "
        "buildable rollouts (token ids when the engine returns them), Judge optional.",
        description="Run an HTTP server on 127.0.0.1 between agent harnesses and an "
        "OpenAI-compatible inference engine. Point a harness at "
        "http://HOST:PORT/s/TASK_ID/ROLLOUT_ID (Anthropic clients, e.g. ANTHROPIC_BASE_URL) or "
        "http://HOST:PORT/s/TASK_ID/ROLLOUT_ID/v1 (OpenAI clients). Every completed call is "
        "appended to OUT/calls/ROLLOUT_ID.jsonl before it is answered (fsync'd as "
        "--durability says); post outcomes to "
        '/s/TASK_ID/ROLLOUT_ID/reward as {"reward": R}. Build with '
        "'seam build-rl OUT/calls --rewards OUT/rewards.jsonl'. Stop with Ctrl-C or SIGTERM.",
    )
    from pipeline.common.options import add_options
    from pipeline.gateway.config import FLAG_ORDER

    # Each flag from its field (pipeline/gateway/config.py), listed in the order of before.
    for config_class, name in FLAG_ORDER:
        add_options(p, config_class, only=(name,))
    p.set_defaults(func=run)


def run(args) -> int:
    from pipeline.common import extras

    extras.require("gateway", "gateway")
    from aiohttp import web

    from judge.loop_judge import RuleJudge
    from pipeline.common.credentials import split_url
    from pipeline.common.options import config_from_args
    from pipeline.gateway.config import GatewayConfig, GatewayOptions
    from pipeline.gateway.judging import HttpJudge
    from pipeline.gateway.recorder import Recorder
    from pipeline.gateway.server import Gateway, event_loop_factory

    # Only the URLs without their credentials are ever printed or recorded.
    upstream = split_url(args.upstream).url
    if not args.upstream.startswith(("http://", "https://")):
        raise UsageError(
            f"--upstream {upstream!r}: give an http(s) URL such as http://127.0.0.1:8000/v1"
        )
    config = config_from_args(GatewayConfig, args)  # checks each flag's value
    command = config_from_args(GatewayOptions, args)
    judge = command.judge
    judge_name = split_url(judge).url if judge and judge != "rules" else judge
    judge_factory: Callable[[Any], Any] | None = None
    if judge == "rules":
        judge_factory = lambda client: RuleJudge()  # noqa: E731
    elif judge:
        if not judge.startswith(("http://", "https://")):
            raise UsageError(f"--judge {judge_name!r}: give 'rules' or an http(s) URL")
        judge_url, judge_timeout = judge, command.judge_timeout
        judge_factory = lambda client: HttpJudge(judge_url, client, judge_timeout)  # noqa: E731
    raise_open_files_limit()  # before the recorder: it keeps logs open within the limit
    recorder = Recorder(
        Path(command.out),
        {
            "upstream": upstream,
            "judge": judge_name or None,
            "token_ids_mode": config.token_ids,
            "log": config.log if config.log == "full" else f"delta, full every {config.full_every}",
        },
        durability=command.durability,
    )
    try:
        gateway = Gateway(config, recorder, judge_factory)
    except ValueError as exc:  # e.g. a key from the URL that holds a line break
        recorder.close()
        raise UsageError(f"--upstream {upstream!r}: {exc}") from None
    try:
        # uvloop when installed (less CPU per call); asyncio's own loop otherwise
        tune_gc()
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(_serve(web, gateway, recorder, config.listen_host, command.port))
    finally:
        recorder.close()


# The collector's first generation runs after this many more container allocations than
# frees (Python's default is 700): see tune_gc.
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a long-running gateway: what exists at
    start (the modules, aiohttp, seam's code: ~60,000 objects) moves to the permanent
    generation (``gc.freeze``), so full collections stop walking it, and the youngest
    generation is collected after ``GC_YOUNG_THRESHOLD`` allocations instead of 700. At
    700, each collection mostly walked the requests still in flight (64 sessions' parsed
    bodies), and the survivors it promoted made the older generations run often: the
    collector was ~0.1 ms of the gateway's ~0.9 ms CPU per call at 64 sessions. Garbage
    in cycles is still collected, a little later (objects freed by their reference count,
    most of a call's, are freed at once as before)."""
    import gc

    from pipeline.common.gc_tuning import freeze_and_collect_young_every

    gc.collect()
    freeze_and_collect_young_every(GC_YOUNG_THRESHOLD)


def raise_open_files_limit(ceiling: int = 1 << 20) -> int:
    """Raise this process's soft limit on open files to its hard limit (at most
    ``ceiling``); the soft limit it runs under. Each concurrent session holds two sockets
    (the harness's and the engine's), so the common soft default of 1,024 would be a
    hidden cap near 500 sessions (a connection past it is a 502 for its session)."""
    try:
        import resource
    except ImportError:  # not on POSIX: nothing to raise
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # e.g. macOS's per-process maximum below the hard limit
            pass
    return soft


async def _serve(web, gateway, recorder, host: str, port: int) -> int:
    # keepalive_timeout closes a connection idle (or trickling its headers) that long.
    runner = web.AppRunner(
        gateway.app(), access_log=None, keepalive_timeout=gateway.config.client_timeout_s
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}; try --port 0") from None
    bound = runner.addresses[0][1]
    url = f"http://{host}:{bound}"
    recorder.manifest["listening"] = url
    recorder.write_manifest()
    print(
        f"seam gateway: listening on {url} → {gateway.config.upstream}; recording into "
        f"{recorder.out}\n  OpenAI clients:    base URL {url}/s/TASK_ID/ROLLOUT_ID/v1\n"
        f"  Anthropic clients: base URL {url}/s/TASK_ID/ROLLOUT_ID\n"
        f'  rewards:           POST {url}/s/TASK_ID/ROLLOUT_ID/reward {{"reward": 1.0}}\n'
        "  stop with Ctrl-C or SIGTERM",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    stats = gateway.stats
    print(
        f"seam gateway: stopped; {stats['calls']} calls recorded, {stats['corrected']} corrected "
        f"by the judge, {stats['errors']} upstream errors passed on",
        file=sys.stderr,
    )
    return 0
