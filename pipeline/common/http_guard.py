"""Who may talk to seam's local HTTP servers (``seam view``, ``seam gateway``).

Both listen on 127.0.0.1 by default, where any web page the user opens can reach them:
- **DNS rebinding**: a page whose name is rebound to 127.0.0.1 talks to the server as
  its own origin; its requests carry its own name in ``Host`` (and ``Origin``), so a
  server that answers only the names it is known by refuses them (``host_allowed``);
- **cross-site requests**: a page elsewhere can POST a "simple" request (``text/plain``,
  a form) without asking first; the gateway takes only JSON bodies (``is_json``: any
  other content type would need a CORS preflight, which it does not answer) and refuses
  a browser ``Origin`` that is not one of its names (``origin_allowed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pipeline.common.options import option

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class HostOptions:
    """The names a server answers to besides loopback and its address: ``--allow-host``,
    one definition for ``seam view`` and ``seam gateway``."""

    allow_host: tuple[str, ...] = option(
        factory=tuple,
        flag="--allow-host",
        repeatable=True,
        metavar="NAME",
        to_flag=list,
        to_field=tuple,
        help="Also answer requests whose Host header is NAME (repeatable): a name in "
        "/etc/hosts for 127.0.0.1, or the name a fleet reaches the gateway by. Requests whose "
        "Host is not 127.0.0.1, localhost, [::1], the listening address or one of these are "
        "refused (403), and so are browser requests from another Origin: a web page cannot "
        "use the server (docs/robustness.md). The gateway listening on 0.0.0.0 checks the "
        "Host only when --allow-host is given (docs/gateway.md).",
    )


def names(listen_host: str | None, extra: tuple[str, ...] | list[str] = ()) -> set[str]:
    """The host names a server listening on ``listen_host`` answers to (lower case, no
    brackets or trailing dot): loopback, the address it listens on, and ``extra``."""
    given = [*LOOPBACK_HOSTS, *extra]
    if listen_host and listen_host not in WILDCARD_HOSTS:
        given.append(listen_host)
    return {h.lower().strip("[]").rstrip(".") for h in given}


def _hostname(authority: str) -> str | None:
    try:
        name = urlsplit("//" + authority).hostname
    except ValueError:
        return None
    return name.rstrip(".") if name is not None else None


def host_allowed(header: str | None, allowed: set[str]) -> bool:
    """Whether a ``Host`` header (``name``, ``name:port``, ``[v6]:port``) names one of
    ``allowed`` (lower case); a request without one is refused too."""
    if not header:
        return False
    name = _hostname(header)
    return name is not None and name in allowed


def origin_allowed(origin: str | None, allowed: set[str]) -> bool:
    """Whether a request's ``Origin`` is absent (not a browser: SDKs, curl, harnesses)
    or an http(s) origin whose host is one of ``allowed``; ``null`` is refused."""
    if origin is None:
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    name = _hostname(parts.netloc)
    return name is not None and name in allowed


def is_json(content_type: str | None) -> bool:
    """``application/json`` or a ``+json`` type (parameters such as charset ignored)."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )
