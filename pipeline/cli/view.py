"""``seam view DIR``: browse a build on 127.0.0.1 (``pipeline/inspect/view_server.py``)."""

from __future__ import annotations

from pipeline.common.errors import UsageError


def run(args) -> int:
    from pipeline.inspect.duckdb_views import Limits
    from pipeline.inspect.view_server import make_server
    from pipeline.inspect.view_worker import ViewLimits

    if args.timeout <= 0 or args.memory_mb < 64:
        raise UsageError("--timeout must be > 0 and --memory-mb at least 64")
    limits = ViewLimits(timeout_s=args.timeout, duckdb=Limits(memory_mb=args.memory_mb))
    try:
        server = make_server(args.dir, args.port, limits, tuple(args.allow_host))
    except OSError as exc:
        raise UsageError(
            f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror}; try --port 0"
        ) from None
    host, port = str(server.server_address[0]), server.server_address[1]
    print(
        f"serving {args.dir} read-only at http://{host}:{port}/ — press Ctrl-C to stop", flush=True
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped")
    finally:
        server.server_close()
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "view",
        help="Browse a build in a web browser (read-only, on 127.0.0.1).",
        description="Serve a build directory on 127.0.0.1: the rollout list with a DuckDB SQL "
        "filter over the rollouts view, the seam show page of every rollout, and the report. "
        "Read-only, no network needed. Ctrl-C stops it. The filter is one SQL condition over "
        "the build's views, run where it can read nothing but the build's files (no other "
        "file, URL or extension), stopped past --timeout, past --memory-mb, or when the "
        "browser leaves. Requests must name the server as 127.0.0.1, localhost or [::1] in "
        "their Host header (others get 403, against DNS rebinding); --allow-host adds a name.",
    )
    p.add_argument("dir", help="A build directory.")
    p.add_argument("--port", type=int, default=8765, help="Port (default 8765; 0: any free port).")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="Seconds a filter may run before it is stopped (default 10).",
    )
    p.add_argument(
        "--memory-mb",
        type=int,
        default=1024,
        help="DuckDB memory for a filter, in MB (default 1024; the filter process may hold "
        "512 MB more).",
    )
    from pipeline.common.http_guard import HostOptions
    from pipeline.common.options import add_options

    add_options(p, HostOptions)  # --allow-host, one definition with seam view/gateway
    p.set_defaults(func=run)
