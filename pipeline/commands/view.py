"""``seam view DIR``: browse a build on 127.0.0.1 (``pipeline/view.py``)."""

from __future__ import annotations

from pipeline.errors import UsageError


def run(args) -> int:
    from pipeline.view import make_server
    from pipeline.views import BuildDirError

    try:
        server = make_server(args.dir, args.port)
    except BuildDirError as exc:
        raise UsageError(str(exc)) from None
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
        "Read-only, no network needed. Ctrl-C stops it.",
    )
    p.add_argument("dir", help="A build directory.")
    p.add_argument("--port", type=int, default=8765, help="Port (default 8765; 0: any free port).")
    p.set_defaults(func=run)
