"""Run build tasks on Ray Data (``RayExecutor``, the ``ray`` engine): the same task
function as the local engine, ``map_batches`` over Arrow.

The task list becomes an Arrow table with one explicit schema (``TASK_SCHEMA``); each
Ray worker is an actor (``TaskRunner``) that loads the tokenizer once and runs
``worker.run_task`` — the very function the local executor runs — writing its part
files under ``OUT/.parts``. Blocks carry only Arrow columns (task fields in, counts as a
JSON string out), never pickled Python objects. The driver then finalizes exactly as
the local executor does (group advantages, ``train-XXXXX-of-NNNNN`` shards), so Ray and
local builds are identical row for row. On a cluster, ``--out`` must be a path every
node can write (a shared filesystem).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import asdict

import pyarrow as pa

from pipeline.build.worker import TaskResult, WorkerConfig, run_task
from pipeline.sources.files import Task

TASK_SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("path", pa.string()),
        ("format", pa.string()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("first_line", pa.int64()),
        ("paths", pa.list_(pa.string())),
    ]
)
RESULT_SCHEMA = pa.schema([("index", pa.int64()), ("result", pa.string())])


class TaskRunner:
    """A Ray Data actor: one tokenizer per worker process, loaded in ``__init__``."""

    def __init__(self, config: WorkerConfig):
        from pipeline.build.worker import segmenter_for

        self.config = config
        segmenter_for(config)

    def __call__(self, batch: pa.Table) -> pa.Table:
        indices, results = [], []
        for row in batch.cast(TASK_SCHEMA).to_pylist():
            task = Task(
                row["index"],
                row["path"],
                row["format"],
                row["start"],
                row["end"],
                row["first_line"],
                tuple(row["paths"] or ()),
            )
            indices.append(task.index)
            results.append(run_task(task, self.config).to_json())
        return pa.table(
            [pa.array(indices, pa.int64()), pa.array(results, pa.string())], schema=RESULT_SCHEMA
        )


class RayExecutor:
    """The ``ray`` engine (``pipeline/build/engines.py``), an ``Executor``
    (``pipeline/build/executor.py``): the tasks run as one Ray Data job when ``results``
    is read; ``shutdown`` stops reading it (Ray ends the job's actors). Ray itself stays up
    for the process (started here if no one had: ``--ray-address`` or a local one)."""

    def __init__(self, wconf: WorkerConfig, build) -> None:
        self.wconf = wconf
        self.address = build.ray_address
        self.workers = build.workers
        self.tasks: list[Task] = []
        self._results: Iterator[TaskResult] | None = None

    def submit(self, tasks: Sequence[Task]) -> None:
        self.tasks = list(tasks)

    def results(self) -> Iterator[TaskResult]:
        self._results = run_tasks_on_ray(self.tasks, self.wconf, self.address, self.workers)
        return self._results

    def shutdown(self, cancel: bool = False) -> None:
        if isinstance(self._results, Generator):
            self._results.close()
        self._results = None


def run_tasks_on_ray(
    tasks: list[Task], config: WorkerConfig, address: str | None, workers: int
) -> Iterator[TaskResult]:
    import logging

    import ray

    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(
                num_cpus=workers,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
    # seam prints its own progress and summary; Ray Data's per-operator log lines are noise here.
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False
    if not tasks:
        return
    # One block per task (no all-to-all repartition, which would need a CPU the actor
    # pool already holds), each block a one-row Arrow table with the explicit schema.
    blocks = [pa.Table.from_pylist([asdict(t)], schema=TASK_SCHEMA) for t in tasks]
    dataset = ray.data.from_arrow(blocks)
    actors = max(1, min(workers, len(tasks)))
    results = dataset.map_batches(
        TaskRunner,
        fn_constructor_kwargs={"config": config},
        batch_size=1,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=1,
    )
    finished = (
        TaskResult.from_json(result)
        for batch in results.iter_batches(batch_format="pyarrow", batch_size=None)
        for result in batch.column("result").to_pylist()  # batch_format="pyarrow": a Table
    )
    yield from in_task_order(finished, tasks)


def in_task_order(finished: Iterable[TaskResult], tasks: Sequence[Task]) -> Iterator[TaskResult]:
    """``finished`` (results in the order their tasks completed) in the order of ``tasks``,
    each as soon as every task before it has come back. Ray Data hands blocks back as the
    actors finish them, not in the dataset's order (``preserve_order`` would also hold the
    actors back), and the Executor protocol promises task order."""
    order = {t.index: i for i, t in enumerate(tasks)}
    waiting: dict[int, TaskResult] = {}
    following = 0
    for done in finished:
        waiting[order[done.task]] = done
        while following in waiting:
            yield waiting.pop(following)
            following += 1
