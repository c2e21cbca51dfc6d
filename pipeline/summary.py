"""The closing summary table of a build (also printed by ``seam stats``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pipeline.fidelity import COUNT_PREFIX, EXACT


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
    table.add_row(
        "read = accepted + quarantined", "yes" if read == accepted + quarantined else "[red]NO[/]"
    )
    for reason, n in sorted(skipped.items()):
        table.add_row(f"skipped (not a call): {reason}", f"{n:,}")
    table.add_row("segments", f"{counts.get('segments', 0):,}")
    for kind, n in sorted(seams.items()):
        if kind != "none":
            table.add_row(f"  seams: {kind}", f"{n:,}")
    for key, n in sorted(counts.items()):
        if key.startswith(COUNT_PREFIX):
            reason = key.removeprefix(COUNT_PREFIX)
            label = "context exact" if reason == EXACT else f"context not exact: {reason}"
            table.add_row(f"  {label}", f"{n:,}")
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


def print_summary(*args, **kwargs) -> None:
    Console().print(summary_table(*args, **kwargs))
