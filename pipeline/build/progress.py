"""Progress display for long work (rich), silent when not wanted or not a terminal."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

if TYPE_CHECKING:
    from pipeline.build.worker import TaskResult

console = Console(stderr=True)
T = TypeVar("T")


@contextmanager
def task_progress(enabled: bool, total: int, already_done: int, label: str = "building"):
    """Yields ``advance(result)``; says how many tasks a resumed build skipped."""
    if already_done:
        console.print(
            f"[yellow]resuming:[/] {already_done} of {total} tasks already done, skipping them"
        )
    if not enabled:
        yield lambda result: None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rollouts]} rollouts"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(label, total=total, completed=already_done, rollouts=0)
        seen = 0

        def advance(result: TaskResult) -> None:
            nonlocal seen
            seen += result.counts.get("read", 0)
            progress.update(bar, advance=1, rollouts=seen)

        yield advance


@contextmanager
def count_progress(enabled: bool, total: int, label: str):
    """Yields ``advance(n=1)`` over ``total`` items (e.g. the rollouts ``seam verify``
    checks); a no-op when ``enabled`` is false."""
    if not enabled:
        yield lambda n=1: None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(label, total=total)
        yield lambda n=1: progress.update(bar, advance=n)


def counted(items: Iterable[T], enabled: bool, total: int, label: str) -> Iterator[T]:
    """``items`` unchanged, with a bar (``count_progress``) advancing once per item."""
    with count_progress(enabled, total, label) as advance:
        for item in items:
            yield item
            advance()
