"""What ``seam gateway`` is configured by, each setting defined once (issue 24, item 3:
``pipeline/common/options.py``): ``GatewayConfig``, what the server runs by, and
``GatewayOptions``, the command's flags that are not the server's (where it records, the
port, the judge). The flags, their defaults and help are generated from these fields.

Apart from ``server.py`` (which imports aiohttp, an extra) so that the command line
is built without it: ``seam --help`` works where the ``gateway`` extra is not installed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pipeline.common.http_guard import HostOptions
from pipeline.common.options import MIB, flag_of, in_mib, option
from pipeline.readers.call_delta import FULL_EVERY

DEFAULT_SUMMARY_PROMPTS = (
    r"create a detailed summary of the conversation",  # Claude Code /compact and auto-compact
    r"CONTEXT CHECKPOINT COMPACTION",  # Codex
    r"context-aware state summary",  # OpenHands LLM summarizing condenser
    r"summari[sz]e the conversation (so far|above)",
)


def _summary_prompts(given: list[str] | None) -> tuple[str, ...]:
    # The flag's default is None, not the defaults: argparse appends to a default list,
    # and a --summary-prompt replaces the defaults.
    return tuple(given) if given else DEFAULT_SUMMARY_PROMPTS


# Each range check below keeps the line the command printed before the options moved here
# (two flags shared one line; tests and users match on it).
_FULL_EVERY_OR_CLIENT_TIMEOUT = "--full-every must be 1 or more and --client-timeout positive"
_CONNECTIONS_OR_RESPONSE = "--upstream-connections must be 0 or more and --max-response-mb positive"
_UPSTREAM_TIMEOUTS = "--upstream-timeout and --upstream-connect-timeout must be positive"


def _positive(value: float) -> bool:
    return value > 0


# A duration flag that must be positive (its range error is the option's own).
_POSITIVE_SECONDS = {"type": float, "metavar": "S", "check": _positive}


@dataclass
class GatewayConfig:
    # Base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (a key in it is
    # split off by the server, and by the command before anything prints it).
    upstream: str = option(
        flag="--upstream",
        required=True,
        metavar="URL",
        help="Base URL of the OpenAI-compatible engine, including /v1 (e.g. "
        "http://127.0.0.1:8000/v1). A key in it (user:KEY@ or ?key=/api_key=...) is sent as a "
        "header, never printed or recorded.",
    )
    token_ids: str = option(
        "auto",
        flag="--token-ids",
        choices=("auto", "on", "off"),
        help="Ask the engine for token ids and logprobs (vLLM/SGLang 'return_token_ids', "
        "'logprobs'). auto: ask, and stop asking if the engine rejects them; off: text only.",
    )
    upstream_timeout_s: float = option(
        600.0,
        flag="--upstream-timeout",
        **_POSITIVE_SECONDS,
        error=_UPSTREAM_TIMEOUTS,
        help="Total seconds one engine call may take (default {default}).",
    )
    summary_prompts: tuple[str, ...] = option(
        DEFAULT_SUMMARY_PROMPTS,
        flag="--summary-prompt",
        repeatable=True,
        metavar="REGEX",
        flag_default=None,
        to_field=_summary_prompts,
        help="A regular expression that marks a request's last user message as a compaction "
        "prompt (its call becomes a summary call). Repeatable; replaces the defaults "
        "(Claude Code, Codex, OpenHands prompts).",
    )
    # Sent upstream as a bearer token (unless the URL holds a key); the command line names
    # the environment variable that holds it, never the key itself.
    api_key: str | None = option(
        None,
        flag="--api-key-env",
        metavar="NAME",
        check=lambda name: not name or bool(os.environ.get(name)),
        error="--api-key-env {value}: that variable is not set",
        to_field=lambda name: os.environ.get(name) if name else None,
        help="Environment variable holding the engine's API key (sent as a bearer token).",
    )
    # Who may call (pipeline/common/http_guard.py): the address it listens on (a wildcard
    # address checks no Host), and more names a fleet reaches it by (--allow-host).
    listen_host: str = option(
        "127.0.0.1", flag="--host", help="Address to listen on (default {default})."
    )
    allow_hosts: tuple[str, ...] = option(factory=tuple, **flag_of(HostOptions, "allow_host"))
    # Connections to the engine: 0 = no cap (aiohttp's default of 100 queued the 101st
    # of 200 concurrent sessions behind the others: 422 ms median vs 252 ms direct).
    upstream_connections: int = option(
        0,
        flag="--upstream-connections",
        type=int,
        metavar="N",
        check=lambda n: n >= 0,
        error=_CONNECTIONS_OR_RESPONSE,
        help="At most N connections to the engine at once (default {default}: no cap, so "
        "hundreds of concurrent sessions are not queued behind each other).",
    )
    upstream_connect_timeout_s: float = option(
        30.0,
        flag="--upstream-connect-timeout",
        **_POSITIVE_SECONDS,
        error=_UPSTREAM_TIMEOUTS,
        help="Seconds to open a connection to the engine, TLS included (default {default}).",
    )
    # An engine answer larger is a 502; the flag gives MiB.
    max_response_bytes: int = option(
        64 * MIB,
        flag="--max-response-mb",
        **in_mib(),
        check=_positive,
        error=_CONNECTIONS_OR_RESPONSE,
        help="An engine answer larger than this is refused (502) and not recorded (default "
        "{default}).",
    )
    # The call log (pipeline/readers/call_delta.py): "delta" stores a call as what it adds
    # to the previous call of its session, with a full record at least every full_every.
    log: str = option(
        "delta",
        flag="--log",
        choices=("delta", "full"),
        help="delta (default): a call that extends its session's previous call is stored as "
        "the messages and prompt ids it adds, with a full record at least every --full-every "
        "calls (the log grows about linearly, not with the square of the session); full: "
        "every call's whole request and prompt ids. Both build the same rows.",
    )
    full_every: int = option(
        FULL_EVERY,
        flag="--full-every",
        type=int,
        metavar="K",
        check=lambda k: k >= 1,
        error=_FULL_EVERY_OR_CLIENT_TIMEOUT,
        help="With --log delta, a full record at least every K calls of a session (default "
        "{default}): a cut or unreadable line costs at most the calls up to the next full "
        "record.",
    )
    # A client connection that sends no whole request for this long is closed (idle, or
    # trickling its headers: aiohttp's keep-alive timer), and a body must arrive within it.
    client_timeout_s: float = option(
        60.0,
        flag="--client-timeout",
        **_POSITIVE_SECONDS,
        error=_FULL_EVERY_OR_CLIENT_TIMEOUT,
        help="A client connection that sends no whole request within S seconds (idle, or "
        "trickling its headers or body) is closed (default {default}).",
    )


@dataclass(frozen=True)
class GatewayOptions:
    """The flags of ``seam gateway`` that are the command's, not the server's."""

    out: str = option(
        flag="--out", required=True, metavar="DIR", help="Collection directory (created)."
    )
    port: int = option(
        8788, flag="--port", type=int, help="Port (default {default}; 0 picks a free one)."
    )
    durability: str = option(
        "group",
        flag="--durability",
        choices=("group", "sync", "none"),  # pipeline/gateway/recorder.py's DURABILITY_MODES
        help="group (default): each call's line is written before it is answered (survives a "
        "killed gateway) and fsync'd in background rounds at most 50 ms later (an OS crash or "
        "power loss loses at most that window); sync: answered only after its line is "
        "fsync'd, concurrent calls sharing one fsync (survives a power loss); none: never "
        "fsync'd (survives a killed gateway, not an OS crash).",
    )
    judge: str | None = option(
        None,
        flag="--judge",
        metavar="rules|URL",
        help="Review every candidate response before the harness sees it: 'rules' (seam's "
        "rule judge; corrects summaries that drop key state) or the URL of an HTTP judge "
        "(see docs/gateway.md for its JSON contract). Off by default.",
    )
    judge_timeout: float = option(
        30.0,
        flag="--judge-timeout",
        type=float,
        metavar="S",
        help="Seconds an HTTP judge may take; after that the original goes through (default "
        "{default}).",
    )


# The order ``seam gateway --help`` lists the flags in (as before they were defined here).
FLAG_ORDER = (
    (GatewayConfig, "upstream"),
    (GatewayOptions, "out"),
    (GatewayConfig, "listen_host"),
    (GatewayOptions, "port"),
    (GatewayConfig, "allow_hosts"),
    (GatewayOptions, "durability"),
    (GatewayConfig, "log"),
    (GatewayConfig, "full_every"),
    (GatewayConfig, "client_timeout_s"),
    (GatewayConfig, "token_ids"),
    (GatewayConfig, "upstream_connections"),
    (GatewayConfig, "max_response_bytes"),
    (GatewayConfig, "upstream_timeout_s"),
    (GatewayConfig, "upstream_connect_timeout_s"),
    (GatewayConfig, "api_key"),
    (GatewayOptions, "judge"),
    (GatewayOptions, "judge_timeout"),
    (GatewayConfig, "summary_prompts"),
)
