"""In a terminal the build shows its progress bar, and the bar's updates work (the CLI
enables it only when stderr is a terminal, so pipes and CI never exercised it: a
``TaskResult`` read as a dict crashed every interactive build after its first task)."""

from __future__ import annotations

import os
import pty
import random
import select
import subprocess
import sys
import time

import pytest

from pipeline.build.run import BuildConfig, run_build
from tests.robustness.records import good_record, line


def _inputs(tmp_path, n=6):
    rng = random.Random(5)
    records = [line({**good_record(rng, f"r{i}", "t"), "reward": float(i % 2)}) for i in range(n)]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(records) + b"\n")
    return path


def test_a_build_with_the_progress_bar_on_finishes(tmp_path):
    # several tasks (a tiny chunk size), so the bar advances more than once
    result = run_build(
        BuildConfig(
            inputs=[str(_inputs(tmp_path))],
            out=str(tmp_path / "out"),
            workers=1,
            progress=True,
            chunk_bytes=4096,
        )
    )
    assert result.counts["accepted"] == 6


def in_terminal(args: list[str]) -> str:
    """Run ``python -m pipeline.cli ARGS`` with a pseudo-terminal as stdin, stdout and
    stderr (as a user's shell runs it); its exit status must be 0; returns what it wrote."""
    main, child = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *args],
        stdin=child,
        stdout=child,
        stderr=child,
        close_fds=True,
    )
    os.close(child)
    output = b""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child side closed
                break
            if not chunk:
                break
            output += chunk
        elif process.poll() is not None:
            break
    os.close(main)
    text = output.decode(errors="replace")
    assert process.wait(timeout=30) == 0, text[-2000:]
    assert "Traceback" not in text
    return text


@pytest.mark.slow
def test_the_long_commands_show_their_bars_in_a_terminal(tmp_path):
    source = str(_inputs(tmp_path))
    assert "building" in in_terminal(["build-rl", source, "--out", str(tmp_path / "rl")])
    in_terminal(["ingest", source, "--out", str(tmp_path / "canonical")])
    in_terminal(["simulate", "--n", "4", "--out", str(tmp_path / "sim"), "--workers", "1"])
    # verify has a bar of its own (the build's audit uses it too) and takes --no-progress
    assert "verifying (all)" in in_terminal(["verify", str(tmp_path / "rl")])
    quiet = in_terminal(["verify", str(tmp_path / "rl"), "--no-progress"])
    assert "verifying (all)" not in quiet and "verified" in quiet
