"""``seam stats DIR``: the build summary recomputed from the shards, then the standard tables."""

from __future__ import annotations

from pathlib import Path

from pipeline.cli.sql import open_views, print_result


def run(args) -> int:
    from pipeline.build.summary_table import summary_table, table_console
    from pipeline.inspect.duckdb_views import view_names
    from pipeline.inspect.standard_queries import STANDARD, available, build_counts

    out = Path(args.dir)
    con = open_views(out)
    counts, seams, groups_of_one = build_counts(con, out)
    console = table_console()
    console.print(summary_table(f"seam stats {out}", counts, seams, {}, groups_of_one))
    for query in available(STANDARD, view_names(con)):
        cursor = con.execute(query.sql)
        rows = cursor.fetchall()
        console.print(f"\n[bold]{query.title}[/]" + ("" if rows else ": none"))
        if rows:
            print_result(console, [d[0] for d in cursor.description], rows)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "stats",
        help="Summarize a build directory from its shards (DuckDB).",
        description="Recompute the build summary (rollouts, segments, seams by kind, tokens, "
        "trainable tokens, groups of one) from the Parquet shards with DuckDB, then print "
        "the standard tables: pass rate by number of compactions, summary length "
        "percentiles, tool calls per rollout, seams by kind and source, quarantine "
        "reasons, context fidelity, the second witness per source (share of calls whose "
        "reported input tokens are checked, share of segments flagged), and for SFT builds judge corrections and summary audit rates. "
        "`seam sql DIR` runs your own queries over the same views.",
    )
    p.add_argument("dir", help="A build directory (with train-*.parquet shards).")
    p.set_defaults(func=run)
