"""The executor protocol (``pipeline/build/executor.py``), run on every registered engine
(``pipeline/build/engines.py``): submitted tasks come back in task order as
``worker.run_task`` gives them, with their part files written; a cancelled executor leaves
no worker process behind; no task is no result. ``running`` shuts an executor down on every way
out. An engine that needs an extra (Ray) is a slow test and skipped where not installed."""

from __future__ import annotations

import json
import random
import time
from multiprocessing import active_children
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.build.config import BuildConfig
from pipeline.build.engines import ENGINES
from pipeline.build.executor import running
from pipeline.build.worker import TaskResult, part_paths, run_task
from pipeline.sources.files import Task, plan_tasks
from tests.robustness.records import good_record

ENGINE_NAMES = [
    pytest.param(e.name, marks=[pytest.mark.slow] if e.extra else [], id=e.name)
    for e in ENGINES.values()
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    rng = random.Random(11)
    records = [good_record(rng, f"r{i}", f"t{i % 3}") for i in range(9)]
    for i, r in enumerate(records):
        r["reward"] = float(i % 2)
    path = tmp_path_factory.mktemp("in") / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def ray_started(request):
    """The session's one local Ray (``tests/conftest.py``: ``local_ray``) for an engine that
    needs it; starting Ray is most of a Ray test's time, so the Ray tests share one."""
    return request


def _engine(name: str, ray_started) -> str:
    if ENGINES[name].extra:
        pytest.importorskip(ENGINES[name].extra)
        ray_started.getfixturevalue("local_ray")
    return name


def _plan(inputs: Path, out: Path, engine: str):
    config = BuildConfig(
        inputs=[str(inputs)], out=str(out), engine=engine, workers=2, progress=False
    )
    # Small ranges: several tasks from the one file.
    tasks = plan_tasks([inputs], "auto", chunk_bytes=inputs.stat().st_size // 4)
    return config, config.worker_config(len(tasks)), tasks


def _same(result: TaskResult) -> dict:
    """What a task reports, less its seconds (which differ from run to run)."""
    fields = json.loads(result.to_json())
    fields.pop("timings", None)
    return fields


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_results_come_back_in_task_order_as_run_task_gives_them(
    engine, inputs, tmp_path, ray_started
):
    config, wconf, tasks = _plan(inputs, tmp_path / "out", _engine(engine, ray_started))
    assert len(tasks) >= 3
    with running(ENGINES[engine].start(wconf, config)) as executor:
        executor.submit(tasks)
        results = list(executor.results())
    assert [r.task for r in results] == [t.index for t in tasks]
    for task in tasks:  # every task's part, quarantine and marker written under --out
        assert all(p.exists() for p in part_paths(config.out, task.index))
    _, here, _ = _plan(inputs, tmp_path / "here", "local")
    assert [_same(r) for r in results] == [_same(run_task(t, here)) for t in tasks]
    assert sum(r.counts.get("accepted", 0) for r in results) == 9


# Engines whose workers are processes of this machine (a Ray cluster's workers are Ray's
# to end: its executor stops reading the job).
OWN_WORKERS = [e.name for e in ENGINES.values() if e.owns_cores]


@pytest.mark.parametrize("engine", OWN_WORKERS)
def test_a_cancelled_executor_leaves_no_worker_running(engine, inputs, tmp_path, ray_started):
    config, wconf, tasks = _plan(inputs, tmp_path / "out", _engine(engine, ray_started))
    executor = ENGINES[engine].start(wconf, config)
    executor.submit(tasks)
    first = next(iter(executor.results()))
    assert first.task == tasks[0].index
    executor.shutdown(cancel=True)
    # A worker that took its stop sentinel may still be exiting for a few ms after
    # shutdown returns (seen: gone 50 ms later); one still there after 5 s was left running.
    deadline = time.monotonic() + 5
    while active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert active_children() == []


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_no_task_is_no_result(engine, inputs, tmp_path, ray_started):
    config, wconf, _ = _plan(inputs, tmp_path / "out", _engine(engine, ray_started))
    with running(ENGINES[engine].start(wconf, config)) as executor:
        executor.submit([])
        assert list(executor.results()) == []


class Recorder:
    """An executor that records what the build asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def submit(self, tasks) -> None:
        self.calls.append(("submit", len(tasks)))

    def results(self):
        return iter(())

    def shutdown(self, cancel: bool = False) -> None:
        self.calls.append(("shutdown", cancel))


def test_running_shuts_down_once_and_cancels_on_an_exception():
    ok = Recorder()
    with running(ok) as executor:
        executor.submit([])
    assert ok.calls == [("submit", 0), ("shutdown", False)]
    failed = Recorder()
    with pytest.raises(KeyboardInterrupt), running(failed) as executor:
        executor.submit([])
        raise KeyboardInterrupt
    assert failed.calls == [("submit", 0), ("shutdown", True)]


@settings(max_examples=50, deadline=None)
@given(
    st.permutations(range(6)), st.lists(st.integers(0, 10_000), min_size=6, max_size=6, unique=True)
)
def test_ray_results_are_put_back_in_task_order_whatever_order_the_actors_finish(
    finished_order, indices
):
    """Ray Data yields blocks as its actors finish them (a CI run saw tasks 1, 0, 2, 3);
    ``in_task_order`` gives them in the plan's order, each as soon as its predecessors came."""
    from pipeline.build.ray_engine import in_task_order  # imports no Ray

    tasks = [Task(index=i, path="in.jsonl", format="canonical") for i in indices]
    results = [
        TaskResult(
            task=i,
            file="f",
            format="canonical",
            rows=0,
            counts={},
            skipped={},
            seams={},
            groups={},
            rollouts=[],
        )
        for i in indices
    ]
    seen: list[int] = []

    def finishing():
        for k in finished_order:
            seen.append(k)
            yield results[k]

    out = []
    for r in in_task_order(finishing(), tasks):
        # yielded as soon as every task before it has finished, not later
        assert all(j in seen for j in range(len(out) + 1))
        out.append(r.task)
    assert out == indices


def test_tasks_run_in_this_process_collect_garbage_as_a_worker_does(inputs, tmp_path, monkeypatch):
    """One worker: the tasks run in the build process with a worker's cyclic GC (its loaded
    objects frozen, the youngest generation collected every ``GC_YOUNG_THRESHOLD``
    allocations), and the process's own settings come back after them."""
    import gc

    from pipeline.build import executor as executor_module
    from pipeline.build.worker import GC_YOUNG_THRESHOLD

    config = BuildConfig(inputs=[str(inputs)], out=str(tmp_path / "out"), workers=1, progress=False)
    tasks = plan_tasks([inputs], "auto", chunk_bytes=inputs.stat().st_size // 2)
    seen = []

    def recording(task, wconf, data):
        seen.append((gc.get_threshold()[0], gc.get_freeze_count()))
        return run_task(task, wconf, data)

    monkeypatch.setattr(executor_module, "run_task", recording)
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    with running(executor_module.LocalExecutor(config.worker_config(len(tasks)), config)) as ex:
        ex.submit(tasks)
        assert len(list(ex.results())) == len(tasks) > 1
    assert all(young == GC_YOUNG_THRESHOLD and frozen > 0 for young, frozen in seen), seen
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen_before or frozen_before > 0
