"""``seam report``: one self-contained HTML page about a build directory.

The numbers come from the same views and standard queries as ``seam stats``
(``pipeline/inspect/duckdb_views.py``, ``pipeline/inspect/standard_queries.py``); ``figures.py`` draws the
plots and ``page.py`` lays them out. The judge sections (correction types, audit rates)
appear only for SFT builds, whose shards carry those columns.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.build.stats import HEADLINE_COUNTS
from pipeline.common import atomic
from pipeline.core.fidelity import COUNT_PREFIX
from pipeline.core.rows import EXCLUDED, EXCLUDED_PREFIX
from pipeline.core.witness import GAP_REASON, GAP_TOKENS, WITNESSED_CALLS
from pipeline.inspect.duckdb_views import connect, view_names
from pipeline.inspect.report.figures import FIGURES, png_bytes
from pipeline.inspect.report.page import Plot, ResultTable, render_page
from pipeline.inspect.standard_queries import STANDARD, available, build_counts


def build_report(build_dir: str | Path) -> tuple[str, list[Plot]]:
    """The page's HTML and its plots (``png`` None where the build had nothing to plot)."""
    out = Path(build_dir)
    con = connect(out)
    views = view_names(con)
    plots = []
    for spec in FIGURES:
        if set(spec.needs) <= set(views):
            fig = spec.draw(con)
            plots.append(
                Plot(
                    spec.key, spec.title, spec.caption, png_bytes(fig) if fig is not None else None
                )
            )
    tables = []
    for query in available(STANDARD, views):
        cursor = con.execute(query.sql)
        tables.append(
            ResultTable(query.title, [d[0] for d in cursor.description], cursor.fetchall())
        )
    counts, seams, groups_of_one = build_counts(con, out)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    facts = [
        ("build directory", str(out)),
        ("kind", manifest.get("kind", "unknown")),
        ("command", manifest.get("command") or "unknown"),
        ("seam version", manifest.get("seam_version", "unknown")),
        *((k.replace("_", " "), f"{counts[k]:,}") for k in HEADLINE_COUNTS),
        (
            "seams",
            ", ".join(f"{k} {n:,}" for k, n in sorted(seams.items()) if k != "none") or "none",
        ),
        ("task groups of one (advantage 0)", f"{groups_of_one:,}"),
        (
            "context fidelity (segments)",
            ", ".join(
                f"{k.removeprefix(COUNT_PREFIX)} {n:,}"
                for k, n in sorted(counts.items())
                if k.startswith(COUNT_PREFIX)
            )
            or "not recorded",
        ),
        (
            "second witness (reported input tokens)",
            f"{counts.get(WITNESSED_CALLS, 0):,} of {counts['calls']:,} calls witnessed; "
            f"{counts.get(COUNT_PREFIX + GAP_REASON, 0):,} segment(s) with an unexplained "
            f"context gap ({counts.get(GAP_TOKENS, 0):,} tokens)",
        ),
        *(
            (
                f"excluded segments{'' if k == EXCLUDED else ': ' + k.removeprefix(EXCLUDED_PREFIX)}",
                f"{n:,}",
            )
            for k, n in sorted(counts.items())
            if k == EXCLUDED or k.startswith(EXCLUDED_PREFIX)
        ),
    ]
    notes = (
        []
        if "corrections" in views
        else [
            "Judge correction types and summary audit rates appear for SFT builds (seam build-sft)."
        ]
    )
    return render_page(f"seam report: {out.name or out}", facts, plots, tables, notes), plots


def write_report(build_dir: str | Path, html_path: str | Path) -> list[Plot]:
    """Write the page to ``html_path`` atomically (its folder must exist); returns its plots."""
    html, plots = build_report(build_dir)
    path = Path(html_path)
    atomic.write_text(path, html)
    return plots
