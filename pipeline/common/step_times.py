"""Wall and CPU seconds per build step, summed over tasks and worker processes.

A build step (reading, rewards join, segment + mask, rows, part write, the finalize
pass, ...) runs inside ``StepTimes.step(name)``. Steps nest: a step's time is its own,
the time of the steps inside it is left out of it (``render`` and ``tokenize`` run
inside ``segment+mask``), so the steps of one process add up to its measured time.
Each task returns its ``StepTimes`` with its counts and the build adds them up
(``merge``): wall seconds summed over workers are worker-seconds, not elapsed time.

CPU seconds are ``time.process_time()``: every thread of the process (a build worker
runs one task at a time; the finalize pass writes shards on threads of its own); a step
that runs processes of its own (``verify``) adds theirs (``step(..., with_children=True)``).

Timings differ from run to run, so they never enter the manifest (whose bytes are a
function of inputs and options): the build prints them and ``--timings FILE`` writes
them (``write_timings``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

# The steps in the order a record meets them (a table lists them in this order; a step
# this list does not name is listed after them).
ORDER = (
    "plan",  # build: inputs resolved and hashed, tokenizer loaded, tasks planned
    "tasks",  # build: waiting for the workers (elapsed), whose steps follow
    "read",  # bytes → records: decompress, split lines, parse JSON (or a raw reader)
    "validate",  # the canonical schema (pydantic) and the per-message size limit
    "rewards",  # --rewards join
    "stage",  # a build stage's prepare/filter (build-sft: attach corrections, filters)
    "fidelity",  # damage check, number checks
    "render",  # chat template → text, once per message
    "tokenize",  # text → ids (Rust tokenizer)
    "segment+mask",  # seams, segments, loss masks (render/tokenize excluded)
    "rows",  # segment → row columns
    "write part",  # Arrow table + zstd part file + quarantine part
    "check reads",  # build: every block the tasks read is the block hashed first
    "duplicates",  # finalize: a later copy of a rollout id taken back out
    "advantages+shards",  # finalize: GRPO advantages, Parquet shards, their sha256
    "quarantine",  # finalize: the parts' quarantine merged into quarantine.jsonl
    "card+manifest",  # finalize: publish, README.md, manifest.json
    "verify",  # --verify: the mask audit after the build
)


class StepTimes:
    """Seconds per step: ``{name: [wall, cpu]}``, exclusive of nested steps."""

    def __init__(self, seconds: Mapping[str, list[float] | tuple[float, float]] | None = None):
        self.seconds: dict[str, list[float]] = {
            name: [float(wall), float(cpu)] for name, (wall, cpu) in (seconds or {}).items()
        }
        self._inner: list[list[float]] = []  # per open step: time of the steps inside it

    @contextmanager
    def step(self, name: str, with_children: bool = False) -> Iterator[None]:
        """Time the block as step ``name``; ``with_children``: its CPU seconds include
        those of the child processes it started and waited for (``seam verify`` checks
        its rollouts on forked processes)."""
        clock = _cpu_with_children if with_children else time.process_time
        wall0, cpu0 = time.perf_counter(), clock()
        self._inner.append([0.0, 0.0])
        try:
            yield
        finally:
            wall, cpu = time.perf_counter() - wall0, clock() - cpu0
            inner = self._inner.pop()
            self.add(name, wall - inner[0], cpu - inner[1])
            self._leave_out_of_enclosing(wall, cpu)

    def _leave_out_of_enclosing(self, wall: float, cpu: float) -> None:
        if self._inner:  # the enclosing step leaves this one's time out of its own
            self._inner[-1][0] += wall
            self._inner[-1][1] += cpu

    @staticmethod
    def clock() -> tuple[float, float]:
        """Now, as (wall, CPU) seconds: the start of a span ``add_since`` ends."""
        return time.perf_counter(), time.process_time()

    def add_since(self, name: str, start: tuple[float, float]) -> None:
        """Count the span from ``start`` (``clock()``) to now under ``name``."""
        wall, cpu = self.clock()
        self.add(name, wall - start[0], cpu - start[1])

    def add_nested_since(self, name: str, start: tuple[float, float]) -> None:
        """Count the span from ``start`` to now under ``name`` as a step nested in the one
        open now (left out of its time, as ``step`` does), with no step inside it. For
        spans too short to time one by one: a clock reading costs a system call
        (``process_time``), and timing each of a rollout's renders alone cost more than a
        tenth of the render time."""
        wall, cpu = self.clock()
        wall, cpu = wall - start[0], cpu - start[1]
        self.add(name, wall, cpu)
        self._leave_out_of_enclosing(wall, cpu)

    def add(self, name: str, wall: float, cpu: float) -> None:
        into = self.seconds.setdefault(name, [0.0, 0.0])
        into[0] += wall
        into[1] += cpu

    def merge(self, other: StepTimes | Mapping | None) -> StepTimes:
        """Add another task's (or process's) times to these; returns self."""
        seconds = other.seconds if isinstance(other, StepTimes) else (other or {})
        for name, (wall, cpu) in seconds.items():
            self.add(name, wall, cpu)
        return self

    def ordered(self) -> list[tuple[str, float, float]]:
        """``(step, wall, cpu)`` in ``ORDER``, then any other step by name."""
        rank = {name: i for i, name in enumerate(ORDER)}
        names = sorted(self.seconds, key=lambda n: (rank.get(n, len(rank)), n))
        return [(n, self.seconds[n][0], self.seconds[n][1]) for n in names]

    def as_json(self) -> dict[str, list[float]]:
        """``{step: [wall, cpu]}`` rounded to 0.1 ms (what a task's marker carries)."""
        return {n: [round(w, 4), round(c, 4)] for n, w, c in self.ordered()}


def _cpu_with_children() -> float:
    """This process's CPU seconds plus those of its children that have ended and been
    waited for (``getrusage(RUSAGE_CHILDREN)``)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timings_document(workers: StepTimes, build: StepTimes, elapsed: float, **facts) -> dict:
    """What ``--timings FILE`` holds: the steps of the workers (summed over tasks) and of
    the build process, each with wall and CPU seconds, and the build's elapsed seconds."""
    return {
        "elapsed_s": round(elapsed, 3),
        **facts,
        "steps": {
            name: {"where": where, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}
            for where, times in (("workers", workers), ("build", build))
            for name, wall, cpu in times.ordered()
        },
    }


def write_timings(path: Path, document: dict) -> None:
    Path(path).write_text(json.dumps(document, indent=2) + "\n")
