"""``seam report DIR --html FILE``: one self-contained HTML page with plots and tables."""

from __future__ import annotations

from pathlib import Path

from pipeline.common import extras
from pipeline.common.errors import UsageError


def check_destination(html: str, overwrite: bool) -> None:
    """Refuse, before any work, a FILE whose folder is missing (a typo must not create a
    tree of folders) or that exists without ``--overwrite``."""
    path = Path(html)
    if not path.parent.is_dir():
        raise UsageError(f"--html {html}: folder {path.parent} does not exist (create it first)")
    if path.is_dir():
        raise UsageError(f"--html {html} is a folder; name the HTML file to write")
    if path.exists() and not overwrite:
        raise UsageError(f"--html {html} exists; pass --overwrite to replace it")


def run(args) -> int:
    extras.require("report", "report")  # before the import below, which needs matplotlib
    from pipeline.inspect.report import write_report

    check_destination(args.html, args.overwrite)
    plots = write_report(args.dir, args.html)
    drawn = sum(p.png is not None for p in plots)
    empty = [p.title for p in plots if p.png is None]
    print(
        f"wrote {args.html}: {drawn} plot(s)"
        + (f"; nothing to plot for: {', '.join(empty)}" if empty else "")
    )
    return 0


def register(sub) -> None:
    from pipeline.build.config import OutputConfig
    from pipeline.common.options import add_options

    p = sub.add_parser(
        "report",
        help="Write one self-contained HTML report (plots + tables) about a build directory.",
        description="Plots compactions per rollout, summary length, trainable vs context tokens per segment, pass "
        "rate by number of compactions, advantages, seams by kind, quarantine reasons and, for SFT "
        "builds, judge correction types and summary audit rates; then the standard tables of "
        "`seam stats`. Images are embedded, nothing is fetched: the file opens offline.",
    )
    p.add_argument("dir", help="A build directory (with train-*.parquet shards).")
    p.add_argument(
        "--html",
        required=True,
        metavar="FILE",
        help="Where to write the report (e.g. out/report.html); its folder must exist.",
    )
    add_options(p, OutputConfig, only=("overwrite",))
    p.set_defaults(func=run)
