"""A build killed with SIGKILL at any point, then rerun, ends byte-identical to a build
that was never interrupted: no partial or duplicate shard, no temporary file, no worker
left writing, and the rerun skips the work that was finished (and says so).

Kills land at random moments chosen to cover every phase: while seam starts, just
after it takes the lock, after the k-th finished task, while shards are written, and
just after the manifest appears. Each rerun may itself be killed, so resumes of
resumes are covered too. ``SEAM_CRASH_KILLS`` sets the number of kills (default 10;
``make fuzz`` runs more).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.robustness.conftest import build_command, run_seam, seam_env, snapshot

# Ten kills and reruns of a real build process (~30 s): make test-all (make fuzz runs more).
pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("SEAM_CRASH_KILLS", "10"))
TRIGGERS = ("anytime", "locked", "tasks", "shards", "manifest")


def _markers(out: Path) -> int:
    return len(list(out.glob(".parts/part-*.json")))


def _resumable(out: Path) -> int:
    """Finished tasks a rerun will skip (none once the manifest exists: nothing to resume)."""
    if (out / "manifest.json").exists():
        return 0
    return sum(
        1
        for m in out.glob(".parts/part-*.json")
        if m.with_suffix(".arrow").exists() and m.with_suffix(".quarantine.jsonl").exists()
    )


def _fired(trigger: str, out: Path, k: int) -> bool:
    if trigger == "locked":
        return (out / ".parts" / "fingerprint").exists()
    if trigger == "tasks":
        return _markers(out) >= k
    if trigger == "shards":
        return any(out.glob("train-*")) or any(out.glob(".train-*"))
    if trigger == "manifest":
        return (out / "manifest.json").exists()
    return True


def _phase(out: Path, tasks: int) -> str:
    """Where a kill landed, judged by what is on disk."""
    if (out / "manifest.json").exists():
        return "after manifest" if (out / ".parts").exists() else "finished"
    if not (out / ".parts" / "fingerprint").exists():
        return "starting"
    if _markers(out) < tasks:
        return "running tasks"
    return "writing shards"


def _assert_consistent(out: Path, reference: dict[str, bytes]) -> None:
    """What a killed build leaves is complete or absent, never half-written."""
    for shard in out.glob("train-*.parquet"):
        assert (
            pq.read_metadata(shard).num_rows > 0 and shard.read_bytes() == reference[shard.name]
        ), shard
    if (out / "manifest.json").exists():
        json.loads((out / "manifest.json").read_text())
        return  # finished; .parts may be half removed
    for marker in out.glob(".parts/part-*.json"):
        json.loads(marker.read_text())
        assert (
            marker.with_suffix(".arrow").exists()
            and marker.with_suffix(".quarantine.jsonl").exists()
        )


def _assert_no_survivors(group: int) -> None:
    """No process of the killed build (worker, helper) lives on to write into --out."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    survivors = subprocess.run(
        ["ps", "-o", "pid,ppid,cmd", "-g", str(group)], capture_output=True, text=True
    ).stdout
    os.killpg(group, signal.SIGKILL)
    raise AssertionError(f"processes of a killed build outlived it:\n{survivors}")


def _kill_once(
    rng: random.Random, command: list[str], cwd: Path, trigger: str, tasks: int, seconds: float
):
    out = cwd / "out"
    k = rng.randint(1, tasks)
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=seam_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    delay = rng.uniform(0, seconds) if trigger == "anytime" else rng.uniform(0, 0.05)
    deadline = time.monotonic() + 300
    while proc.poll() is None and not _fired(trigger, out, k) and time.monotonic() < deadline:
        time.sleep(0.002)
    if proc.poll() is None:
        time.sleep(delay)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)  # the build process only: its workers must die with it
    _, stderr = proc.communicate()
    _assert_no_survivors(proc.pid)
    return proc.returncode, stderr


def test_sigkill_at_random_points_then_rerun_gives_the_bytes_of_an_uninterrupted_build(
    reference, tmp_path
):
    rng = random.Random(int(os.environ.get("SEAM_CRASH_SEED", "8")))
    command = build_command(reference.corpus)
    out = tmp_path / "out"
    landed: Counter = Counter()
    finished = kills = resumes = 0
    plan = [TRIGGERS[i % len(TRIGGERS)] for i in range(KILLS)]
    rng.shuffle(plan)
    started = time.monotonic()
    while kills < KILLS:
        before = _resumable(out)
        code, stderr = _kill_once(
            rng, command, tmp_path, plan[kills], reference.tasks, reference.seconds
        )
        _assert_consistent(out, reference.files)
        if (
            code == 0
        ):  # it finished before the kill: same bytes; start over to have work to interrupt
            finished += 1
            assert snapshot(out) == reference.files
            shutil.rmtree(out)
            continue
        assert code == -signal.SIGKILL, stderr
        landed[_phase(out, reference.tasks)] += 1
        kills += 1
        if before and _markers(out) > before:
            assert f"resuming: {before} of {reference.tasks} tasks already done" in stderr
            resumes += 1
    before = _resumable(out)
    final = run_seam(command, tmp_path)
    assert final.returncode == 0, final.stderr
    if before:
        assert (
            f"resuming: {before} of {reference.tasks} tasks already done, skipping them"
            in final.stderr
        )
    assert (
        snapshot(out) == reference.files
    )  # byte-identical; no extra shard, no temporary file, no lock
    print(
        f"\ncrash safety: {kills} SIGKILLs survived (phases: {dict(landed)}), {resumes + bool(before)} resumes "
        f"checked, {finished} builds finished before their kill; {time.monotonic() - started:.0f}s "
        f"(an uninterrupted build: {reference.seconds:.1f}s)"
    )
