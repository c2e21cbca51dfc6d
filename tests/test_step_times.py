"""Seconds per build step (``pipeline/common/step_times.py``): nested steps count once, tasks add
up, and a build prints them and writes them with ``--timings FILE`` — never into the
manifest, whose bytes stay a function of the inputs and options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.build.worker import _SEGMENTERS
from pipeline.cli import main
from pipeline.common.step_times import ORDER, StepTimes
from pipeline.sources.canonical_io import iter_canonical_records, rollout_to_json

SAMPLE = Path(__file__).parents[1] / "data" / "sample" / "rollouts.jsonl.zst"
WORKER_STEPS = ("read", "validate", "render", "tokenize", "segment+mask", "rows", "write part")


class _Clock:
    """A clock the test moves: wall and CPU seconds advance only by ``tick``."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def tick(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu

    def perf_counter(self) -> float:
        return self.wall

    def process_time(self) -> float:
        return self.cpu


def test_a_nested_step_counts_in_itself_only(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr("pipeline.common.step_times.time", clock)
    times = StepTimes()
    with times.step("segment+mask"):
        clock.tick(2, 1)
        with times.step("tokenize"):
            clock.tick(5, 4)
            with times.step("render"):
                clock.tick(3, 3)
        clock.tick(1, 1)
    start = times.clock()
    clock.tick(7, 0.5)
    times.add_since("tasks", start)
    assert times.seconds == {
        "render": [3, 3],
        "tokenize": [5, 4],
        "segment+mask": [3, 2],
        "tasks": [7, 0.5],
    }


def test_a_span_timed_as_nested_counts_in_itself_only(monkeypatch):
    """``add_nested_since``: the renders between two encodes, timed as one span inside
    ``segment+mask``, are left out of it as a nested step is."""
    clock = _Clock()
    monkeypatch.setattr("pipeline.common.step_times.time", clock)
    times = StepTimes()
    with times.step("segment+mask"):
        clock.tick(1, 1)
        start = times.clock()
        clock.tick(4, 3)
        times.add_nested_since("render", start)
        with times.step("tokenize"):
            clock.tick(5, 5)
        clock.tick(2, 1)
    assert times.seconds == {"render": [4, 3], "tokenize": [5, 5], "segment+mask": [3, 2]}


def test_a_step_that_raises_is_still_counted():
    times = StepTimes()
    with pytest.raises(ValueError), times.step("read"):
        raise ValueError("bad record")
    assert "read" in times.seconds


def test_a_step_with_children_counts_the_cpu_of_the_processes_it_waited_for():
    burn = [
        sys.executable,
        "-c",
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass",
    ]
    times = StepTimes()
    with times.step("alone"):
        subprocess.run(burn, check=True)
    with times.step("verify", with_children=True):
        subprocess.run(burn, check=True)
    assert times.seconds["alone"][1] < 0.1 <= 0.3 <= times.seconds["verify"][1]


def test_tasks_add_up_and_steps_list_in_pipeline_order():
    a = StepTimes({"tokenize": [1.0, 0.5], "read": [0.25, 0.25]})
    b = StepTimes({"tokenize": [2.0, 1.5], "zzz": [1.0, 1.0]})
    total = StepTimes().merge(a).merge(b.as_json()).merge(None)
    assert total.seconds == {"tokenize": [3.0, 2.0], "read": [0.25, 0.25], "zzz": [1.0, 1.0]}
    assert [n for n, _, _ in total.ordered()] == ["read", "tokenize", "zzz"]
    assert ORDER.index("read") < ORDER.index("tokenize") < ORDER.index("verify")


@pytest.fixture(scope="module")
def small_input(tmp_path_factory) -> Path:
    """Two rollouts of the embedded sample, as plain JSONL."""
    lines = []
    for _, rollout in iter_canonical_records(SAMPLE):
        lines.append(rollout_to_json(rollout))
        if len(lines) == 2:
            break
    path = tmp_path_factory.mktemp("timings") / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _build(src: Path, out: Path, *extra: str) -> int:
    argv = ["build-rl", str(src), "--out", str(out), "--workers", "1", "--no-progress"]
    return main([*argv, "--verify", "none", *extra])


def test_a_build_prints_and_writes_its_step_times_outside_the_manifest(
    small_input, tmp_path, capsys
):
    plain, timed = tmp_path / "a" / "out", tmp_path / "b" / "out"  # same name: the card names it
    assert _build(small_input, plain) == 0
    assert "time per step" in capsys.readouterr().out
    timings = timed / "timings.json"
    for segmenter in _SEGMENTERS.values():  # the first build (in this process) encoded all
        segmenter.renderer.forget()
    assert _build(small_input, timed, "--timings", str(timings)) == 0
    document = json.loads(timings.read_text())
    assert document["rollouts"] == 2 and document["elapsed_s"] > 0
    steps = document["steps"]
    for name in WORKER_STEPS:
        assert steps[name]["where"] == "workers", name
        assert steps[name]["wall_s"] >= 0 and steps[name]["cpu_s"] >= 0, name
    assert steps["tokenize"]["cpu_s"] > 0
    assert steps["advantages+shards"]["where"] == "build"
    # The manifest holds no timing: both builds wrote the same bytes.
    for name in ("manifest.json", "train-00000-of-00001.parquet"):
        assert (plain / name).read_bytes() == (timed / name).read_bytes(), name
    # Written into the build folder, it is seam's: recorded, and --overwrite removes it.
    assert "timings.json" in (timed / ".seam-written").read_text().split()
    assert _build(small_input, timed, "--overwrite", "--rows-per-shard", "2") == 0
    assert not timings.exists()


def test_timings_deeper_inside_the_build_folder_are_refused(small_input, tmp_path, capsys):
    out = tmp_path / "out"
    assert _build(small_input, out, "--timings", str(out / "sub" / "t.json")) == 2
    assert "--timings" in capsys.readouterr().err
    assert not out.exists(), "refused before the build started"
