"""``ReadContext`` (``pipeline/sources/read_context.py``): the limits and reader options a reading
runs under are passed to it, not set for the process. Two readings with different limits
in one process (two builds on threads, two readers consumed in turns) each keep their
own; a reader option no input's reader takes is one line, not silently ignored."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest

from pipeline.build.run import BuildConfig, run_build
from pipeline.cli import main
from pipeline.sources import limits
from pipeline.sources.files import Task
from pipeline.sources.intake import ACCEPTED, QUARANTINED, iter_records
from pipeline.sources.limits import Limits
from pipeline.sources.read_context import ReadContext, ReaderOptionError
from tests.readers.util import fixture
from tests.robustness.records import good_record

KIB = 1 << 10
SMALL = Limits(max_line_bytes=64 * KIB)  # the big record's line (~200 KB) is over it


@pytest.fixture(scope="module")
def canonical(tmp_path_factory) -> Path:
    """Four rollouts of one task; the second's line is ~200 KB (a long task message)."""
    rng = random.Random(3)
    records = [good_record(rng, f"r{i}", "t") for i in range(4)]
    for i, r in enumerate(records):
        r["reward"] = float(i % 2)
    records[1]["events"][1]["content"] += " word" * 40_000
    path = tmp_path_factory.mktemp("in") / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _kinds(records) -> list[tuple[str, int | None]]:
    return [(r.kind, r.line) for r in records]


def test_two_readings_consumed_in_turns_keep_their_own_limits(canonical):
    task = Task(0, str(canonical), "canonical")
    small = iter_records(task, context=ReadContext(SMALL))
    default = iter_records(task, context=ReadContext())
    got: dict[str, list] = {"small": [], "default": []}
    for a, b in zip(small, default):  # one record of each in turn, one thread
        got["small"].append(a)
        got["default"].append(b)
    assert _kinds(got["small"]) == [(ACCEPTED, 1), (QUARANTINED, 2), (ACCEPTED, 3), (ACCEPTED, 4)]
    assert "max_line_bytes limit (0.0625 MiB" in got["small"][1].reason
    assert _kinds(got["default"]) == [(ACCEPTED, n) for n in (1, 2, 3, 4)]
    assert limits.current() == Limits()  # nothing left set


def test_two_builds_on_threads_with_different_limits_do_not_interfere(
    canonical, tmp_path, monkeypatch
):
    """Both builds run at once in one process (a notebook running two): each quarantines
    by its own limits. Each task's reading waits for the other build's to have started
    too, so with one process-wide setting whichever build set it last would decide both
    (fails with a module global set by every reading)."""
    import pipeline.sources.intake as intake

    barrier = threading.Barrier(2, timeout=60)
    results: dict[str, object] = {}
    canonical_records = intake._canonical

    def in_step(*args):
        barrier.wait()  # both readings have set up their limits before either reads
        yield from canonical_records(*args)

    monkeypatch.setattr(intake, "_canonical", in_step)

    def build(name: str, lim: Limits) -> None:
        config = BuildConfig(
            inputs=[str(canonical)], out=str(tmp_path / name), workers=1, progress=False, limits=lim
        )
        barrier.wait()
        results[name] = run_build(config)

    threads = [
        threading.Thread(target=build, args=("small", SMALL)),
        threading.Thread(target=build, args=("default", Limits())),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["small"].counts["quarantined"] == 1  # type: ignore[attr-defined]
    assert results["small"].counts["accepted"] == 3  # type: ignore[attr-defined]
    assert results["default"].counts["quarantined"] == 0  # type: ignore[attr-defined]
    assert results["default"].counts["accepted"] == 4  # type: ignore[attr-defined]


def test_a_reader_option_no_input_reader_takes_is_refused():
    context = ReadContext.of(group_by="request.model")
    context.check_readers(["chat-completions", "claude-code"])  # one of them takes it
    with pytest.raises(ReaderOptionError, match="--group-by applies only to chat-completions"):
        context.check_readers(["canonical", "claude-code"])
    ReadContext().check_readers(["canonical"])  # nothing set: nothing to refuse


@pytest.mark.parametrize("command", ["build-rl", "ingest", "judge", "audit"])
def test_group_by_on_inputs_whose_reader_ignores_it_is_one_line(command, tmp_path, capsys):
    log = fixture("claude_code", "compact_auto.jsonl")
    argv = [command, str(log), "--group-by", "session_id"]
    if command in ("build-rl", "ingest"):
        argv += ["--out", str(tmp_path / "out")]
    if command == "build-rl":
        argv += ["--rewards", str(_rewards(tmp_path))]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"seam {command}: error: --group-by applies only to chat-completions input; these "
        "inputs are read as claude-code: drop --group-by\n"
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _rewards(tmp_path: Path) -> Path:
    path = tmp_path / "rewards.jsonl"
    path.write_text('{"rollout_id": "x", "reward": 1}\n')
    return path
