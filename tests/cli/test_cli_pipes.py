"""`seam schema | head`, `seam sql --csv | head`, `seam judge | head`: when the reader of
stdout leaves, seam stops quietly with the status of a tool killed by SIGPIPE (141),
never a BrokenPipeError traceback. Real pipes, real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sample_builds import ROLLOUTS

ROOT = Path(__file__).resolve().parents[2]


def run_with_reader_gone(*args: str) -> tuple[int, str]:
    """Run ``seam ARGS`` with its stdout a pipe whose read end is closed before it writes."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


@pytest.fixture(scope="module")
def rollouts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pipes") / "in.jsonl"
    path.write_text(
        "".join(
            story(rid).build(reward=r).model_dump_json() + "\n" for rid, _, story, r in ROLLOUTS
        )
    )
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["schema"],
        ["sql", "{build}", "SELECT rollout_id, input_ids FROM segments", "--csv"],
        ["sql", "{build}", "SELECT 1 AS one", "--csv"],  # still buffered when the command ends
        ["judge", "{rollouts}", "--checks", "all"],  # (by default only trigger checks: none fire)
    ],
    ids=["schema", "sql-csv", "sql-csv-small", "judge"],
)
def test_a_reader_that_leaves_ends_the_command_quietly(command, rl_build, rollouts_file):
    args = [a.format(build=rl_build, rollouts=rollouts_file) for a in command]
    code, err = run_with_reader_gone(*args)
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, (
        err
    )
    assert code == 141


def test_a_reader_that_stays_gets_everything(rl_build):
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "schema"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert done.stdout.rstrip().endswith(b"}") and done.stderr == b""
