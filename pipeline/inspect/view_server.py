"""``seam view DIR``: a read-only browser for a build, served on 127.0.0.1 (stdlib).

- ``/``: the rollout list, filtered by a DuckDB condition over the build's views
  (``?where=num_compactions >= 2 AND NOT passed``), run in a locked-down child process
  (``pipeline/inspect/view_worker.py``, ``pipeline/inspect/view_filter.py``): it can read only the
  build's files and is stopped at the timeout, past its memory, or when the client goes;
- ``/rollout/<id>``: the ``seam show --html`` page of one rollout;
- ``/report``: the ``seam report`` page (plots embedded).

Only GET is answered, and only for a ``Host`` the server is known by (127.0.0.1,
localhost, [::1], or a name given with ``--allow-host``): a page elsewhere whose name is
rebound to 127.0.0.1 (DNS rebinding) sends its own name and gets 403. Nothing is written;
every page is self-contained (no script, no network), so it works offline.
"""

from __future__ import annotations

import select
import socket
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from pipeline.common.http_guard import host_allowed, names
from pipeline.inspect.view_filter import LIST_COLUMNS, FilterError
from pipeline.inspect.view_worker import ClientGone, FilterWorker, ViewLimits

CSS = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;padding:1rem;max-width:70rem}
form{display:flex;flex-wrap:wrap;gap:.5rem;margin:.8rem 0}
input[name=where]{flex:1 1 20rem;font:14px ui-monospace,monospace;padding:.3rem}
.table{overflow-x:auto}
table{border-collapse:collapse;font-size:14px}
th,td{border-bottom:1px solid #ddd;padding:.2rem .5rem;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
.error{color:#a3231b;background:#fdeceb;padding:.4rem}
"""


class BuildBrowser:
    """The pages of one build directory (the server's handler calls ``page``)."""

    def __init__(self, build_dir: str | Path, limits: ViewLimits | None = None):
        self.dir = Path(build_dir)
        self.filters = FilterWorker(self.dir, limits or ViewLimits())
        self.filters.start()  # fail now, with its one-line reason, if this is no build

    def page(self, path: str, client_gone=lambda: False) -> tuple[int, str]:
        """The status and HTML of ``path``; ``ClientGone`` when the client left mid-filter."""
        url = urlsplit(path)
        if url.path == "/":
            where = parse_qs(url.query).get("where", [""])[0].strip()
            return self.rollout_list(where, client_gone)
        if url.path.startswith("/rollout/"):
            return self.rollout(unquote(url.path[len("/rollout/") :]))
        if url.path == "/report":
            from pipeline.common import extras

            if not extras.installed("report"):  # the rest of the browser works without it
                message = str(extras.MissingExtra("view /report", "report"))
                return 501, _page("report", f"<p class=error>{escape(message)}</p>")
            from pipeline.inspect.report import build_report

            return 200, build_report(self.dir)[0]
        return 404, _page(
            "not found", f"<p>No page {escape(url.path)}. <a href='/'>Rollouts</a></p>"
        )

    def rollout_list(self, where: str, client_gone=lambda: False) -> tuple[int, str]:
        form = (
            "<form method=get action='/'><input name=where placeholder=\"SQL condition on the "
            'rollouts view, e.g. num_compactions &gt;= 2 AND NOT passed" '
            f"value=\"{escape(where)}\"><button>filter</button> <a href='/'>all</a> "
            "<a href='/report'>report</a></form>"
        )
        try:
            total, rows = self.filters.rollouts(where, client_gone)
        except FilterError as exc:  # the filter's one-line reason, on the page
            return 400, _page("rollouts", form + f"<p class=error>{escape(str(exc))}</p>")
        head = "".join(f"<th>{c}</th>" for c in LIST_COLUMNS)
        body = "".join(
            "<tr>"
            + f"<td><a href='/rollout/{quote(r[0], safe='')}'>{escape(r[0])}</a></td>"
            + "".join(f"<td>{escape(_cell(v))}</td>" for v in r[1:])
            + "</tr>"
            for r in rows
        )
        count = f"<p id=count>{total} rollout(s)"
        if total > len(rows):
            count += f"; the first {len(rows)} by id are listed: narrow the list with a condition"
        count += "</p>"
        table = f"<div class=table><table><tr>{head}</tr>{body}</table></div>"
        return 200, _page(f"seam view {self.dir}", form + count + table)

    def rollout(self, rollout_id: str) -> tuple[int, str]:
        from pipeline.inspect.show.html import render_html
        from pipeline.inspect.show.load import ShowError, load_view

        try:
            view = load_view(self.dir, rollout_id)
        except ShowError as exc:
            return 404, _page("not found", f"<p class=error>{escape(str(exc))}</p>")
        page = render_html(view)
        return 200, page.replace("<body>", "<body><p><a href='/'>← rollouts</a></p>", 1)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1>{body}</body></html>\n"
    )


def client_gone(sock: socket.socket) -> bool:
    """Whether the client closed its connection: readable with nothing left to read."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True


class ViewServer(ThreadingHTTPServer):
    """The HTTP server; closing it stops the filter process too."""

    browser: BuildBrowser

    def server_close(self) -> None:
        super().server_close()
        self.browser.filters.close()


def make_server(
    build_dir: str | Path,
    port: int = 8765,
    limits: ViewLimits | None = None,
    allow_hosts: tuple[str, ...] = (),
) -> ViewServer:
    """A server on 127.0.0.1:``port`` (0: any free port) for ``build_dir``; not started.
    It answers requests whose ``Host`` is 127.0.0.1, localhost, [::1] or one of
    ``allow_hosts``, and 403 to any other."""
    browser = BuildBrowser(build_dir, limits)
    allowed = names(None, allow_hosts)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            host = self.headers.get("Host")
            if not host_allowed(host, allowed):
                self.answer(403, _page("forbidden", _host_refusal(host)))
                return
            try:
                status, html = browser.page(self.path, lambda: client_gone(self.connection))
            except ClientGone:  # nobody to answer; the filter was stopped
                self.close_connection = True
                return
            self.answer(status, html)

        def answer(self, status: int, html: str) -> None:
            data = html.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # quiet: the terminal says how to stop, not every hit
            pass

    try:
        server = ViewServer(("127.0.0.1", port), Handler)
    except OSError:
        browser.filters.close()
        raise
    allowed.add(str(server.server_address[0]))  # the bound address, whatever it is
    server.browser = browser
    return server


def _host_refusal(host: str | None) -> str:
    return (
        f"<p class=error>Host {escape(repr(host))} is not one this server answers: seam view "
        "answers only http://127.0.0.1, http://localhost and http://[::1] (a page that "
        "rebinds its own name to this machine is refused). Another name: seam view "
        "--allow-host NAME.</p>"
    )
