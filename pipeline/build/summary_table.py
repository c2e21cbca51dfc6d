"""The closing summary table of a build (also printed by ``seam stats``)."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Table

from pipeline.core.fidelity import COUNT_PREFIX, EXACT
from pipeline.core.rows import EXCLUDED, EXCLUDED_PREFIX
from pipeline.core.witness import GAP_TOKENS, WITNESSED_CALLS


def summary_table(
    title: str, counts: dict, seams: dict, skipped: dict, groups_of_one: int
) -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("what")
    table.add_column("count", justify="right")
    read, accepted, quarantined = (
        counts.get("read", 0),
        counts.get("accepted", 0),
        counts.get("quarantined", 0),
    )
    table.add_row("rollouts read", f"{read:,}")
    table.add_row("accepted", f"{accepted:,}")
    table.add_row("quarantined", f"{quarantined:,}")
    if counts.get("quarantine_not_written"):  # past the caps of quarantine.jsonl (a sample)
        table.add_row(
            "  not written to quarantine.jsonl (past its cap; counted)",
            f"{counts['quarantine_not_written']:,}",
        )
    table.add_row(
        "read = accepted + quarantined", "yes" if read == accepted + quarantined else "[red]NO[/]"
    )
    _skipped_rows(table, skipped)
    table.add_row("segments", f"{counts.get('segments', 0):,}")
    for kind, n in sorted(seams.items()):
        if kind != "none":
            table.add_row(f"  seams: {kind}", f"{n:,}")
    for key, n in sorted(counts.items()):
        if key.startswith(COUNT_PREFIX):
            reason = key.removeprefix(COUNT_PREFIX)
            label = "context exact" if reason == EXACT else f"context not exact: {reason}"
            table.add_row(f"  {label}", f"{n:,}")
    witnessed = counts.get(WITNESSED_CALLS, 0)
    table.add_row(
        "  calls with a second witness (reported input tokens)",
        f"{witnessed:,} of {counts.get('calls', 0):,}",
    )
    if witnessed:
        table.add_row("  unexplained context gap (tokens)", f"{counts.get(GAP_TOKENS, 0):,}")
    if counts.get(EXCLUDED):
        table.add_row("  excluded segments (--exclude-fidelity)", f"{counts[EXCLUDED]:,}")
        for key, n in sorted(counts.items()):
            if key.startswith(EXCLUDED_PREFIX):
                table.add_row(f"    excluded: {key.removeprefix(EXCLUDED_PREFIX)}", f"{n:,}")
    table.add_row("  drift realigned (not split)", f"{counts.get('drift_realigned', 0):,}")
    if counts.get("dropped_truncated_segments"):
        table.add_row("  dropped truncated segments", f"{counts['dropped_truncated_segments']:,}")
    table.add_row("policy calls", f"{counts.get('calls', 0):,}")
    table.add_row("tokens", f"{counts.get('tokens', 0):,}")
    table.add_row("trainable tokens", f"{counts.get('trainable_tokens', 0):,}")
    if "rewards_matched" in counts or "rewards_unmatched" in counts:
        table.add_row("rewards matched (--rewards)", f"{counts.get('rewards_matched', 0):,}")
        table.add_row("rewards unmatched (--rewards)", f"{counts.get('rewards_unmatched', 0):,}")
    table.add_row("task groups of one (advantage 0)", f"{groups_of_one:,}")
    return table


# The build summary shows the total of records that are not model calls and only this
# many of its reasons (largest first): a session log has dozens of record types, and
# fifty rows of them buried the rows that matter. All of them: manifest.json "skipped".
SKIPPED_SHOWN = 3


def _skipped_rows(table: Table, skipped: dict) -> None:
    if not skipped:
        return
    table.add_row("skipped records (not model calls)", f"{sum(skipped.values()):,}")
    ranked = sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0]))
    for reason, n in ranked[:SKIPPED_SHOWN]:
        table.add_row(f"  {reason}", f"{n:,}")
    if len(ranked) > SKIPPED_SHOWN:
        rest = ranked[SKIPPED_SHOWN:]
        table.add_row(
            f"  {len(rest)} more reason(s) (manifest.json: skipped)",
            f"{sum(n for _, n in rest):,}",
        )


def table_console() -> Console:
    """The console for printed tables: the terminal's width in a terminal; elsewhere (a
    pipe, a log, CI) wide enough that file names and ids are not cut at 80 columns
    (``COLUMNS`` still wins)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=WIDE)


WIDE = 240


def print_summary(*args, **kwargs) -> None:
    table_console().print(summary_table(*args, **kwargs))


def step_times_table(workers, build, elapsed: float) -> Table:
    """Seconds per build step (``pipeline/common/step_times.py``): the workers' steps summed over
    the tasks (worker-seconds: with N workers they add up to about N × the tasks' elapsed
    time), then the build process's own, and the command's elapsed time."""
    table = Table(title=f"time per step ({elapsed:.2f} s elapsed)", header_style="bold")
    table.add_column("step")
    table.add_column("where")
    table.add_column("wall s", justify="right")
    table.add_column("CPU s", justify="right")
    table.add_column("share", justify="right")
    work = sum(wall for _, wall, _ in workers.ordered())
    for name, wall, cpu in workers.ordered():
        share = f"{wall / work:.0%}" if work > 0 else ""
        table.add_row(name, "workers", f"{wall:.2f}", f"{cpu:.2f}", share)
    for name, wall, cpu in build.ordered():
        table.add_row(name, "build", f"{wall:.2f}", f"{cpu:.2f}", "")
    return table
