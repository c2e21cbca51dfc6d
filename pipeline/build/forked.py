"""Run one function over many items on processes forked from this one.

The children inherit the function and the items (a module global set before the fork):
nothing is pickled on the way out, only each result on the way back. They are the
build's kind of worker (``worker.process_pool``: set up by ``die_with_parent``, so they
die with this process and never import pandas), and this process keeps what it loaded
(a tokenizer, a compiled chat template), so a child starts with nothing to load.
``seam verify`` checks its rollouts this way, on every core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import as_completed
from multiprocessing import get_all_start_methods
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# What the children inherit: (function, items), set only while a ``forked_map`` runs.
_WORK: tuple[Callable[[Any], Any], Sequence[Any]] | None = None


def can_fork() -> bool:
    return "fork" in get_all_start_methods()


def _run_at(index: int) -> tuple[int, Any]:
    assert _WORK is not None, "forked_map's children inherit their work"
    fn, items = _WORK
    return index, fn(items[index])


def forked_map(
    fn: Callable[[T], R], items: Sequence[T], workers: int, first: Sequence[int] | None = None
) -> Iterator[tuple[int, R]]:
    """``(i, fn(items[i]))`` for every item, as they finish, on ``workers`` forked
    processes (``can_fork`` must hold). ``first``: the order to hand the items out in
    (longest first keeps the processes busy to the end); default: as given. An exception
    of ``fn`` is raised here, and the processes are killed when the caller stops early
    or fails."""
    from pipeline.build.worker import process_pool

    global _WORK
    if _WORK is not None:
        raise RuntimeError("forked_map does not nest")
    order = range(len(items)) if first is None else first
    _WORK = (fn, items)
    try:
        with process_pool(max(1, min(workers, len(items)))) as pool:
            # The pool forks its processes at the first submit, after _WORK is set.
            futures = [pool.submit(_run_at, i) for i in order]
            for future in as_completed(futures):
                yield future.result()
    finally:
        _WORK = None
