"""``seam export``: a build directory in the layout another trainer loads.

Targets (one module each): ``trl`` (SFT or GRPO columns, Parquet), ``verl`` (RL dataset
Parquet with agent-loop token fields), ``slime`` (``Sample`` dicts, JSON lines). Shards
are converted one at a time (memory: one shard), in build order, and written under a
temporary name, then renamed. ``export.json`` (written last) names the source build and
the files, so a rerun with ``overwrite`` removes exactly what an earlier export wrote.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.card import card_header
from pipeline.export import slime, trl, verl

TARGETS = ("trl", "verl", "slime")
MARKER = "export.json"


class ExportError(ValueError):
    """A problem found before writing anything; one actionable line."""


@dataclass
class ExportResult:
    out: Path
    target: str
    mode: str | None
    rows: int
    files: list[str]


def export_build(
    build_dir: str | Path,
    target: str,
    out: str | Path,
    mode: str | None = None,
    tokenizer: str | None = None,
    overwrite: bool = False,
) -> ExportResult:
    build, out = Path(build_dir), Path(out)
    manifest_path = build / "manifest.json"
    if not manifest_path.exists():
        raise ExportError(f"{build} has no manifest.json: not a seam build directory")
    manifest = json.loads(manifest_path.read_text())
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    if mode is not None and target != "trl":
        raise ExportError("--mode only applies to --to trl")
    if tokenizer is not None and target != "verl":
        raise ExportError("--tokenizer only applies to --to verl")
    if target == "trl":
        mode = mode or ("sft" if manifest["kind"] == "sft" else "grpo")
        if mode not in trl.MODES:
            raise ExportError(f"unknown TRL mode {mode!r}; choose one of {', '.join(trl.MODES)}")
    shards = [build / name for name in manifest["shards"]]
    missing = [s.name for s in shards if not s.exists()]
    if missing:
        raise ExportError(
            f"{build}: shard(s) listed in manifest.json are missing: {', '.join(missing[:3])}; rebuild it"
        )
    decoder = _decoder(manifest, tokenizer) if target == "verl" else None
    _prepare(out, overwrite)
    rows = sum(pq.read_metadata(s).num_rows for s in shards)
    if target == "slime":
        files = [_write_slime(shards, out)]
        schema = None
    else:
        files, schema = _write_parquet(shards, out, target, mode, decoder)
    _write_text(out / "README.md", _readme(build, target, mode, rows, schema))
    _write_text(
        out / MARKER,
        json.dumps(
            {
                "source": str(build),
                "target": target,
                "mode": mode,
                "rows": rows,
                "files": files,
                "source_shard_sha256": manifest["shard_sha256"],
            },
            indent=2,
            sort_keys=True,
        )
        + "\n",
    )
    return ExportResult(out, target, mode, rows, files)


def _decoder(manifest: dict, spec: str | None):
    """The build's vocabulary as a ``tokenizers.Tokenizer`` (verl's prompt text), checked
    against the hash in the manifest so text is never decoded with the wrong vocabulary."""
    from tokenizers import Tokenizer

    from pipeline.tokenizer import DEFAULT_TOKENIZER, default_tokenizer_dir, tokenizer_file_sha256

    directory = (
        default_tokenizer_dir()
        if spec == DEFAULT_TOKENIZER
        else Path(spec or manifest["tokenizer"]["name_or_path"])
    )
    if not (directory / "tokenizer.json").is_file():
        raise ExportError(
            f"the build's tokenizer {directory} is gone; pass --tokenizer DIR (or --tokenizer "
            f"{DEFAULT_TOKENIZER} for the built-in one)"
        )
    if tokenizer_file_sha256(directory) != manifest["tokenizer"]["tokenizer_sha256"]:
        raise ExportError(
            f"tokenizer {directory} is not the one the build used (tokenizer_sha256 in manifest.json differs)"
        )
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


def _prepare(out: Path, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()):
        marker = out / MARKER
        if not marker.exists():
            raise ExportError(f"{out} is not empty and holds no seam export; choose an empty --out")
        if not overwrite:
            raise ExportError(f"{out} already holds an export; pass --overwrite to replace it")
        for name in [*json.loads(marker.read_text())["files"], "README.md", MARKER]:
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def _write_parquet(shards: list[Path], out: Path, target: str, mode: str | None, decoder):
    files, schema, index = [], None, 0
    for shard_path in shards:
        shard = pq.read_table(shard_path)
        if target == "trl":
            table = trl.sft_table(shard) if mode == "sft" else trl.grpo_table(shard)
        else:
            table = verl.verl_table(shard, decoder, index)
        index += shard.num_rows
        schema = table.schema
        tmp = out / f".{shard_path.name}.tmp{os.getpid()}"
        pq.write_table(table, tmp, compression="zstd", row_group_size=256)
        os.replace(tmp, out / shard_path.name)
        files.append(shard_path.name)
    return files, schema


def _write_slime(shards: list[Path], out: Path) -> str:
    name = "samples.jsonl"
    tmp = out / f".{name}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        writer = slime.SampleWriter(fh)
        for shard_path in shards:
            writer.write(pq.read_table(shard_path))
    os.replace(tmp, out / name)
    return name


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


LOADING = {
    (
        "trl",
        "sft",
    ): '`SFTTrainer(model, train_dataset=load_dataset("parquet", data_dir=OUT, split="train"))`: '
    "the dataset has `input_ids`, so TRL uses it as tokenized; its collator sets labels to -100 where "
    "`assistant_masks` (and, with completion_only_loss, `completion_mask`) is 0.",
    (
        "trl",
        "grpo",
    ): "Rows of the batch `GRPOTrainer` feeds its loss: pad `prompt_ids` on the left and "
    "`completion_ids`, `completion_mask`, `old_per_token_logps` on the right; `advantages` is one "
    "float per row, the rollout's shared GRPO advantage (already normalized over its task's rollouts).",
    (
        "verl",
        None,
    ): "`data.train_files` = these Parquet files (RLHFDataset columns `data_source`, `prompt`, `ability`, "
    "`reward_model`, `extra_info`); an agent loop that replays recorded segments returns "
    "`AgentLoopOutput(prompt_ids=..., response_ids=..., response_mask=..., response_logprobs=..., "
    "reward_score=..., num_turns=...)` from the row's columns.",
    (
        "slime",
        None,
    ): "`samples.jsonl`: one `Sample.to_dict()` per line. For `--load-debug-rollout-data`: "
    '`torch.save({"rollout_id": 0, "samples": [json.loads(l) for l in open("samples.jsonl")]}, '
    '"rollout_0.pt")`.',
}


def _readme(build: Path, target: str, mode: str | None, rows: int, schema) -> str:
    header = card_header(["seam", "export", target], list(schema)) if schema is not None else []
    title = f"# seam export for {target}" + (f" ({mode})" if mode else "")
    body = [
        title,
        "",
        f"{rows:,} segments of the seam build `{build}` (its README.md documents them).",
        "",
        LOADING[(target, mode)],
        "",
        'Details: docs/data.md, "Exports".',
        "",
    ]
    return "\n".join([*header, "", *body]) if header else "\n".join(body)
