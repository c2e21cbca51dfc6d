"""``seam simulate`` with worker processes always ends.

It used to leave ``with multiprocessing.Pool(...)`` once every chunk was back, so
``Pool.__exit__`` called ``terminate()``: SIGTERM to each worker, then a join. The workers
inherited seam's SIGTERM handler (``pipeline.cli.handle_termination``: it raises instead
of exiting), and one caught on the task queue's lock never exited, so the join waited
forever (the parent in ``Pool._terminate_pool``, the worker in ``SemLock.__enter__``).
On 2 cores that hung about one run in three. Here the command runs many times in a row,
each under a timeout, the way the CLI runs it (its signal handlers installed).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from contextlib import suppress
from pathlib import Path

import pytest

# Twenty simulator runs with worker processes (~12 s): make test-all.
pytestmark = pytest.mark.slow

RUNS = 20
PER_RUN_S = 30  # a run takes about a second on a busy core; a hung one never ends
ROLLOUTS, WORKERS = 4, 4  # one chunk of 4 tasks: three workers idle at the end, as after
# most runs of a big simulation (the CLI's own cap, --n / 4 workers, needs 16 rollouts)


def _run_simulate_repeatedly(conn, out: Path) -> None:
    """In a forked child (it has the tokenizer already): ``seam simulate``'s run, RUNS
    times, with the CLI's signal handlers installed; say after each run that it ended."""
    os.setpgrp()  # so a hung run's workers can be killed with it
    from pipeline.cli import handle_termination
    from pipeline.simulate.run import Job, run

    handle_termination()
    for i in range(RUNS):
        job = Job(ROLLOUTS, str(i), 1, out / f"r{i}.jsonl", "jsonl", WORKERS)
        conn.send((i, run(job).rollouts))
    conn.close()


def test_simulate_with_workers_ends_every_time(tmp_path, renderer, monkeypatch):
    from pipeline.simulate import run as simulate_run
    from pipeline.simulate.context import Engine

    # The engine the workers would load; set here, it is inherited by every fork.
    monkeypatch.setattr(simulate_run, "_ENGINE", Engine(renderer))
    ctx = multiprocessing.get_context("fork")
    results, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_run_simulate_repeatedly, args=(sender, tmp_path))
    child.start()
    sender.close()
    try:
        for i in range(RUNS):
            if not results.poll(PER_RUN_S):
                pytest.fail(f"seam simulate --workers {WORKERS}: run {i + 1} of {RUNS} hung")
            assert results.recv() == (i, ROLLOUTS)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.join()
    for i in range(RUNS):
        assert len((tmp_path / f"r{i}.jsonl").read_bytes().splitlines()) == ROLLOUTS
