"""The executor: how a build's tasks run, one interface for every engine (``--engine``).

An ``Executor`` takes the tasks (``submit``), gives their ``TaskResult``\\ s in task order
as they finish (``results``), and stops (``shutdown``: after the last result, or at once
with ``cancel=True`` when the build fails or is interrupted, so nothing writes into
``--out`` after it). ``pipeline/build/run.py`` drives every engine through these three
calls (``running``) and never asks which engine it holds; an engine is a registered
executor class (``pipeline/build/engines.py``), built from the tasks' ``WorkerConfig`` and
the ``BuildConfig``. Every executor runs the same task function
(``pipeline/build/worker.py`` ``run_task``), so the output is byte-identical whichever ran
it (tests/test_executors.py runs every registered engine through the protocol).

This module holds the protocol and the ``local`` engine (forked worker processes of this
machine); ``pipeline/build/ray_engine.py`` holds ``ray``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from pipeline.build.worker import (
    TaskResult,
    WorkerConfig,
    collected_as_in_a_worker,
    kill_pool,
    run_task,
    segmenter_for,
    start_pool,
)
from pipeline.sources.canonical_io import RangeFeeder
from pipeline.sources.files import Task

if TYPE_CHECKING:
    from pipeline.build.config import BuildConfig


class Executor(Protocol):
    """What the build asks of an engine. Made by its class from ``(WorkerConfig,
    BuildConfig)``; then ``submit`` once, ``results`` once, ``shutdown`` once (``running``
    makes these calls in this order and shuts down on every way out)."""

    def submit(self, tasks: Sequence[Task]) -> None:
        """Take the tasks to run (in task order); the engine may start them now."""
        ...

    def results(self) -> Iterator[TaskResult]:
        """The submitted tasks' results in task order, each once its task has written its
        part files (``worker.run_task``); a task's exception is raised here."""
        ...

    def shutdown(self, cancel: bool = False) -> None:
        """Stop and release the workers. ``cancel``: the build is failing or interrupted —
        what has not started is dropped and running workers are stopped at once, so none
        writes on (a rerun resumes from the finished tasks' parts)."""
        ...


@contextmanager
def running(executor: Executor) -> Iterator[Executor]:
    """``executor`` for one build: shut down when the block ends, cancelled when it ends by
    an exception (a failure, Ctrl-C, SIGTERM, a consumer that stopped reading)."""
    try:
        yield executor
    except BaseException:
        executor.shutdown(cancel=True)
        raise
    executor.shutdown()


class LocalExecutor:
    """The ``local`` engine: forked worker processes of this machine, one per core
    (``--workers``; one task, or one worker: in this process).

    The workers are forked once this process has loaded the tokenizer and probed the
    template (``segmenter_for``), so they start with nothing to load, and each encodes on
    one thread (the workers own the cores). Compressed inputs are decompressed once, here,
    and each range's bytes are handed to its task (``RangeFeeder``); so at most ``4 ×
    workers`` tasks are submitted ahead of the result the build waits for, or the input
    would be held in memory."""

    def __init__(self, wconf: WorkerConfig, build: BuildConfig) -> None:
        self.wconf = wconf
        self.workers = build.workers
        self.feeder = RangeFeeder()
        self.tasks: list[Task] = []
        self.pool: ProcessPoolExecutor | None = None
        self.pending: deque[Future] = deque()
        self.upcoming: Iterator[Task] = iter(())

    def submit(self, tasks: Sequence[Task]) -> None:
        segmenter_for(self.wconf)  # before the fork: every worker inherits it
        self.tasks = list(tasks)
        self.upcoming = iter(self.tasks)
        workers = min(self.workers, len(self.tasks))
        if workers > 1:
            self.pool = start_pool(workers)
            for _ in range(4 * workers):
                self._submit_next()

    def _data(self, task: Task) -> bytes | None:
        return self.feeder.data_for(task.path, task.start, task.end)

    def _submit_next(self) -> None:
        task = next(self.upcoming, None)
        if task is not None and self.pool is not None:
            self.pending.append(self.pool.submit(run_task, task, self.wconf, self._data(task)))

    def results(self) -> Iterator[TaskResult]:
        if self.pool is None:
            with collected_as_in_a_worker():
                for task in self.upcoming:
                    yield run_task(task, self.wconf, self._data(task))
            return
        while self.pending:
            result = self.pending.popleft().result()
            self._submit_next()
            yield result

    def shutdown(self, cancel: bool = False) -> None:
        pool, self.pool = self.pool, None
        self.pending.clear()
        try:
            if pool is not None:
                if cancel:
                    kill_pool(pool)
                pool.shutdown(wait=True)
        finally:
            self.feeder.close()
