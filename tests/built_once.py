"""Session builds that every pytest-xdist worker shares (``make test`` runs two workers).

A session-scoped fixture runs once per worker process, so under ``pytest -n 2`` each
worker would build the sample again (two builds of the 256 sample rollouts are ~50 s of
CPU). ``built_once`` builds a directory once per test run: the first worker to ask builds
it under a file lock in the run's common base temporary folder (``getbasetemp().parent``,
the folder xdist gives each worker's own base folder in), the others wait for the lock and
read what it wrote. Without xdist it is a plain ``mktemp`` and build.

``SEAM_TEST_SHARED_BUILDS=DIR`` puts that common folder in DIR for any number of pytest
runs at once: CI's two pytest lanes (``make test`` and the slow tests) then build the
sample once between them instead of once each (~100 s of CPU on two loaded cores).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]
) -> Path:
    """``build(folder)`` run once per test run (all workers); the folder it filled."""
    shared = os.environ.get("SEAM_TEST_SHARED_BUILDS")
    if not shared and not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    from filelock import FileLock  # with pytest-xdist (dev extra) only

    common = Path(shared) if shared else tmp_path_factory.getbasetemp().parent
    folder, done = common / name, common / f"{name}.done"
    with FileLock(str(common / f"{name}.lock")):
        if not done.exists():
            # A worker whose build failed leaves a partial folder: build it afresh.
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder
