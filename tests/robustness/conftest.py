"""Shared pieces of the robustness suite: a real-shaped input corpus on disk, seam run
as a real process, and a byte-exact picture of an output directory.

The reference build runs once per session with the options every process test uses:
small byte-range tasks and small shards, so a build has many parts and many shards to
be killed between. A process test that wants the reference's bytes runs ``seam
build-rl CORPUS --out out`` from its own working directory, so the recorded command is
the same.
"""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.sources.files import plan_tasks, resolve_inputs
from tests.robustness.records import broken_line, good_record, line

_SCRIPT = Path(sys.executable).with_name("seam")
SEAM = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "pipeline.cli"]
BUILD_OPTIONS = ["--chunk-mb", "0.008", "--rows-per-shard", "6", "--workers", "2", "--no-progress"]


def seam_env(**extra: str) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", **extra}


def build_command(corpus: Path, *options: str) -> list[str]:
    return [*SEAM, "build-rl", str(corpus), "--out", "out", *BUILD_OPTIONS, *options]


def run_seam(
    args: list[str], cwd: Path, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd, env=seam_env(**env), capture_output=True, text=True, timeout=timeout
    )


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (hidden ones included) → its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def write_corpus(directory: Path, rollouts: int = 36, seed: int = 0) -> Path:
    """Two JSONL files and one gzip file of good rollouts (12 tasks, so GRPO groups span
    files) with a broken line after every seventh."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    files: list[list[bytes]] = [[], [], []]
    for n in range(rollouts):
        lines = files[n % 3]
        lines.append(line(good_record(random.Random(rng.random()), f"r{n:04d}", f"task-{n % 12}")))
        if n % 7 == 6:
            lines.append(broken_line(n, n, f"bad{n}", f"bad-task-{n}"))
    for i, lines in enumerate(files):
        data = b"\n".join(lines) + b"\n"
        if i == 2:
            (directory / "c.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (directory / f"{'ab'[i]}.jsonl").write_bytes(data)
    return directory


@dataclass
class Reference:
    corpus: Path
    out: Path
    files: dict[str, bytes]
    seconds: float
    tasks: int


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "in")


@pytest.fixture(scope="session")
def reference(corpus, tmp_path_factory) -> Reference:
    """An uninterrupted build of the corpus: the bytes every other build must match."""
    cwd = tmp_path_factory.mktemp("reference")
    start = time.monotonic()
    done = run_seam(build_command(corpus), cwd)
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    tasks = plan_tasks(
        resolve_inputs([str(corpus)]), "auto", int(float(BUILD_OPTIONS[1]) * (1 << 20))
    )
    return Reference(corpus, cwd / "out", snapshot(cwd / "out"), seconds, len(tasks))
