"""The steps every command runs its inputs through, in the spirit of datatrove's pipeline
steps: reading, the rewards join, the damaged-log filter, the stage's filter, segment +
mask + rows, de-duplication. A command is a list of them:

==============  ===========================================================================
command         steps (``Pipeline(ReadRecords(...), [...])``)
==============  ===========================================================================
build (task)    read → join rewards → stage prepare → drop damaged → make rows
build (final)   duplicates (across tasks, ``FirstSeen``) → advantages + shards →
                quarantine → stage → card + manifest (``pipeline/build/finalize.py``)
ingest          read → join rewards → drop duplicates → canonical Parquet
judge           read → drop duplicates → rule/LLM judge
audit           read → drop damaged → drop duplicates → summary audit
verify          read → drop damaged → drop duplicates, checked against the build's quarantine
seam.read       read → drop duplicates
==============  ===========================================================================

so one record gets one fate, with one reason, whichever command reads it
(tests/test_steps.py runs every command on one mixed bad input and compares).

The contract:

- an ``Item`` is one rollout read from an input, with its file, line and format;
- a ``Step`` sees items one at a time (``process``) and passes each on, or quarantines it
  through its own writer (``reject``: one ``Rejection`` to the command's ``Sink``, counted
  in the step's ``StepStats``), never drops one without a counted reason; ``close`` runs
  once after the last item;
- ``Pipeline`` feeds the items of its ``ReadRecords`` source through the steps and yields
  those that pass all of them. It times every step into a ``StepTimes``
  (``pipeline/common/step_times.py``: wall and CPU seconds, nested steps exclusive) under the
  step's ``timed_as`` name (reading and parsing under ``read``, a step's ``process`` and
  ``close`` under its own); a step may time finer parts inside itself with
  ``self.times.step(name)`` (the rows step: ``segment+mask``, ``fidelity``...). Counters
  are in ``Pipeline.stats`` (a ``PipelineStats``, which ``merge``\\ s across tasks).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from pipeline.common.step_times import StepTimes
from pipeline.sources.files import Task
from pipeline.sources.intake import ACCEPTED, SKIPPED, iter_records
from pipeline.sources.read_context import ReadContext
from schemas.rollout import Rollout


@dataclass
class Item:
    """One rollout read from the inputs, on its way through the steps."""

    rollout: Rollout
    file: str  # the file it was read from (a session's own file, when a task reads several)
    line: int | None  # its line (or row, or record) in that file; None: the whole file
    format: str
    task: Task  # the task it was read in (``task.path``: the file it is counted under)
    records: int = 1  # raw records (lines, steps) it stands for

    @property
    def place(self) -> str:
        """``file:line`` (the file alone for a whole-file record), as reasons name it."""
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass(frozen=True)
class Rejection:
    """A quarantined record: the quarantine entry (``entry()``), its raw text, and what it
    counts for in the accounting of its task."""

    file: str
    line: int | None
    format: str
    reason: str
    raw: str | None = None
    records: int = 1  # raw records it stands for; 0 for a whole-file failure
    task_path: str = ""  # the file its task is counted under

    def entry(self) -> dict:
        """The line of ``quarantine.jsonl`` (without ``raw``): one definition for every
        command."""
        return {"file": self.file, "line": self.line, "format": self.format, "reason": self.reason}


class Sink(Protocol):
    """Where a command's quarantined records go: a build task's part file, ingest's
    ``quarantine.jsonl``, judge's ``--quarantine`` file, a list."""

    def reject(self, rejection: Rejection) -> None: ...


class Collect:
    """A ``Sink`` that keeps every rejection in ``rejections`` (for tests, ``seam.read``,
    verify: small or bounded inputs)."""

    def __init__(self) -> None:
        self.rejections: list[Rejection] = []

    def reject(self, rejection: Rejection) -> None:
        self.rejections.append(rejection)

    def entries(self) -> list[dict]:
        return [r.entry() for r in self.rejections]


@dataclass
class StepStats:
    """One step's counters: items that came in and went on, quarantined, skipped (by
    reason) and the step's own counts (``counts``, under the build manifest's key names).
    Its seconds are in the pipeline's ``StepTimes``."""

    name: str
    seen: int = 0
    passed: int = 0
    quarantined: int = 0
    skipped: Counter = field(default_factory=Counter)
    counts: Counter = field(default_factory=Counter)

    def merge(self, other: StepStats) -> StepStats:
        """The sum of two runs of the same step (two tasks), as a new object."""
        if other.name != self.name:
            raise ValueError(f"cannot merge the stats of step {other.name} into {self.name}")
        counts = self.counts.copy()
        counts.update(other.counts)  # Counter.update keeps zero counts: their keys matter
        return StepStats(
            self.name,
            self.seen + other.seen,
            self.passed + other.passed,
            self.quarantined + other.quarantined,
            self.skipped + other.skipped,
            counts,
        )

    def as_dict(self) -> dict:
        return {
            "seen": self.seen,
            "passed": self.passed,
            "quarantined": self.quarantined,
            "skipped": dict(self.skipped),
            "counts": dict(self.counts),
        }


@dataclass
class PipelineStats:
    """The stats of every step of a pipeline, in step order; ``merge`` adds another run's
    (another task's) step by step."""

    steps: dict[str, StepStats] = field(default_factory=dict)

    def merge(self, other: PipelineStats) -> PipelineStats:
        merged = dict(self.steps)
        for name, stats in other.steps.items():
            merged[name] = merged[name].merge(stats) if name in merged else stats
        return PipelineStats(merged)

    def quarantined(self) -> int:
        return sum(s.quarantined for s in self.steps.values())

    def counts(self) -> Counter:
        """Every step's own counts, added up (the build's task counts come from here)."""
        total: Counter = Counter()
        for stats in self.steps.values():
            total.update(stats.counts)
        return total

    def as_dict(self) -> dict:
        return {name: s.as_dict() for name, s in self.steps.items()}


class Step:
    """One step: ``process`` one item, returning it (or a replacement) to pass it on, or
    ``None`` once it has quarantined it with ``reject`` (or counted why it left it out).
    The pipeline gives each step its sink and its ``StepTimes`` (``bind``) before the first
    item."""

    name: ClassVar[str] = "step"
    timed_as: ClassVar[str] = ""  # its name in the build's step times (``step_times.ORDER``)

    def __init__(self) -> None:
        self.stats = StepStats(self.name)
        self._sink: Sink | None = None
        self.times = StepTimes()

    def bind(self, sink: Sink, times: StepTimes) -> None:
        self._sink = sink
        self.times = times

    def reject(self, item: Item, reason: str, raw: str | None = None) -> None:
        """Quarantine ``item`` with ``reason`` (the step's own quarantine writer)."""
        self.stats.quarantined += 1
        assert self._sink is not None, f"step {self.name} used before the pipeline bound it"
        self._sink.reject(
            Rejection(item.file, item.line, item.format, reason, raw, item.records, item.task.path)
        )

    def process(self, item: Item) -> Item | None:
        raise NotImplementedError

    def close(self) -> None:
        """After the last item (write what the step holds, count what it saw)."""


class ReadRecords(Step):
    """The source: the records of ``tasks`` read by ``pipeline.sources.intake`` (one way in for
    every command). A record that cannot become a rollout is quarantined with the reader's
    reason; a skipped one (not a model call) is counted by reason; ``stats.seen`` counts
    every record not skipped (the build's ``read``)."""

    name = timed_as = "read"

    def __init__(
        self,
        tasks: Iterable[Task],
        context: ReadContext | None = None,
        data_for: Callable[[Task], bytes | None] | None = None,
        keep: Callable[[bytes], bool] | None = None,
        on_skip: Callable[[Task, str, int], None] | None = None,
        names: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        # A file's name as the build named it (verify reads a build's inputs where they
        # are now); a reason that starts with the file's path names it so too.
        self.names = names or {}
        self.on_skip = on_skip  # a skipped record's task, reason and raw records
        self.tasks = tasks
        self.context = context  # limits and reader options (None: the defaults)
        self.data_for = data_for  # a task's bytes, when the build fed them
        self.keep = keep  # verify's sample: canonical records it passes over unparsed

    def items(self) -> Iterator[Item]:
        for task in self.tasks:
            data = self.data_for(task) if self.data_for is not None else None
            records = iter_records(task, data, self.context, self.keep, self.times)
            for record in records:
                if record.kind == SKIPPED:
                    self.stats.skipped[record.reason] += 1
                    if self.on_skip is not None:
                        self.on_skip(task, record.reason or "", record.records)
                    continue
                self.stats.seen += 1
                read_from = record.file or task.path
                file = self.names.get(read_from, read_from)
                if record.kind != ACCEPTED:
                    reason = record.reason or ""
                    if file != read_from and reason.startswith(f"{read_from}:"):
                        reason = file + reason[len(read_from) :]
                    self.stats.quarantined += 1
                    assert self._sink is not None
                    self._sink.reject(
                        Rejection(
                            file,
                            record.line,
                            task.format,
                            reason,
                            record.raw,
                            record.records,
                            task.path,
                        )
                    )
                    continue
                assert record.rollout is not None  # an accepted record carries its rollout
                self.stats.passed += 1
                yield Item(record.rollout, file, record.line, task.format, task, record.records)


class JoinRewards(Step):
    """``--rewards FILE``: each rollout's outcome joined by rollout or session id
    (``pipeline/readers/rewards.py``); counted as ``rewards_matched``/``rewards_unmatched``.
    Never quarantines (a rollout left without an outcome is the RL rows' to refuse)."""

    name = timed_as = "rewards"

    def __init__(self, rewards: dict) -> None:
        super().__init__()
        self.rewards = rewards

    def process(self, item: Item) -> Item:
        from pipeline.readers.rewards import apply_rewards

        item.rollout, matched = apply_rewards(item.rollout, self.rewards)
        self.stats.counts["rewards_matched" if matched else "rewards_unmatched"] += 1
        return item


def damaged_reason(rollout: Rollout) -> str | None:
    """Why a rollout is quarantined as damaged (a lost or undecodable record,
    ``pipeline/core/fidelity.py``), or None when it is whole."""
    from pipeline.core import fidelity

    damaged = fidelity.damage(rollout)
    if not damaged:
        return None
    return f"rollout {rollout.rollout_id}{DAMAGED_MARK}{damaged}); --keep-damaged keeps it, flagged"


DAMAGED_MARK = ": damaged log ("  # how every damaged rollout's reason reads (verify tells by it)


class DropDamaged(Step):
    """Quarantine a damaged rollout (``damaged_reason``), as every build does unless
    ``--keep-damaged``."""

    name = "damaged"
    timed_as = "fidelity"

    def process(self, item: Item) -> Item | None:
        reason = damaged_reason(item.rollout)
        if reason is not None:
            self.reject(item, reason)
            return None
        return item


DUPLICATE_REASON = "duplicate rollout_id "  # how a duplicate's quarantine reason starts


class FirstSeen:
    """The duplicate-id rule, in one place: the first rollout of an id (in input order,
    among those every earlier step accepted) is kept, every later one is quarantined — it
    would join its GRPO group twice and skew the group's advantages."""

    def __init__(self) -> None:
        self.first: dict[str, str] = {}

    def duplicate(self, rollout_id: str, place: str) -> str | None:
        """The quarantine reason if ``rollout_id`` was seen before (else it is now seen
        at ``place``, ``file:line``)."""
        if rollout_id not in self.first:
            self.first[rollout_id] = place
            return None
        return (
            f"{DUPLICATE_REASON}{rollout_id!r}: first at {self.first[rollout_id]}, "
            f"again at {place} (the first is kept)"
        )


class DropDuplicates(Step):
    """Quarantine a rollout whose id an earlier item had (``FirstSeen``). The build runs
    the same rule in its finalize stage, across tasks (``pipeline/build/finalize.py``)."""

    name = timed_as = "duplicates"

    def __init__(self) -> None:
        super().__init__()
        self.seen_ids = FirstSeen()

    def process(self, item: Item) -> Item | None:
        reason = self.seen_ids.duplicate(item.rollout.rollout_id, item.place)
        if reason is not None:
            self.reject(item, reason)
            return None
        return item


class Pipeline:
    """Items of ``source`` through ``steps``; iterating yields those that pass them all.
    Every step's rejections go to ``sink``; its seconds to ``times`` (a new ``StepTimes``
    unless given). ``stats``: each step's ``StepStats``."""

    def __init__(
        self,
        source: ReadRecords,
        steps: list[Step],
        sink: Sink,
        times: StepTimes | None = None,
    ) -> None:
        self.source = source
        self.steps = steps
        self.times = StepTimes() if times is None else times
        for step in (source, *steps):
            step.bind(sink, self.times)

    @property
    def stats(self) -> PipelineStats:
        return PipelineStats({s.name: s.stats for s in (self.source, *self.steps)})

    def __iter__(self) -> Iterator[Item]:
        timed = self.times.step
        items = self.source.items()
        while True:
            with timed(self.source.timed_as):
                item: Item | None = next(items, None)
            if item is None:
                break
            for step in self.steps:
                step.stats.seen += 1
                with timed(step.timed_as or step.name):
                    item = step.process(item)
                if item is None:
                    break
                step.stats.passed += 1
            else:
                yield item
        for step in self.steps:
            with timed(step.timed_as or step.name):
                step.close()

    def rollouts(self) -> Iterator[Rollout]:
        return (item.rollout for item in self)


def plan_reading(
    specs: list[str], fmt: str = "auto", context: ReadContext | None = None
) -> tuple[list, list[Task]]:
    """The input files of ``specs`` and their tasks (whole files, for one process), planned
    as a build plans them, under ``context`` (its limits; a reader option none of the
    inputs' readers takes is refused): a file no reader recognises, found by walking a
    directory, becomes one quarantine entry (a named one is refused)."""
    from pipeline.sources.files import plan_tasks, resolve_inputs, walked_files

    context = context or ReadContext()
    with context.active():  # detection reads under the limits too
        files = resolve_inputs(specs)
        tasks = plan_tasks(files, fmt, split=False, walked=walked_files(specs))
    context.check_readers(t.format for t in tasks)
    return files, tasks
