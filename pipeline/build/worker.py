"""Run one build task: records → validated rollouts → segment rows → one part file.

A task writes, under ``OUT/.parts/``, ``part-NNNNNN.arrow`` (rows without the
group-dependent columns, as a zstd-compressed Arrow IPC file: read back without
decoding Parquet's list levels, about 4× faster), ``part-NNNNNN.quarantine.jsonl``
and, last, the completion marker ``part-NNNNNN.json`` with its counts. Each is written
to a temporary name and renamed, so a killed build leaves either a complete part or
none, and a rerun skips every part whose marker exists (resume).

Every record ends in exactly one place: rows (accepted) or quarantine (with file, line,
format and a reason), so ``read = accepted + quarantined`` holds per task.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import active_children, get_context
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from pipeline.build.forked import can_fork
from pipeline.build.quarantine import NOT_WRITTEN, Share, TaskQuarantine
from pipeline.build.stage import BuildStage, TaskStage
from pipeline.build.steps import (
    DropDamaged,
    Item,
    JoinRewards,
    Pipeline,
    ReadRecords,
    Rejection,
    Step,
)
from pipeline.common.atomic import atomic_write, write_text
from pipeline.common.gc_tuning import freeze_and_collect_young_every
from pipeline.common.step_times import StepTimes
from pipeline.core import fidelity, witness
from pipeline.core.render import ChatRenderer, TemplateError
from pipeline.core.rows import (
    RejectedRollout,
    RowBatch,
    RowOptions,
    exclude_by_fidelity,
    masked_segments,
    rollout_reward,
)
from pipeline.core.segment import Segmenter
from pipeline.sources.files import Task
from pipeline.sources.read_context import ReadContext
from pipeline.sources.read_hash import recording
from schemas.rollout import Rollout


@dataclass(frozen=True)
class WorkerConfig:
    out: str
    tokenizer: str | None
    chat_template: str | None
    options: RowOptions
    rewards: str | None = None  # --rewards FILE: outcomes joined by rollout or session id
    stage: BuildStage | None = None  # BuildConfig.stage (pipeline/build/stage.py)
    # What one input record may cost and the readers' options (e.g. group_by for chat logs).
    read: ReadContext = field(default_factory=ReadContext)
    quarantine: Share = field(default_factory=Share)  # what a task may write into the quarantine


_SEGMENTERS: dict[tuple, Segmenter] = {}


def segmenter_for(config: WorkerConfig) -> Segmenter:
    """One tokenizer + renderer per process, loaded on first use."""
    return segmenter_with(config.tokenizer, config.chat_template)


def segmenter_with(tokenizer: str | None, chat_template: str | None) -> Segmenter:
    """The process's segmenter for a tokenizer and template: loaded and probed once, shared
    by the manifest (template hash, incremental or not), by every task and by the build's
    own ``--verify`` (which names the tokenizer by the directory the manifest records:
    keyed by that directory, not by how it was named, the build's loaded tokenizer serves
    it instead of a second 0.6 s load; verify renders through its own path either way)."""
    from pipeline.core.tokenizer import load_build_tokenizer, tokenizer_dir

    key = (str(tokenizer_dir(tokenizer).resolve()), chat_template)
    if key not in _SEGMENTERS:
        _SEGMENTERS[key] = Segmenter(ChatRenderer(load_build_tokenizer(tokenizer, chat_template)))
    return _SEGMENTERS[key]


class _NoPandas:
    """Import finder that makes ``import pandas`` fail in build workers.

    pyarrow imports pandas (0.33 s per worker) on its first ``pa.array()`` call, only to
    ask whether the argument is a pandas object, and treats an ImportError as "no
    pandas". A build worker never holds a pandas object and no stage imports pandas.
    """

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not imported in seam build workers", name=name)
        return None


# Container allocations (net of frees) between two collections of the youngest generation
# in a build worker (Python's default: 700); see worker_process_setup.
GC_YOUNG_THRESHOLD = 10_000


@contextmanager
def collected_as_in_a_worker() -> Iterator[None]:
    """The cyclic GC of a build worker (``worker_process_setup``) for tasks run in this
    process (``--workers 1``, one task), restored after them: with Python's threshold of
    700 and the build's loaded objects unfrozen, the collector's full passes walk the
    tokenizer's, renderer's and caches' objects again and again while a task allocates,
    and the cost lands in whichever step allocates most (``validate``)."""
    import gc

    # unfreeze() thaws every frozen object: only when none was frozen before this (a
    # caller that froze its own keeps them frozen, with this build's objects beside them).
    thaw = gc.get_freeze_count() == 0
    before = freeze_and_collect_young_every(GC_YOUNG_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if thaw:
            gc.unfreeze()


def worker_process_setup() -> None:
    """How a build worker process runs its tasks.

    A worker encodes on one core, on the tokenizer's sequential path: the workers own the
    cores, and if the parent had started a Rayon pool (in-process use, tests) a forked
    copy of it has no threads behind it, so encoding through it would hang. And it never
    imports pandas (``_NoPandas``). The objects it inherited from the parent (tokenizer,
    renderer, modules) are frozen out of the cyclic GC, which would otherwise rescan
    them at every full collection (and touch their copy-on-write pages); and the
    youngest generation is collected after ``GC_YOUNG_THRESHOLD`` container allocations
    instead of Python's 700: a task allocates and frees a rollout's models, dicts and
    lists by the hundred thousand, and at 700 the collector ran ~300 times per 200
    rollouts, ~1.2% of a worker's CPU (0.06 of 5 s; 10,000: twice, 0.004 s). Garbage in
    cycles is still collected, a little later; the rest is freed by reference count, at
    once, as before.
    """
    freeze_and_collect_young_every(GC_YOUNG_THRESHOLD)
    # The build's SIGTERM/SIGHUP handlers (pipeline.cli) raise in its main thread; a
    # worker just ends, and the build cleans up.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if "pandas" not in sys.modules and not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())


def die_with_parent(parent: int) -> None:
    """Initializer of every build worker process: ``worker_process_setup``, and

    a worker must die with its build, even on SIGKILL: an orphan would go on writing into
    --out, and — forked while the build held ``OUT/.lock`` — it would keep that lock's
    open file alive, so the rerun would find the directory in use forever.
    """
    worker_process_setup()
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the build died before the line above ran
            os._exit(1)


def start_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes set up by ``die_with_parent``, forked where the
    platform can (they start with what this process already loaded), for the build's
    local executor (``pipeline/build/executor.py``) and ``seam simulate`` alike. Ended by
    ``pool.shutdown(wait=True)`` (a sentinel each, then a join; no signal is sent), after
    ``kill_pool`` when it must stop at once."""
    method = "fork" if can_fork() else "spawn"
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=get_context(method),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool`` at once (a failure, SIGTERM, a consumer that stopped): what has not
    started is cancelled and the workers are killed, so nothing writes on. Never
    ``multiprocessing.Pool.terminate``, whose teardown can wait forever on a worker stuck
    on the task queue's lock (its ``_terminate_pool`` joins workers after sending them
    SIGTERM once, and a worker that holds or waits on that lock may never exit)."""
    pool.shutdown(wait=False, cancel_futures=True)
    children = active_children()
    for child in children:
        child.kill()
    for child in children:  # reaped: SIGKILL cannot be caught, so each ends promptly
        child.join(timeout=5)


@contextmanager
def process_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """``start_pool(workers)`` for a block: left normally, it waits for the workers to
    end; left by an exception, it kills them first (``kill_pool``)."""
    with start_pool(workers) as pool:
        try:
            yield pool
        except BaseException:
            kill_pool(pool)
            raise


def write_part(table: pa.Table, path: str) -> None:
    """A task's rows as a zstd-compressed Arrow IPC file (Feather V2, what
    ``feather.write_feather`` writes), compressed on this thread: a build worker owns
    its core, and Arrow's thread pool compressing the buffers cost a fifth more CPU
    (60 parts of text-500: 0.23 vs 0.18 CPU s, alternating, median of 5)."""
    options = ipc.IpcWriteOptions(compression="zstd", use_threads=False)
    with ipc.new_file(path, table.schema, options=options) as writer:
        writer.write_table(table)


def part_paths(out: str, index: int) -> tuple[Path, Path, Path]:
    base = Path(out) / ".parts" / f"part-{index:06d}"
    return (
        base.with_suffix(".arrow"),
        base.with_suffix(".quarantine.jsonl"),
        base.with_suffix(".json"),
    )


_REWARDS: dict[str, dict] = {}


def rewards_for(path: str) -> dict:
    """The ``--rewards`` table, loaded once per process."""
    if path not in _REWARDS:
        from pipeline.readers.rewards import load_rewards

        _REWARDS[path] = load_rewards(Path(path))
    return _REWARDS[path]


@dataclass
class TaskResult:
    """What one task reports to the build, and its completion marker (``to_json``).

    ``counts``/``skipped``/``seams`` add up into the manifest; ``groups`` is the table
    the GRPO advantages are computed from (``group_table``); ``rollouts`` lists every
    accepted rollout by ordinal — ``[rollout id, file, line, its counts, its seams]`` —
    so the build can take a duplicate back out when it finalizes.
    """

    task: int  # the task's index in the plan
    file: str
    format: str
    rows: int  # rows in the task's part file
    counts: dict[str, int]
    skipped: dict[str, int]
    seams: dict[str, int]
    groups: dict[str, list]
    rollouts: list[list]
    session_files: list[str] | None = None  # a session's other files, read with this one
    # What the task read: {file: {block index: sha256}} (``read_hash``); None in markers
    # of an older seam.
    reads: dict[str, dict[str, str]] | None = None
    # Wall and CPU seconds per step (``StepTimes.as_json``): printed and ``--timings``,
    # never in the manifest.
    timings: dict[str, list[float]] | None = None

    def to_json(self) -> str:
        fields = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TaskResult:
        return cls(**json.loads(text))


def run_task(task: Task, config: WorkerConfig, data: bytes | None = None) -> TaskResult:
    """Process one task and write its part files; returns the task's counts. ``data``:
    the task's bytes, when the build read them for it (``RangeFeeder``).

    The work runs on a helper thread, not the process's main thread: glibc gives every
    thread but the main one its own malloc arena, and the tokenizer's many short-lived
    Rust allocations run about 25% faster there than in the main arena they would share
    with the interpreter (measured: the same pieces encode in 1.75 s on a helper thread,
    2.4 s on the main thread, 2.5 s on a helper thread with ``MALLOC_ARENA_MAX=1``).
    """
    return _on_helper_thread(_run_task, task, config, data)


def _on_helper_thread(fn, *args):
    """``fn(*args)`` on a fresh daemon thread (a daemon, so that Ctrl-C in the main
    thread ends the process instead of waiting for the task); its exception re-raised."""
    box: dict = {}

    def target():
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="seam-task", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _run_task(task: Task, config: WorkerConfig, data: bytes | None) -> TaskResult:
    segmenter = segmenter_for(config)
    times = StepTimes()
    # The renderer times its renders and encodes into the task's steps (``step_times``).
    segmenter.renderer.times = times
    try:
        return _run_timed_task(task, config, data, segmenter, times)
    finally:
        segmenter.renderer.times = None


def _run_timed_task(
    task: Task, config: WorkerConfig, data: bytes | None, segmenter: Segmenter, times: StepTimes
) -> TaskResult:
    """One task through the build's steps (``pipeline/build/steps.py``): read → join rewards →
    stage prepare → drop damaged → make rows; then its part files and marker."""
    part_path, quarantine_path, marker = part_paths(config.out, task.index)
    task_stage = (
        config.stage.open_task(config.out, task.index) if config.stage is not None else None
    )
    sink = BuildSink(TaskQuarantine(config.quarantine))
    read = ReadRecords([task], config.read, data_for=lambda _task: data)
    steps: list[Step] = []
    if config.rewards:
        steps.append(JoinRewards(rewards_for(config.rewards)))
    if task_stage is not None:
        steps.append(StagePrepare(task_stage, sink.quarantine))
    if not config.options.keep_damaged:
        steps.append(DropDamaged())
    rows = MakeRows(segmenter, config.options, task_stage, config.stage)
    steps.append(rows)
    pipeline = Pipeline(read, steps, sink, times)
    # Every input block the task reads is hashed as it is read (``read_hash``).
    with recording() as reads:
        for _ in pipeline:
            pass
    counts: Counter = Counter()
    if read.stats.seen:
        counts["read"] = read.stats.seen
    if sink.rejected:
        counts["quarantined"] = sink.rejected
    counts.update(pipeline.stats.counts())
    part_path.parent.mkdir(parents=True, exist_ok=True)
    with times.step("write part"):
        table = rows.batch.to_table()
        atomic_write(part_path, lambda tmp: write_part(table, tmp))
        sink.quarantine.write(quarantine_path)  # 0600: raw session text
        groups = group_table(rows.batch.group_rows(), rows.rowless)
    if sink.quarantine.not_written:
        counts[NOT_WRITTEN] = sink.quarantine.not_written
    result = TaskResult(
        task=task.index,
        file=task.path,
        format=task.format,
        rows=rows.batch.num_rows,
        counts=dict(counts),
        skipped=dict(read.stats.skipped),
        seams=dict(rows.seams),
        groups=groups,
        rollouts=rows.accepted,
        # The session's other files, read with this one (counted under it).
        session_files=list(task.paths) if task.paths else None,
        reads={f: {str(i): d for i, d in sorted(b.items())} for f, b in reads.items()},
        timings=times.as_json(),
    )
    write_text(marker, result.to_json())
    return result


class BuildSink:
    """A build task's quarantine: each rejection becomes an entry of the task's part of
    ``quarantine.jsonl`` (within its share) and counts as ``quarantined``."""

    def __init__(self, quarantine: TaskQuarantine) -> None:
        self.quarantine = quarantine
        self.rejected = 0

    def reject(self, rejection: Rejection) -> None:
        self.rejected += 1
        self.quarantine.add(rejection.entry(), rejection.raw)


class StagePrepare(Step):
    """The build stage's filter (``TaskStage.prepare``, e.g. the SFT stage's corrections
    and filters): a rollout it leaves out is quarantined under its reason; the records it
    attaches that cannot be used (corrections) are quarantine entries of their own,
    counted by the stage. Closing it closes the stage's task (its side files, its counts)."""

    name = timed_as = "stage"

    def __init__(self, task_stage: TaskStage, quarantine: TaskQuarantine) -> None:
        super().__init__()
        self.task_stage = task_stage
        self.quarantine = quarantine

    def process(self, item: Item) -> Item | None:
        rollout, reason, extra_entries = self.task_stage.prepare(item.rollout)
        for entry in extra_entries:
            self.quarantine.add({"file": item.task.path, "line": item.line, **entry})
        if rollout is None:
            self.reject(item, reason or "left out by the build stage")
            return None
        item.rollout = rollout
        return item

    def close(self) -> None:
        self.stats.counts.update(self.task_stage.close())


class MakeRows(Step):
    """Segment + mask + rows: the rollout's masked segments (``pipeline/core/rows.py``), the
    stage's segment filter and columns, into the task's ``RowBatch``; a rollout that
    cannot become rows is quarantined with the reason. Counts what the rows hold (tokens,
    calls, seams...) and lists every accepted rollout by ordinal (``accepted``), for the
    build's finalize stage. Its parts are timed as ``fidelity`` (number checks,
    ``--exclude-fidelity``), ``segment+mask``, ``stage`` and ``rows``."""

    name = timed_as = "rows"

    def __init__(
        self,
        segmenter: Segmenter,
        options: RowOptions,
        task_stage: TaskStage | None,
        stage: BuildStage | None,
    ) -> None:
        super().__init__()
        self.segmenter = segmenter
        self.options = options
        self.task_stage = task_stage
        self.batch = RowBatch(
            stage.extra_fields if stage is not None else (), options.require_outcome
        )
        self.seams: Counter = Counter()
        # [rollout id, file, line, its counts, its seams] per ordinal
        self.accepted: list[list] = []
        self.rowless: list[tuple] = []  # accepted rollouts that left no rows

    def process(self, item: Item) -> Item | None:
        rollout = item.rollout
        task_stage = self.task_stage
        step = self.times.step
        ordinal = len(self.accepted)
        try:
            with step("fidelity"):
                _check_numbers(rollout, len(self.segmenter.renderer.tokenizer))
            with step("segment+mask"):
                segments, dropped = masked_segments(rollout, self.segmenter, self.options)
            with step("fidelity"):
                segments, excluded = exclude_by_fidelity(
                    rollout, segments, self.options.exclude_fidelity
                )
            extra = None
            if task_stage is not None:
                with step("stage"):
                    segments = [
                        m for m in segments if task_stage.keep_segment(len(m.segment.tokens))
                    ]
                    # The stage's columns first: a rollout rejected there leaves no rows.
                    extra = task_stage.accept(rollout, segments)
            self.batch.add_rollout(rollout, ordinal, segments)
            if extra is not None:
                self.batch.add_extra(extra)
        except (RejectedRollout, TemplateError) as exc:
            self.reject(item, f"rollout {rollout.rollout_id}: {exc}")
            return None
        except RecursionError:  # content nested too deep for a recursive walk
            self.reject(item, f"rollout {rollout.rollout_id}: nested too deeply to process")
            return None
        own: Counter = Counter(accepted=1, dropped_truncated_segments=dropped, **excluded)
        own["segments"] += len(segments)
        if not segments:
            own["rollouts_without_segments"] += 1
            # Still a sample of the policy on its task: it stays in its GRPO group, so
            # dropping its segments (--drop-truncated) leaves the others' advantages alone.
            self.rowless.append(
                (
                    rollout.rollout_id,
                    rollout.parent_rollout_id,
                    rollout.task_id,
                    _outcome(rollout),
                    ordinal,
                )
            )
        own_seams = Counter(m.segment.seam_kind for m in segments)
        for m in segments:
            own["tokens"] += len(m.segment.tokens)
            own["trainable_tokens"] += m.num_trainable_tokens
            own["drift_realigned"] += m.segment.drift_realigned
            own["calls"] += len(m.segment.spans)
        for reasons in self.batch.last_fidelity:
            for reason in reasons:
                own[f"{fidelity.COUNT_PREFIX}{reason}"] += 1
        for seen in self.batch.last_witnesses:  # the second witness (pipeline/witness.py)
            if seen.witnessed:  # counted only where some log reports usage
                own[witness.WITNESSED_CALLS] += seen.witnessed
                own[witness.GAP_TOKENS] += seen.gap_tokens or 0
        self.stats.counts.update(own)
        self.seams.update(own_seams)
        # Every accepted rollout, by ordinal: the build finds duplicate ids across tasks
        # and takes a later copy back out (rows, counts, group vote) when it finalizes.
        self.accepted.append([rollout.rollout_id, item.file, item.line, dict(own), dict(own_seams)])
        return item


def group_table(with_rows: list[tuple], rowless=()) -> dict[str, list]:
    """The task's accepted rollouts, for GRPO groups: task id, reward (None for NaN: no
    outcome), rollout ordinal, and rollout and parent ids (a rollout and its sub-agents
    are one vote) — those with rows (``RowBatch.group_rows``: the reward as its float32
    column holds it), then ``rowless`` ones (all segments dropped), which count in their
    group but get no rows. Returned with the counts, so finalizing never re-reads the
    parts to group them. Each row is ``(rollout id, parent id, task id, reward, ordinal)``."""
    groups: dict[str, list] = {
        "rollout_id": [],
        "parent_rollout_id": [],
        "task_id": [],
        "reward": [],
        "ordinal": [],
    }
    for row in (*with_rows, *rowless):
        for column, value in zip(groups.values(), row):
            column.append(value)
    return groups


def _outcome(rollout: Rollout) -> float | None:
    if rollout.reward is None and rollout.resolved is None:
        return None
    return rollout_reward(rollout)


def _check_numbers(rollout: Rollout, vocab_size: int) -> None:
    """Numbers that would corrupt rows instead of failing: a non-finite reward makes its
    whole task group's advantages NaN; a logged id outside this tokenizer's vocabulary
    decodes to nothing (or overflows int32)."""
    if rollout.reward is not None and not math.isfinite(rollout.reward):
        raise RejectedRollout(f"reward is {rollout.reward}, not a finite number")
    for call in rollout.calls():
        for name in ("prompt_ids", "output_ids"):
            ids = getattr(call, name)
            if ids and (min(ids) < 0 or max(ids) >= vocab_size):
                bad = min(ids) if min(ids) < 0 else max(ids)
                raise RejectedRollout(
                    f"message {call.id}: {name} holds {bad}, not a token id of this tokenizer "
                    f"(vocabulary size {vocab_size}); was it logged with another tokenizer?"
                )
