"""``seam sql DIR "SELECT ..."``: any query over a build's views (``pipeline/inspect/duckdb_views.py``)."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

from pipeline.common.errors import UsageError

WRAP_WIDTH = 24


def open_views(path: str | Path):
    """``views.connect`` (a ``BuildDirError`` is a ``SeamError``: one line from ``seam``)."""
    from pipeline.inspect.duckdb_views import connect

    return connect(path)


def print_result(
    console, columns: list[str], rows: list[tuple], max_rows: int | None = None
) -> None:
    """A query result as a table, or as one block of ``column  value`` lines per row
    when a table would squeeze its columns unreadably (wide views such as ``rollouts``).
    Long cells may wrap: a column needs at most ``WRAP_WIDTH`` characters to fit."""
    from rich.table import Table

    shown = rows[:max_rows]
    cells = [[_cell(v) for v in row] for row in shown]
    widths = [
        min(WRAP_WIDTH, max([len(name)] + [len(r[i]) for r in cells]))
        for i, name in enumerate(columns)
    ]
    if sum(widths) + 3 * len(columns) + 1 <= console.width:
        table = Table(show_header=True, header_style="bold")
        for name in columns:
            table.add_column(name)
        for row in cells:
            table.add_row(*row)
        console.print(table)
    else:
        pad = max(len(c) for c in columns)
        for n, row in enumerate(cells):
            console.print(f"[dim]-- row {n + 1}[/]")
            for name, value in zip(columns, row):
                indented = value.replace("\n", "\n" + " " * (pad + 2))
                console.print(f"{name:>{pad}}  {indented}", highlight=False)
    if max_rows is not None and len(rows) > max_rows:
        console.print(
            f"[dim]{len(rows) - max_rows:,} more row(s); use --csv or --json for all of them[/]"
        )


def _cell(value) -> str:
    if value is None:
        return "[dim]null[/]"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value).replace("[", r"\[")


def run(args) -> int:
    import duckdb
    from rich.console import Console

    from pipeline.inspect.duckdb_views import view_names

    con = open_views(args.dir)
    console = Console()
    if args.query is None:
        for name in view_names(con):
            columns = con.execute(f"DESCRIBE {name}").fetchall()
            console.print(f"[bold]view {name}[/]")
            print_result(console, ["column", "type"], [(c[0], c[1]) for c in columns])
        return 0
    try:
        cursor = con.execute(args.query)
    except duckdb.Error as exc:
        raise UsageError(
            f"{type(exc).__name__}: {str(exc).splitlines()[0]} (views: {', '.join(view_names(con))})"
        ) from None
    if cursor.description is None:
        return 0
    columns = [d[0] for d in cursor.description]
    rows = cursor.fetchall()
    if args.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    elif args.json:
        for row in rows:
            print(json.dumps(dict(zip(columns, row)), default=str, ensure_ascii=False))
    else:
        print_result(console, columns, rows, args.max_rows)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "sql",
        help="Run a SQL query over a build's views (DuckDB).",
        description="Run one DuckDB SQL query over the build directory's views: segments (shard rows), "
        "rollouts (one row per rollout), calls (one row per generated output), quarantine "
        "(rejected records) and, for SFT builds, corrections and audit. Without a query, list the "
        "views and their columns. See docs/data.md for the columns and example queries. "
        "The query runs with DuckDB's full access, as your own user: it can read any file you "
        "can (read_csv, read_text, glob), write files (COPY) and load extensions. That is "
        "the point of a query you type on your own machine; never pass it text from someone "
        "else. seam view, which takes filters from a browser, runs them locked down instead.",
    )
    p.add_argument("dir", help="A build directory (with train-*.parquet shards).")
    p.add_argument(
        "query",
        nargs="?",
        help='The query, e.g. "SELECT num_compactions, avg(passed::INT) FROM rollouts GROUP BY 1".',
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--csv", action="store_true", help="Print all rows as CSV (header first).")
    out.add_argument("--json", action="store_true", help="Print all rows as JSON lines.")
    p.add_argument(
        "--max-rows",
        type=int,
        default=100,
        help="Rows shown in the table (default 100; --csv/--json print all).",
    )
    p.set_defaults(func=run)
