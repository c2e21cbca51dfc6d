"""``seam export``: a build directory in the layout another trainer loads.

Targets (one module each, registered in ``EXPORTS`` by ``register_export`` as the readers
are in theirs): ``trl`` (SFT or GRPO columns, Parquet), ``verl`` (RL dataset Parquet with
agent-loop token fields), ``slime`` (``Sample`` dicts, JSON lines, and the
``rollout_0.pt`` that slime's ``--load-debug-rollout-data`` loads). What a target takes
(``--mode``, ``--tokenizer``, an extra) is said by its ``ExportTarget``, so the checks and
``seam export``'s choices follow the registry instead of naming targets. ``max_length`` leaves
out rows longer than it, counted (rows, trainable tokens) in ``export.json``, the README
and the command's output, next to what each common cutoff would keep
(``lengths.py``). Shards are converted one at a time (memory: one shard), in build order,
and written atomically (``pipeline.common.atomic``: a temporary name, then renamed).
``export.json`` (written last) names the source build and the files, so a rerun with
``overwrite`` removes exactly what an earlier export wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.build.card import card_header
from pipeline.build.manifest import Manifest, build_tokenizer
from pipeline.common import atomic
from pipeline.common.errors import SeamError
from pipeline.export import lengths, slime, trl, verl
from pipeline.export_targets import EXPORTS, ExportTarget, takers

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
    spec = EXPORTS.get(target)
    if spec is None:
        raise ExportError(f"unknown target {target!r}; choose one of {', '.join(EXPORTS)}")
    if mode is not None and not spec.modes:
        raise ExportError(f"--mode only applies to {takers(lambda s: s.modes)}")
    if max_length is not None and max_length < 1:
        raise ExportError("--max-length must be a positive number of tokens")
    if tokenizer is not None and not spec.uses_tokenizer:
        raise ExportError(f"--tokenizer only applies to {takers(lambda s: s.uses_tokenizer)}")
    if spec.modes:
        mode = mode or manifest.stage().trl_mode
        if mode not in spec.modes:
            raise ExportError(
                f"unknown {spec.name.upper()} mode {mode!r}; choose one of {', '.join(spec.modes)}"
            )
    shards = [build / name for name in manifest.shards]
    missing = [s.name for s in shards if not s.exists()]
    if missing:
        raise ExportError(
            f"{build}: shard(s) listed in manifest.json are missing: {', '.join(missing[:3])}; rebuild it"
        )
    # verl's prompt text: decoded with the build's own vocabulary (``build_tokenizer``:
    # the recorded one, else --tokenizer DIR; hashes checked)
    decoder = build_tokenizer(manifest, tokenizer).backend if spec.uses_tokenizer else None
    if spec.extra is not None:
        from pipeline.common import extras

        extras.require(spec.extra, f"export --to {spec.name}")
    _prepare(out, overwrite)
    tokens, trainable = lengths.row_lengths(shards)
    table = lengths.length_table(tokens, trainable, extra=max_length)
    over = tokens > max_length if max_length else np.zeros(len(tokens), bool)
    dropped, dropped_trainable = int(over.sum()), int(trainable[over].sum())
    rows = len(tokens) - dropped
    files, schema, longest = spec.writer()(shards, out, mode, decoder, max_length)
    lines = lengths.markdown(table, len(tokens), int(trainable.sum()))
    if spec.lengths_line is not None:
        lines += ["", spec.lengths_line_of(longest)]
    kept = (
        f"--max-length {max_length}: left out {dropped:,} row(s) longer than that, "
        f"{dropped_trainable:,} of {int(trainable.sum()):,} trainable tokens."
        if max_length
        else "No --max-length: every row is here; set your trainer's maximum length from the "
        "table below (rows longer than it are cut or dropped by the trainer)."
    )
    readme = _readme(build, spec, mode, rows, schema, [kept, "", *lines])
    _write_text(out / "README.md", readme)
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
                **({spec.lengths_key: longest} if spec.lengths_key else {}),
                "source_shard_sha256": manifest.shard_sha256,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n",
    )
    verl_lengths = longest if spec.lengths_key == "verl_lengths" else None
    return ExportResult(
        out, target, mode, rows, files, dropped, dropped_trainable, table, verl_lengths
    )


def _within(shard: pa.Table, max_length: int | None) -> pa.Table:
    if max_length is None:
        return shard
    return shard.filter(pc.less_equal(shard["num_tokens"], max_length))


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
    convert: Callable[[pa.Table, str | None, Any, int], pa.Table],
    longest_of: Callable[[pa.Table], dict[str, int]] | None,
    shards: list[Path],
    out: Path,
    mode: str | None,
    decoder,
    max_length,
):
    """Writes each shard converted by ``convert(shard, mode, decoder, first row index)``;
    returns their names, the schema and (``longest_of``: verl) the longest prompt and
    response (``max_prompt_length``, ``max_response_length``)."""
    files, schema, index = [], None, 0
    longest: dict[str, int] = {}
    for shard_path in shards:
        shard = _within(pq.read_table(shard_path), max_length)
        table = convert(shard, mode, decoder, index)
        for key, most in (longest_of(table) if longest_of else {}).items():
            longest[key] = max(longest.get(key, 0), most)
        index += shard.num_rows
        schema = table.schema
        write = partial(pq.write_table, table, compression="zstd", row_group_size=256)
        atomic.atomic_write(out / shard_path.name, write)
        files.append(shard_path.name)
    return files, schema, longest


def write_slime(shards: list[Path], out: Path, mode, decoder, max_length) -> tuple:
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
    return [name, pt], None, {}


def _write_text(path: Path, text: str) -> None:
    atomic.write_text(path, text)


def _readme(
    build: Path, spec: ExportTarget, mode: str | None, rows: int, schema, length_lines
) -> str:
    target = spec.name
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
        spec.loading[mode],
        "",
        "## Lengths",
        "",
        *length_lines,
        "",
        'Details: docs/data.md, "Exports".',
        "",
    ]
    return "\n".join([*header, "", *body]) if header else "\n".join(body)


def write_trl(shards: list[Path], out: Path, mode: str | None, decoder, max_length) -> tuple:
    """``--to trl``: SFT or GRPO columns (``trl.py``)."""

    def convert(shard, mode, _decoder, _index):
        return trl.sft_table(shard) if mode == "sft" else trl.grpo_table(shard)

    return _write_parquet(convert, None, shards, out, mode, decoder, max_length)


def write_verl(shards: list[Path], out: Path, mode: str | None, decoder, max_length) -> tuple:
    """``--to verl``: RLHFDataset Parquet with the agent-loop token fields (``verl.py``)."""

    def convert(shard, _mode, decoder, index):
        return verl.verl_table(shard, decoder, index)

    return _write_parquet(convert, verl.longest, shards, out, mode, decoder, max_length)
