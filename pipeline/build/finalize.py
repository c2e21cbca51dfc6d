"""The build's second stage: once every task has written its part, in the build process.

The finalize stage is a list of steps like the tasks' (``pipeline/build/steps.py``), run
once each, in order, over one ``Finalizing`` (what the tasks reported, and what the
steps have made of it so far). Each ``FinalStep`` has its own counters (``StepStats``,
in ``BuildResult.finalize_stats``; never in the manifest, whose bytes they do not
change) and is timed under its name in the build's step times:

=====================  ===================================================================
step                   what it does
=====================  ===================================================================
duplicates             the tasks' counts added up (``BuildStats.merge``); a rollout id
                       accepted before, in another task or the same one (``FirstSeen``,
                       in input order), is quarantined and taken back out of the counts
advantages+shards      GRPO advantages per task group, the ``train-XXXXX-of-NNNNN`` shards
                       and their sha256 (``pipeline/build/write.py``)
quarantine             the parts' quarantine and the duplicates' entries merged into
                       ``quarantine.jsonl``; every quarantined record must be there (or
                       counted past its caps)
stage                  the build stage's side outputs and counts (``BuildStage.finalize``)
card+manifest          published: staging renamed into ``--out``, ``README.md`` (the
                       card), then ``manifest.json`` (last)
=====================  ===================================================================

Everything a loader would read is written into ``OUT/.parts/publish`` and renamed into
place only once the whole set is complete (``publish``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pipeline import __version__
from pipeline.build import out_dir
from pipeline.build.quarantine import NOT_WRITTEN, merge_quarantine
from pipeline.build.stats import BuildStats
from pipeline.build.steps import FirstSeen, PipelineStats, Rejection, StepStats
from pipeline.build.worker import TaskResult, part_paths
from pipeline.build.write import write_shards
from pipeline.common.atomic import write_json
from pipeline.common.step_times import StepTimes
from pipeline.core.shard_schema import SHARD_SCHEMA_VERSION

if TYPE_CHECKING:
    from pipeline.build.config import BuildConfig


@dataclass
class Finalizing:
    """What the finalize steps work on: the build (``config``, ``out``, its task indices
    and results, what the manifest records of it) and what the steps make of it."""

    config: BuildConfig
    out: Path
    indices: list[int]  # the tasks' indices, in task order
    results: list[TaskResult]  # the tasks' results, in task order
    recorded: dict[str, Any]  # command, fingerprint, tokenizer, inputs (the manifest's)
    stats: BuildStats = field(default_factory=BuildStats)
    # Per task index, the ordinals of rollouts taken back out (later copies of an id).
    excluded: dict[int, set[int]] = field(default_factory=dict)
    duplicate_entries: list[bytes] = field(default_factory=list)  # their quarantine lines
    shard_sha256: dict[str, str] = field(default_factory=dict)
    groups_of_one: int = 0
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def staging(self) -> Path:
        return self.out / ".parts" / "publish"

    @property
    def extra_fields(self) -> list:
        stage = self.config.stage
        return list(stage.extra_fields) if stage is not None else []


class FinalStep:
    """One step of the finalize stage: ``run`` once over the ``Finalizing``, counting into
    ``stats``; timed as ``name``."""

    name: ClassVar[str] = "final step"

    def __init__(self) -> None:
        self.stats = StepStats(self.name)

    def run(self, f: Finalizing) -> None:
        raise NotImplementedError


class DropCrossTaskDuplicates(FinalStep):
    """The tasks' counts added up, then every rollout whose id was accepted before (in
    input order; ``FirstSeen``, the rule every command applies) quarantined — it would
    join its GRPO group twice and skew the group's advantages — and taken back out of the
    counts, seams and per-file counts, as if never read. ``stats``: rollouts seen,
    passed, quarantined."""

    name = "duplicates"

    def run(self, f: Finalizing) -> None:
        for r in f.results:
            f.stats.merge(BuildStats.of_task(r))
        counts, seams, per_file = f.stats.counts, f.stats.seams, f.stats.per_file
        zero_before = {id(c): {k for k, v in c.items() if v == 0} for c in (counts, seams)}
        seen = FirstSeen()
        for r in f.results:
            for ordinal, (rid, file, line, own, own_seams) in enumerate(r.rollouts):
                self.stats.seen += 1
                here = f"{file}:{line}" if line is not None else file
                reason = seen.duplicate(rid, here)
                if reason is None:
                    self.stats.passed += 1
                    continue
                self.stats.quarantined += 1
                f.excluded.setdefault(r.task, set()).add(ordinal)
                counts.subtract(own)
                counts["quarantined"] += 1
                seams.subtract(own_seams)
                per_file[r.file]["accepted"] -= 1
                per_file[r.file]["quarantined"] += 1
                entry = Rejection(file, line, r.format, reason).entry()
                f.duplicate_entries.append(json.dumps(entry, ensure_ascii=False).encode() + b"\n")
        for counter in (counts, seams):  # what only the copies had is gone
            for key in [
                k for k, v in counter.items() if v == 0 and k not in zero_before[id(counter)]
            ]:
                del counter[key]


class AdvantagesAndShards(FinalStep):
    """GRPO advantages per task group and the shards (``write.write_shards``), written into
    the staging directory; counts ``shards`` and ``groups_of_one`` (advantage 0)."""

    name = "advantages+shards"

    def run(self, f: Finalizing) -> None:
        c = f.config
        f.shard_sha256, f.groups_of_one = write_shards(
            c.out,
            f.results,
            c.rows_per_shard,
            c.use_std,
            f.extra_fields,
            c.workers,
            c.std_ddof,
            dest=f.staging,
            excluded=f.excluded,
        )
        self.stats.counts.update(shards=len(f.shard_sha256), groups_of_one=f.groups_of_one)


class MergeQuarantine(FinalStep):
    """The tasks' quarantine parts and the duplicates' entries into ``quarantine.jsonl``
    (within the build's caps; entries past them counted as ``NOT_WRITTEN``). Every
    quarantined record must be there: the rollouts the tasks and the duplicate step
    quarantined, plus a stage's records that are not rollouts (its ``quarantine_counts``,
    e.g. the SFT stage's judge corrections); else the build fails before it publishes."""

    name = "quarantine"

    def run(self, f: Finalizing) -> None:
        c, counts = f.config, f.stats.counts
        written, not_written = merge_quarantine(
            [part_paths(c.out, i)[1] for i in f.indices],
            f.staging / "quarantine.jsonl",
            c.limits,
            extra=f.duplicate_entries,
        )
        self.stats.counts.update(written=written, not_written=not_written)
        if not_written:
            counts[NOT_WRITTEN] += not_written
        others = tuple(getattr(c.stage, "quarantine_counts", ()))
        entries = counts["quarantined"] + sum(counts[k] for k in others)
        if written + counts[NOT_WRITTEN] != entries:
            raise RuntimeError(
                f"quarantine.jsonl holds {written} entries ({counts[NOT_WRITTEN]} more counted, "
                f"not written) but the tasks counted {counts['quarantined']} rollouts and "
                f"{entries - counts['quarantined']} other records ({', '.join(others) or 'none'}): "
                "a record would be lost; this is a bug in seam"
            )


class StageFinalize(FinalStep):
    """The build stage's merge of its tasks' side files (``BuildStage.finalize``, told
    which rollouts were taken back out); its counts join the manifest's."""

    name = "stage"

    def run(self, f: Finalizing) -> None:
        assert f.config.stage is not None
        own = f.config.stage.finalize(f.config.out, f.indices, dest=f.staging, excluded=f.excluded)
        self.stats.counts.update(own)
        f.stats.counts.update(own)


class PublishWithCard(FinalStep):
    """The manifest made; the staging directory renamed into ``--out`` (``publish``), then
    the card (``README.md``) and ``manifest.json``, last: a directory with a manifest is a
    complete build. ``.parts`` is removed once the manifest exists."""

    name = "card+manifest"

    def run(self, f: Finalizing) -> None:
        from pipeline.build.card import write_card

        s, c = f.stats, f.config
        for k in ("read", "accepted", "quarantined"):
            s.counts.setdefault(k, 0)
        f.manifest = {
            "seam_version": __version__,
            "shard_schema_version": SHARD_SCHEMA_VERSION,
            "kind": c.kind,
            "command": f.recorded["command"],
            "config": c.fingerprint_config(),
            "fingerprint": f.recorded["fingerprint"],
            "tokenizer": f.recorded["tokenizer"],
            "inputs": f.recorded["inputs"],
            "shards": list(f.shard_sha256),
            "shard_sha256": f.shard_sha256,
            "counts": dict(sorted(s.counts.items())),
            "seams": dict(sorted(s.seams.items())),
            "skipped": dict(sorted(s.skipped.items())),
            "per_file": s.per_file,
            "groups_of_one": f.groups_of_one,
            "created_unix": None,  # no timestamps: same input and config give the same bytes
        }
        publish(f.staging, f.out)
        out_dir.record(f.out, ["README.md", "manifest.json"])
        write_card(f.out, f.manifest, f.extra_fields)
        write_json(f.out / "manifest.json", f.manifest)
        shutil.rmtree(f.out / ".parts", ignore_errors=True)


def final_steps(config: BuildConfig) -> list[FinalStep]:
    """The finalize stage's steps for ``config``, in order."""
    steps: list[FinalStep] = [DropCrossTaskDuplicates(), AdvantagesAndShards(), MergeQuarantine()]
    if config.stage is not None:
        steps.append(StageFinalize())
    steps.append(PublishWithCard())
    return steps


def run_final_steps(
    f: Finalizing, steps: list[FinalStep], times: StepTimes | None = None
) -> tuple[PipelineStats, StepTimes]:
    """Each step once, in order, timed under its name; their stats and times."""
    times = StepTimes() if times is None else times
    shutil.rmtree(f.staging, ignore_errors=True)
    f.staging.mkdir()
    for step in steps:
        with times.step(step.name):
            step.run(f)
    return PipelineStats({s.name: s.stats for s in steps}), times


def publish(staging: Path, out: Path) -> None:
    """Rename every entry of ``staging`` into ``out`` (recorded as seam's first). If a
    rename fails, the ones done are taken back: a failed build shows no partial set."""
    names = sorted(p.name for p in staging.iterdir())
    out_dir.record(out, names)
    moved: list[str] = []
    try:
        for name in names:
            os.replace(staging / name, out / name)
            moved.append(name)
    except BaseException:
        for name in moved:
            target = out / name
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        raise
    staging.rmdir()
