"""The cyclic garbage collector as seam's long loops run it (build workers and tasks run in
the build process, ``pipeline/build/worker.py``; the gateway, ``pipeline/cli/gateway.py``).

What exists when the loop starts (modules, the tokenizer, caches) moves to the permanent
generation (``gc.freeze``), so full collections stop walking it, and the youngest
generation is collected after ``young`` container allocations instead of Python's 700:
the loops allocate and free parsed records by the hundred thousand, most freed at once by
their reference count. Garbage in cycles is still collected, a little later. Each caller
says why its threshold (and measured it there).
"""

from __future__ import annotations

import gc


def freeze_and_collect_young_every(young: int) -> tuple[int, int, int]:
    """Freeze every object that exists now and collect the youngest generation every
    ``young`` allocations (the older generations' thresholds kept); the thresholds before."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young, before[1], before[2])
    return before
