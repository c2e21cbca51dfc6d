"""``seam view DIR``: a read-only browser for a build, served on 127.0.0.1 (stdlib).

- ``/``: the rollout list, filtered by a DuckDB condition over the ``rollouts`` view
  (``?where=num_compactions >= 2 AND NOT passed``; one statement, no ``;``);
- ``/rollout/<id>``: the ``seam show --html`` page of one rollout;
- ``/report``: the ``seam report`` page (plots embedded).

Only GET is answered; nothing is written; every page is self-contained (no script, no
network), so it works offline.
"""

from __future__ import annotations

from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

LIST_LIMIT = 1000  # rollouts listed per page: a filter finds the others

LIST_COLUMNS = [
    "rollout_id",
    "task_id",
    "source",
    "reward",
    "passed",
    "num_compactions",
    "num_segments",
    "num_calls",
    "tokens",
    "trainable_tokens",
]

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

    def __init__(self, build_dir: str | Path):
        from pipeline.views import connect

        self.dir = Path(build_dir)
        connect(self.dir)  # fail now, with its one-line reason, if this is no build

    def page(self, path: str) -> tuple[int, str]:
        url = urlsplit(path)
        if url.path == "/":
            where = parse_qs(url.query).get("where", [""])[0].strip()
            return self.rollout_list(where)
        if url.path.startswith("/rollout/"):
            return self.rollout(unquote(url.path[len("/rollout/") :]))
        if url.path == "/report":
            from pipeline.report import build_report

            return 200, build_report(self.dir)[0]
        return 404, _page(
            "not found", f"<p>No page {escape(url.path)}. <a href='/'>Rollouts</a></p>"
        )

    def rollout_list(self, where: str) -> tuple[int, str]:
        from pipeline.views import connect

        form = (
            "<form method=get action='/'><input name=where placeholder=\"SQL condition on the "
            'rollouts view, e.g. num_compactions &gt;= 2 AND NOT passed" '
            f"value=\"{escape(where)}\"><button>filter</button> <a href='/'>all</a> "
            "<a href='/report'>report</a></form>"
        )
        if ";" in where:
            return 400, _page("rollouts", form + "<p class=error>one condition, no ';'</p>")
        sql = f"SELECT {', '.join(LIST_COLUMNS)} FROM rollouts"
        if where:
            sql += f" WHERE ({where})"
        try:
            con = connect(self.dir)
            (total,) = con.execute(f"SELECT count(*) FROM ({sql})").fetchone() or (0,)
            rows = con.execute(f"{sql} ORDER BY rollout_id LIMIT {LIST_LIMIT}").fetchall()
        except Exception as exc:  # the user's SQL: its one-line error, on the page
            message = escape(str(exc).splitlines()[0])
            return 400, _page("rollouts", form + f"<p class=error>{message}</p>")
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
        from pipeline.show.html import render_html
        from pipeline.show.load import ShowError, load_view

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


def make_server(build_dir: str | Path, port: int = 8765) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:``port`` (0: any free port) for ``build_dir``; not started."""
    browser = BuildBrowser(build_dir)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, html = browser.page(self.path)
            data = html.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # quiet: the terminal says how to stop, not every hit
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)
