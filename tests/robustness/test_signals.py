"""SIGTERM and SIGHUP (a job scheduler, a closed terminal) end a build like Ctrl-C does:
one line, exit 128 + signal, no temporary file, no lock and no worker left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.robustness.conftest import build_command, seam_env


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_build_cleans_up_and_says_so(reference, tmp_path, signum):
    build = subprocess.Popen(
        build_command(reference.corpus),
        cwd=tmp_path,
        env=seam_env(),
        start_new_session=True,  # its own process group: workers are checked for below
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = tmp_path / "out"
    deadline = time.monotonic() + 300
    while not list((out / ".parts").glob("part-*.json")):  # workers running, parts written
        assert build.poll() is None and time.monotonic() < deadline, build.stderr.read()
        time.sleep(0.01)
    os.kill(build.pid, signum)  # the build process only, as `kill PID` does
    stderr = build.stderr.read()
    assert build.wait(timeout=120) == 128 + signum, stderr
    assert stderr == f"seam build-rl: terminated ({signum.name})\n"
    deadline = time.monotonic() + 10
    while _alive(build.pid):  # workers die with the build
        assert time.monotonic() < deadline, "a worker outlived the build"
        time.sleep(0.05)
    assert not (out / ".lock").exists()
    assert not [p for p in out.rglob(".*.tmp")]
    assert not (out / "manifest.json").exists()
