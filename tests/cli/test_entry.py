"""The process entry (``seam``, ``python -m pipeline.cli``): a finished build exits at once,
without Python's teardown, yet with its atexit handlers run, its output flushed into a
pipe and its status kept; other commands exit the normal way."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import pipeline.cli as cli
from tests.sample_builds import ROLLOUTS

ROOT = Path(__file__).resolve().parents[2]

# Runs ``entry()`` as the process entry with the given argv, recording whether it left by
# ``os._exit`` (and with which status) and whether the atexit handlers ran.
SCRIPT = """
import atexit, os, sys
marks = sys.argv[1]
real_exit = os._exit
def hard_exit(code):
    with open(marks, "a") as fh:
        fh.write(f"os._exit {code}\\n")
    real_exit(code)
os._exit = hard_exit
atexit.register(lambda: open(marks, "a").write("atexit ran\\n"))
sys.argv = ["seam", *sys.argv[2:]]
from pipeline.cli import entry
entry()
"""


def _run(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    marks = tmp_path / "marks"
    marks.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(marks), *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    return done, marks.read_text().splitlines() if marks.exists() else []


class _HardExit(Exception):
    pass


def test_entry_skips_the_teardown_only_after_a_build_and_alone(monkeypatch):
    left = []

    def hard_exit(code):
        left.append(("os._exit", code))
        raise _HardExit

    monkeypatch.setattr(cli, "main", lambda: 3)
    # The threads alive besides this test's own (pytest-xdist's worker runs a few of its
    # own): counted from here, so "alone" means no thread started after this point.
    baseline, real_count = threading.active_count(), threading.active_count
    monkeypatch.setattr(cli.threading, "active_count", lambda: real_count() - baseline + 1)
    monkeypatch.setattr(cli.atexit, "_run_exitfuncs", lambda: left.append("atexit"))
    monkeypatch.setattr(cli.os, "_exit", hard_exit)
    monkeypatch.setattr(sys, "argv", ["seam", "build-sft", "in.jsonl"])
    with pytest.raises(_HardExit):
        cli.entry()
    assert left == ["atexit", ("os._exit", 3)]
    left.clear()
    for argv in (["seam", "schema"], ["seam"]):
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as exited:
            cli.entry()
        assert exited.value.code == 3 and left == []
    # Another thread alive: it would be cut off, so the build exits the normal way.
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        monkeypatch.setattr(sys, "argv", ["seam", "build-rl", "in.jsonl"])
        with pytest.raises(SystemExit):
            cli.entry()
        assert left == []
    finally:
        release.set()
        other.join()


@pytest.mark.slow  # a fresh interpreter per run: ~3 s each on two loaded cores
def test_a_finished_build_exits_at_once_with_its_output_and_atexit_handlers(tmp_path):
    rid, _, story, reward = ROLLOUTS[0]
    (tmp_path / "in.jsonl").write_text(story(rid).build(reward=reward).model_dump_json() + "\n")
    done, marks = _run(
        tmp_path, "build-rl", "in.jsonl", "--out", "out", "--workers", "1", "--no-progress"
    )
    assert done.returncode == 0, done.stderr
    assert marks == ["atexit ran", "os._exit 0"]
    assert "time per step" in done.stdout  # the last table, flushed into the pipe
    assert (tmp_path / "out" / "manifest.json").is_file()


@pytest.mark.slow
def test_a_failed_build_keeps_its_status_other_commands_exit_the_normal_way(tmp_path):
    done, marks = _run(tmp_path, "build-rl", "missing.jsonl", "--out", "out")
    assert done.returncode == 2 and "does not exist" in done.stderr
    assert marks == ["atexit ran", "os._exit 2"]
    done, marks = _run(tmp_path, "build-rl", "missing.jsonl")  # no --out: argparse exits
    assert done.returncode == 2 and marks == ["atexit ran"]
    done, marks = _run(tmp_path, "schema")
    assert done.returncode == 0 and marks == ["atexit ran"]
