"""The stage registry (``pipeline/build/stage.py``): a stage registered from outside seam — here a
toy one defined in this module — builds, verifies, shows and exports without any seam
code knowing its name; readers of a build resolve its stage from ``manifest.json``."""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomllib

from pipeline.build.run import BuildConfig, run_build
from pipeline.build.stage import (
    ENTRY_POINT_GROUP,
    SHIPPED_ENTRY_POINTS,
    PlainStage,
    UnknownStageError,
    register_stage,
    stage_class,
    stage_of_manifest,
)
from pipeline.export import export_build
from pipeline.inspect.show.load import load_view
from pipeline.inspect.verify import verify_build
from schemas.rollout import MessageEvent, Rollout
from tests.judge.rollouts import Story

TOY = "toy-first-call"
ROOT = Path(__file__).resolve().parents[1]


def first_call_only(rollout: Rollout) -> Rollout:
    """The rollout cut after its first assistant call: the toy stage's change, which a
    reader must re-apply to line the rollout up with the rows."""
    events = rollout.events
    cut = next(
        i + 1 for i, e in enumerate(events) if isinstance(e, MessageEvent) and e.role == "assistant"
    )
    return rollout.model_copy(update={"events": events[:cut]})


class ToyTask:
    def __init__(self) -> None:
        self.seen = 0

    def prepare(self, rollout: Rollout) -> tuple[Rollout | None, str | None, list[dict]]:
        return first_call_only(rollout), None, []

    def keep_segment(self, num_tokens: int) -> bool:
        return True

    def accept(self, rollout: Rollout, segments: Sequence[Any]) -> dict[str, list]:
        self.seen += 1
        return {"toy_calls": [len(m.segment.spans) for m in segments]}

    def close(self) -> dict[str, Any]:
        return {"toy_rollouts": self.seen}


@dataclass(frozen=True)
class ToyStage(PlainStage):
    """Keeps each rollout's first call; needs no outcome; its rows are SFT data."""

    label: str = "toy"

    extra_fields = [pa.field("toy_calls", pa.int32(), nullable=False, metadata={"doc": "calls"})]
    requires_outcome = False
    trl_mode = "sft"

    @classmethod
    def from_manifest(cls, recorded: Mapping[str, Any]) -> ToyStage:
        return cls(label=recorded["label"])

    def as_built(self, rollout: Rollout) -> Rollout:
        return first_call_only(rollout)

    def fingerprint(self) -> dict:
        return {"label": self.label}

    def open_task(self, out: str, task_index: int) -> ToyTask:
        return ToyTask()

    def finalize(self, out, task_indices, dest=None, excluded=None) -> dict:
        return {}


def _story(rollout_id: str) -> Rollout:
    return (
        Story(rollout_id)
        .act(("bash", {"cmd": "ls"}, "a.py b.py"))
        .act(("read_file", {"path": "a.py"}, "print(1)"))
        .say("Done: a.py prints 1.")
        .build()
    )


@pytest.fixture(scope="module")
def toy_build(tmp_path_factory) -> Path:
    register_stage(TOY, ToyStage)
    root = tmp_path_factory.mktemp("toy")
    src = root / "rollouts.jsonl"
    src.write_text("".join(_story(f"r{i}").model_dump_json() + "\n" for i in range(3)))
    out = root / "out"
    config = BuildConfig(
        inputs=[str(src)], out=str(out), kind=TOY, stage=ToyStage(), workers=1, progress=False
    )
    run_build(config)
    return out


def test_a_registered_stage_builds_and_its_manifest_names_it(toy_build):
    manifest = json.loads((toy_build / "manifest.json").read_text())
    assert manifest["kind"] == TOY
    assert manifest["config"]["stage"] == {"label": "toy"}
    assert manifest["counts"]["accepted"] == 3  # no rewards: the stage needs no outcome
    assert manifest["counts"]["toy_rollouts"] == 3
    rows = pq.read_table(toy_build / manifest["shards"][0]).to_pylist()
    assert [r["toy_calls"] for r in rows] == [1, 1, 1]
    assert stage_of_manifest(manifest) == ToyStage("toy")


def test_verify_replays_the_rollout_as_the_stage_built_it(toy_build):
    result = verify_build(toy_build, "all")
    assert result.ok, [m.line() for m in result.mismatches]
    assert result.totals()["spans"] == 3


def test_show_numbers_the_calls_as_the_stage_built_them(toy_build):
    view = load_view(toy_build, "r1")
    assert view.note is None
    assert sorted(view.calls) == [0]  # the input rollout has three calls; the build kept one


def test_export_takes_the_stage_s_trainer_mode(toy_build, tmp_path):
    assert export_build(toy_build, "trl", tmp_path / "trl").mode == "sft"


def test_a_stage_no_registry_knows_is_one_clear_line():
    with pytest.raises(UnknownStageError, match="no seam stage is registered as 'nope'"):
        stage_of_manifest({"kind": "nope", "config": {}})


def test_shipped_stages_resolve_and_read_their_recorded_config():
    assert stage_class("rl") is PlainStage
    assert stage_of_manifest({"kind": "rl", "config": {}}).as_built is not None
    recorded = {
        "filters": {"max_tokens": 9, "malformed": False, "gone_option": 1},
        "corrections_sha256": None,
        "synthesize_summary_calls": {"prompt": "Summarize."},
    }
    sft = stage_of_manifest({"kind": "sft", "config": {"stage": recorded}})
    assert type(sft).__name__ == "SftStage"
    assert (sft.filters.max_tokens, sft.filters.malformed) == (9, False)
    assert sft.synthesize_prompt == "Summarize."
    assert sft.drops_segments and not sft.requires_outcome
    assert sft.quarantine_counts == ("corrections_quarantined",)


def test_an_installed_package_s_entry_point_registers_its_stage(monkeypatch):
    """A package that declares ``[project.entry-points."seam.stages"]`` is found without
    any import of it: the name resolves to its class on first use."""
    import pipeline.build.stage as stage_module

    point = EntryPoint("toy-installed", f"{__name__}:ToyStage", ENTRY_POINT_GROUP)
    asked = []

    def entry_points(group):
        asked.append(group)
        return [point]

    monkeypatch.setattr(stage_module, "entry_points", entry_points)
    monkeypatch.delitem(stage_module._REGISTERED, "toy-installed", raising=False)
    assert stage_class("toy-installed") is ToyStage
    assert asked == [ENTRY_POINT_GROUP]
    stage_module._REGISTERED.pop("toy-installed")


def test_seam_declares_its_stages_as_entry_points():
    """pyproject.toml's seam.stages entry points are the ones the registry falls back on
    (an install made before they existed), and each resolves to a stage class."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[ENTRY_POINT_GROUP] == SHIPPED_ENTRY_POINTS
    for name, target in SHIPPED_ENTRY_POINTS.items():
        module, _, attr = target.partition(":")
        assert issubclass(getattr(importlib.import_module(module), attr), PlainStage), name


def test_verl_s_sft_dataset_takes_a_build_whose_stage_makes_sft_rows(toy_build, tmp_path):
    """``pipeline.export.verl_sft.shard_paths`` asks the build's stage, not its name: the
    toy stage's rows are SFT rows; a plain RL build is refused in one line."""
    pytest.importorskip("torch")
    from pipeline.export.verl_sft import shard_paths

    manifest = json.loads((toy_build / "manifest.json").read_text())
    assert shard_paths(toy_build) == [toy_build / s for s in manifest["shards"]]
    rl = tmp_path / "rl"
    rl.mkdir()
    (rl / "manifest.json").write_text(json.dumps({**manifest, "kind": "rl", "config": {}}))
    with pytest.raises(ValueError, match="is a seam rl build: SFT on it would train every"):
        shard_paths(rl)
