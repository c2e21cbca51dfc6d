"""``seam export``: a build directory in the layout another trainer loads.

Targets (one module each): ``trl`` (SFT or GRPO columns, Parquet), ``verl`` (RL dataset
Parquet with agent-loop token fields), ``slime`` (``Sample`` dicts, JSON lines, and the
``rollout_0.pt`` that slime's ``--load-debug-rollout-data`` loads). ``max_length`` leaves
out rows longer than it, counted (rows, trainable tokens) in ``export.json``, the README
and the command's output, next to what each common cutoff would keep
(``lengths.py``). Shards are converted one at a time (memory: one shard), in build order,
and written atomically (``pipeline.common.atomic``: a temporary name, then renamed).
``export.json`` (written last) names the source build and the files, so a rerun with
``overwrite`` removes exactly what an earlier export wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.build.card import card_header
from pipeline.build.manifest import Manifest, build_tokenizer
from pipeline.common import atomic
from pipeline.common.errors import SeamError
from pipeline.export import lengths, slime, trl, verl

TARGETS = ("trl", "verl", "slime")
MARKER = "export.json"


class ExportError(SeamError, ValueError):
    """A problem found before writing anything; one actionable line."""


@dataclass
class ExportResult:
    out: Path
    target: str
    mode: str | None
    rows: int
    files: list[str]
    dropped_rows: int = 0
    dropped_trainable_tokens: int = 0
    lengths: list | None = None
    verl_lengths: dict | None = None  # verl: the longest prompt and response


def export_build(
    build_dir: str | Path,
    target: str,
    out: str | Path,
    mode: str | None = None,
    tokenizer: str | None = None,
    overwrite: bool = False,
    max_length: int | None = None,
) -> ExportResult:
    build, out = Path(build_dir), Path(out)
    manifest = Manifest.read(build)
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    if mode is not None and target != "trl":
        raise ExportError("--mode only applies to --to trl")
    if max_length is not None and max_length < 1:
        raise ExportError("--max-length must be a positive number of tokens")
    if tokenizer is not None and target != "verl":
        raise ExportError("--tokenizer only applies to --to verl")
    if target == "trl":
        mode = mode or manifest.stage().trl_mode
        if mode not in trl.MODES:
            raise ExportError(f"unknown TRL mode {mode!r}; choose one of {', '.join(trl.MODES)}")
    shards = [build / name for name in manifest.shards]
    missing = [s.name for s in shards if not s.exists()]
    if missing:
        raise ExportError(
            f"{build}: shard(s) listed in manifest.json are missing: {', '.join(missing[:3])}; rebuild it"
        )
    # verl's prompt text: decoded with the build's own vocabulary (``build_tokenizer``:
    # the recorded one, else --tokenizer DIR; hashes checked)
    decoder = build_tokenizer(manifest, tokenizer).backend if target == "verl" else None
    if target == "slime":
        _slime_torch()
    _prepare(out, overwrite)
    tokens, trainable = lengths.row_lengths(shards)
    table = lengths.length_table(tokens, trainable, extra=max_length)
    over = tokens > max_length if max_length else np.zeros(len(tokens), bool)
    dropped, dropped_trainable = int(over.sum()), int(trainable[over].sum())
    rows = len(tokens) - dropped
    longest: dict[str, int] = {}
    if target == "slime":
        files = _write_slime(shards, out, max_length)
        schema = None
    else:
        files, schema, longest = _write_parquet(shards, out, target, mode, decoder, max_length)
    lines = lengths.markdown(table, len(tokens), int(trainable.sum()))
    if target == "verl":
        lines += ["", verl.lengths_line(longest)]
    kept = (
        f"--max-length {max_length}: left out {dropped:,} row(s) longer than that, "
        f"{dropped_trainable:,} of {int(trainable.sum()):,} trainable tokens."
        if max_length
        else "No --max-length: every row is here; set your trainer's maximum length from the "
        "table below (rows longer than it are cut or dropped by the trainer)."
    )
    _write_text(out / "README.md", _readme(build, target, mode, rows, schema, [kept, "", *lines]))
    _write_text(
        out / MARKER,
        json.dumps(
            {
                "source": str(build),
                "target": target,
                "mode": mode,
                "rows": rows,
                "files": files,
                "max_length": max_length,
                "dropped_over_max_length": {"rows": dropped, "trainable_tokens": dropped_trainable},
                "lengths": table,
                **({"verl_lengths": longest} if target == "verl" else {}),
                "source_shard_sha256": manifest.shard_sha256,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n",
    )
    verl_lengths = longest if target == "verl" else None
    return ExportResult(
        out, target, mode, rows, files, dropped, dropped_trainable, table, verl_lengths
    )


def _within(shard: pa.Table, max_length: int | None) -> pa.Table:
    if max_length is None:
        return shard
    return shard.filter(pc.less_equal(shard["num_tokens"], max_length))


def _slime_torch():
    """``--to slime`` writes rollout_0.pt with torch.save (slime's
    --load-debug-rollout-data reads it with torch.load): torch comes with the train extra."""
    from pipeline.common import extras

    extras.require("train", "export --to slime")


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


def _write_parquet(
    shards: list[Path], out: Path, target: str, mode: str | None, decoder, max_length
):
    """Writes the shards; returns their names, the schema and, for verl, the longest
    prompt and response (``max_prompt_length``, ``max_response_length``)."""
    files, schema, index = [], None, 0
    longest: dict[str, int] = {}
    for shard_path in shards:
        shard = _within(pq.read_table(shard_path), max_length)
        if target == "trl":
            table = trl.sft_table(shard) if mode == "sft" else trl.grpo_table(shard)
        else:
            table = verl.verl_table(shard, decoder, index)
            for key, most in verl.longest(table).items():
                longest[key] = max(longest.get(key, 0), most)
        index += shard.num_rows
        schema = table.schema
        write = partial(pq.write_table, table, compression="zstd", row_group_size=256)
        atomic.atomic_write(out / shard_path.name, write)
        files.append(shard_path.name)
    return files, schema, longest


def _write_slime(shards: list[Path], out: Path, max_length) -> list[str]:
    """``samples.jsonl`` and ``rollout_0.pt``: ``{"rollout_id": 0, "samples": [...]}``,
    what slime's ``--load-debug-rollout-data DIR/rollout_{rollout_id}.pt`` loads with
    ``torch.load(path.format(rollout_id=0), weights_only=False)["samples"]``."""
    import torch

    name, pt = "samples.jsonl", "rollout_0.pt"
    samples: list[dict] = []

    def write_samples(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            writer = slime.SampleWriter(fh)
            for shard_path in shards:
                writer.write(_within(pq.read_table(shard_path), max_length))
        samples.extend(json.loads(line) for line in Path(tmp).read_text("utf-8").splitlines())
        # rollout_0.pt is published before samples.jsonl, so neither appears without the other's data
        atomic.atomic_write(
            out / pt, lambda tmp_pt: torch.save({"rollout_id": 0, "samples": samples}, tmp_pt)
        )

    atomic.atomic_write(out / name, write_samples)
    return [name, pt]


def _write_text(path: Path, text: str) -> None:
    atomic.write_text(path, text)


LOADING = {
    (
        "trl",
        "sft",
    ): '`SFTTrainer(model, train_dataset=load_dataset("parquet", data_dir=OUT, split="train"))`: '
    "the dataset has `input_ids`, so TRL uses it as tokenized; its collator sets labels to -100 where "
    "`assistant_masks` (and, with completion_only_loss, `completion_mask`) is 0. The chat template "
    "is already applied (the tool list included), so no `tools` column is needed; to let TRL template "
    "itself, use the SFT build's `messages` and `tools` columns (docs/sft.md).",
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
    "`reward_model`, `extra_info`); `agent_loop_output` holds verl's `AgentLoopOutput` fields "
    "(`prompt_ids`, `response_ids`, `response_mask`, `response_logprobs`, `reward_score`, "
    "`num_turns`), which the `seam_replay` agent loop (pipeline/export/verl_replay.py) returns "
    "as recorded; docs/training.md has the `main_ppo` recipe. `prompt` is decoded from the "
    "rendered prompt tokens: its system turn already holds the tool list as the template wrote it.",
    (
        "slime",
        None,
    ): "`samples.jsonl`: one `Sample.to_dict()` per line; `rollout_0.pt`: the same samples as "
    '`{"rollout_id": 0, "samples": [...]}`, what slime loads with '
    "`--load-debug-rollout-data OUT/rollout_{rollout_id}.pt` (one rollout step; segments of a "
    "rollout share `rollout_id`).",
}


def _readme(build: Path, target: str, mode: str | None, rows: int, schema, length_lines) -> str:
    header = (
        card_header(
            ["seam", "export", target],
            list(schema),
            rows,
            f"seam export for {target}" + (f" ({mode})" if mode else ""),
            data_files="train-*.parquet",
        )
        if schema is not None
        else []
    )
    title = f"# seam export for {target}" + (f" ({mode})" if mode else "")
    body = [
        title,
        "",
        f"{rows:,} segments of the seam build `{build}` (its README.md documents them).",
        "",
        LOADING[(target, mode)],
        "",
        "## Lengths",
        "",
        *length_lines,
        "",
        'Details: docs/data.md, "Exports".',
        "",
    ]
    return "\n".join([*header, "", *body]) if header else "\n".join(body)
