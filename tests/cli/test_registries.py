"""Exports and engines are registries like the readers' (``pipeline/export_targets.py``,
``pipeline/build/engines.py``): a target or an engine registered from outside is used by
``seam export`` / ``run_build`` with nothing else to edit, and the checks and choices of
the command line follow the registry."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.build.engines import ENGINES, Engine, register_engine
from pipeline.build.run import BuildConfig, run_build
from pipeline.build.worker import run_task
from pipeline.cli import main
from pipeline.export_targets import EXPORTS, ExportTarget, register_export
from tests.robustness.records import good_record

RAN: list[str] = []  # the engine runs of this module, by name


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    rng = random.Random(5)
    records = [good_record(rng, f"r{i}", "t") for i in range(4)]
    for i, r in enumerate(records):
        r["reward"] = float(i % 2)
    path = tmp_path_factory.mktemp("in") / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


class SerialExecutor:
    """A toy engine: every task in this thread, in order, when its result is read."""

    def __init__(self, wconf, config) -> None:
        self.wconf, self.engine = wconf, config.engine
        self.tasks: list = []

    def submit(self, tasks) -> None:
        self.tasks = list(tasks)

    def results(self):
        RAN.append(self.engine)
        return (run_task(t, self.wconf) for t in self.tasks)

    def shutdown(self, cancel: bool = False) -> None:
        self.tasks = []


@pytest.fixture
def serial_engine():
    engine = register_engine(Engine("serial", f"{__name__}:SerialExecutor", "one task at a time."))
    yield engine
    del ENGINES["serial"]


def test_a_registered_engine_builds_the_same_bytes(inputs, tmp_path, serial_engine):
    def build(engine: str, name: str) -> dict[str, str]:
        config = BuildConfig(
            inputs=[str(inputs)], out=str(tmp_path / name), engine=engine, workers=1, progress=False
        )
        return run_build(config).manifest["shard_sha256"]

    RAN.clear()
    assert build("serial", "serial") == build("local", "local")
    assert RAN == ["serial"]  # the registry's executor ran, not the local pool
    assert "serial: one task at a time." in _help(["build-rl", "--help"])


def write_names(shards, out: Path, mode, decoder, max_length) -> tuple:
    """A toy export: the shard names, one a line."""
    (out / "names.txt").write_text("".join(f"{s.name}\n" for s in shards))
    return ["names.txt"], None, {}


@pytest.fixture
def names_target():
    target = register_export(
        ExportTarget("names", f"{__name__}:write_names", loading={None: "Read names.txt."})
    )
    yield target
    del EXPORTS["names"]


def test_a_registered_export_target_is_a_choice_and_writes(inputs, tmp_path, names_target):
    build = tmp_path / "build"
    run_build(BuildConfig(inputs=[str(inputs)], out=str(build), progress=False))
    out = tmp_path / "names"
    assert main(["export", str(build), "--to", "names", "--out", str(out)]) == 0
    assert (out / "names.txt").read_text().startswith("train-00000")
    assert "Read names.txt." in (out / "README.md").read_text()
    assert json.loads((out / "export.json").read_text())["files"] == ["names.txt"]
    assert "names" in _help(["export", "--help"])


def test_export_checks_follow_the_registry(inputs, tmp_path, capsys, names_target):
    build = tmp_path / "build"
    run_build(BuildConfig(inputs=[str(inputs)], out=str(build), progress=False))
    argv = ["export", str(build), "--out", str(tmp_path / "o")]
    assert main([*argv, "--to", "names", "--mode", "sft"]) == 2
    assert "--mode only applies to --to trl\n" in capsys.readouterr().err
    assert main([*argv, "--to", "names", "--tokenizer", "x"]) == 2
    assert "--tokenizer only applies to --to verl\n" in capsys.readouterr().err


def _help(argv: list[str]) -> str:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), pytest.raises(SystemExit):
        main(argv)
    return " ".join(buffer.getvalue().split())


def test_a_taken_name_is_refused_and_the_same_entry_again_is_not():
    local = ENGINES["local"]
    assert register_engine(local) is local
    with pytest.raises(ValueError, match="engine name 'local' is taken"):
        register_engine(Engine("local", f"{__name__}:SerialExecutor", "another."))
    assert ENGINES["local"] is local
    with pytest.raises(ValueError, match="export target name 'trl' is taken"):
        register_export(ExportTarget("trl", f"{__name__}:write_names", loading={}))
