"""``seam gateway --upstream URL --out DIR``: record token-exact rollouts between any harness
and an OpenAI-compatible engine, with the Judge in the loop (``pipeline/gateway/``)."""

from __future__ import annotations

import asyncio
import os
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
    p.add_argument(
        "--upstream",
        required=True,
        metavar="URL",
        help="Base URL of the OpenAI-compatible engine, including /v1 (e.g. http://127.0.0.1:8000/v1). "
        "A key in it (user:KEY@ or ?key=/api_key=...) is sent as a header, never printed or "
        "recorded.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="Collection directory (created).")
    p.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1).")
    p.add_argument(
        "--port", type=int, default=8788, help="Port (default 8788; 0 picks a free one)."
    )
    from pipeline.common.http_guard import HostOptions
    from pipeline.common.options import add_options

    add_options(p, HostOptions)  # --allow-host, one definition with seam view/gateway
    p.add_argument(
        "--durability",
        choices=["group", "sync", "none"],
        default="group",
        help="group (default): each call's line is written before it is answered (survives a "
        "killed gateway) and fsync'd in background rounds at most 50 ms later (an OS crash or "
        "power loss loses at most that window); sync: answered only after its line is "
        "fsync'd, concurrent calls sharing one fsync (survives a power loss); none: never "
        "fsync'd (survives a killed gateway, not an OS crash).",
    )
    p.add_argument(
        "--log",
        choices=["delta", "full"],
        default="delta",
        help="delta (default): a call that extends its session's previous call is stored as "
        "the messages and prompt ids it adds, with a full record at least every --full-every "
        "calls (the log grows about linearly, not with the square of the session); full: "
        "every call's whole request and prompt ids. Both build the same rows.",
    )
    p.add_argument(
        "--full-every",
        type=int,
        default=32,
        metavar="K",
        help="With --log delta, a full record at least every K calls of a session (default "
        "32): a cut or unreadable line costs at most the calls up to the next full record.",
    )
    p.add_argument(
        "--client-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="A client connection that sends no whole request within S seconds (idle, or "
        "trickling its headers or body) is closed (default 60).",
    )
    p.add_argument(
        "--token-ids",
        choices=["auto", "on", "off"],
        default="auto",
        help="Ask the engine for token ids and logprobs (vLLM/SGLang 'return_token_ids', "
        "'logprobs'). auto: ask, and stop asking if the engine rejects them; off: text only.",
    )
    p.add_argument(
        "--upstream-connections",
        type=int,
        default=0,
        metavar="N",
        help="At most N connections to the engine at once (default 0: no cap, so hundreds of "
        "concurrent sessions are not queued behind each other).",
    )
    p.add_argument(
        "--max-response-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help="An engine answer larger than this is refused (502) and not recorded (default 64).",
    )
    p.add_argument(
        "--upstream-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="Total seconds one engine call may take (default 600).",
    )
    p.add_argument(
        "--upstream-connect-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="Seconds to open a connection to the engine, TLS included (default 30).",
    )
    p.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="Environment variable holding the engine's API key (sent as a bearer token).",
    )
    p.add_argument(
        "--judge",
        metavar="rules|URL",
        help="Review every candidate response before the harness sees it: 'rules' (seam's "
        "rule judge; corrects summaries that drop key state) or the URL of an HTTP judge "
        "(see docs/gateway.md for its JSON contract). Off by default.",
    )
    p.add_argument(
        "--judge-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="Seconds an HTTP judge may take; after that the original goes through (default 30).",
    )
    p.add_argument(
        "--summary-prompt",
        action="append",
        metavar="REGEX",
        help="A regular expression that marks a request's last user message as a compaction "
        "prompt (its call becomes a summary call). Repeatable; replaces the defaults "
        "(Claude Code, Codex, OpenHands prompts).",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from pipeline.common import extras

    extras.require("gateway", "gateway")
    from aiohttp import web

    from judge.loop_judge import RuleJudge
    from pipeline.common.credentials import split_url
    from pipeline.gateway.judging import HttpJudge
    from pipeline.gateway.recorder import Recorder
    from pipeline.gateway.server import (
        DEFAULT_SUMMARY_PROMPTS,
        Gateway,
        GatewayConfig,
        event_loop_factory,
    )

    # Only the URLs without their credentials are ever printed or recorded.
    upstream = split_url(args.upstream).url
    judge_name = split_url(args.judge).url if args.judge and args.judge != "rules" else args.judge
    if not args.upstream.startswith(("http://", "https://")):
        raise UsageError(
            f"--upstream {upstream!r}: give an http(s) URL such as http://127.0.0.1:8000/v1"
        )
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise UsageError(f"--api-key-env {args.api_key_env}: that variable is not set")
    judge_factory: Callable[[Any], Any] | None = None
    if args.judge == "rules":
        judge_factory = lambda client: RuleJudge()  # noqa: E731
    elif args.judge:
        if not args.judge.startswith(("http://", "https://")):
            raise UsageError(f"--judge {judge_name!r}: give 'rules' or an http(s) URL")
        judge_factory = lambda client: HttpJudge(args.judge, client, args.judge_timeout)  # noqa: E731
    if args.full_every < 1 or args.client_timeout <= 0:
        raise UsageError("--full-every must be 1 or more and --client-timeout positive")
    if args.upstream_connections < 0 or args.max_response_mb <= 0:
        raise UsageError("--upstream-connections must be 0 or more and --max-response-mb positive")
    if args.upstream_timeout <= 0 or args.upstream_connect_timeout <= 0:
        raise UsageError("--upstream-timeout and --upstream-connect-timeout must be positive")
    config = GatewayConfig(
        upstream=args.upstream,
        token_ids=args.token_ids,
        upstream_timeout_s=args.upstream_timeout,
        upstream_connections=args.upstream_connections,
        upstream_connect_timeout_s=args.upstream_connect_timeout,
        max_response_bytes=int(args.max_response_mb * (1 << 20)),
        summary_prompts=tuple(args.summary_prompt or DEFAULT_SUMMARY_PROMPTS),
        api_key=api_key,
        listen_host=args.host,
        allow_hosts=tuple(args.allow_host),
        log=args.log,
        full_every=args.full_every,
        client_timeout_s=args.client_timeout,
    )
    raise_open_files_limit()  # before the recorder: it keeps logs open within the limit
    recorder = Recorder(
        Path(args.out),
        {
            "upstream": upstream,
            "judge": judge_name or None,
            "token_ids_mode": args.token_ids,
            "log": args.log if args.log == "full" else f"delta, full every {args.full_every}",
        },
        durability=args.durability,
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
            return runner.run(_serve(web, gateway, recorder, args.host, args.port))
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

    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


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
