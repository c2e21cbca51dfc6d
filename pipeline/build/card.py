"""The dataset card (``README.md``) written into every build directory.

Its YAML header tells Hugging Face ``datasets`` where the shards are and what their
features are (``dataset_info.features``, generated from the Arrow schema of
``pipeline/core/shard_schema.py`` plus a stage's extra columns), so ``load_dataset`` on the
directory and the Hub viewer restore the exact types: int8 masks stay int8, not int64.
The body says how the directory was built, what each column means and how to use it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from pipeline.build.stage import stage_of_manifest
from pipeline.build.stats import HEADLINE_COUNTS
from pipeline.common.atomic import write_text
from pipeline.core.shard_schema import SHARD_SCHEMA
from schemas.kinds import SeamKind

SEAM_KIND_MEANINGS: dict[SeamKind, str] = {
    "none": "first segment of a rollout",
    "compaction": "the context was replaced by a summary (budget, model or manual trigger)",
    "edit": "the agent or harness edited the context (deleted or replaced items)",
    "truncation": "old context was cut off",
    "template": "no rewrite, but the chat template re-rendered history differently (e.g. dropped earlier reasoning)",
    "divergence": "no rewrite, but the logged input ids of a call do not extend the segment (a retry, an unannounced context change)",
}

# Arrow primitive types by the dtype name ``datasets`` gives them in YAML.
_DTYPES = {
    pa.string(): "string",
    pa.large_string(): "large_string",
    pa.bool_(): "bool",
    pa.float16(): "float16",
    pa.float32(): "float32",
    pa.float64(): "float64",
    **{
        t: str(t)
        for t in (
            pa.int8(),
            pa.int16(),
            pa.int32(),
            pa.int64(),
            pa.uint8(),
            pa.uint16(),
            pa.uint32(),
            pa.uint64(),
        )
    },
}


def feature_yaml(dtype: pa.DataType) -> dict:
    """One field's type in the ``dataset_info.features`` form ``datasets`` writes:
    ``{dtype: int32}``, ``{list: int32}``, ``{list: [fields]}``, ``{struct: [fields]}``."""
    if pa.types.is_struct(dtype):
        return {"struct": [{"name": f.name, **feature_yaml(f.type)} for f in dtype]}
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        key = "large_list" if pa.types.is_large_list(dtype) else "list"
        inner = feature_yaml(dtype.value_type)
        if list(inner) in (
            ["dtype"],
            ["struct"],
        ):  # datasets' shorthand for a list of one dtype / of structs
            return {key: next(iter(inner.values()))}
        return {key: inner}
    if dtype not in _DTYPES:
        raise ValueError(
            f"no dataset card dtype for Arrow type {dtype}; add it to pipeline/build/card.py"
        )
    return {"dtype": _DTYPES[dtype]}


def _yaml(value, indent: int) -> list[str]:
    """Block YAML for the nested dicts/lists of ``feature_yaml`` (names and dtypes are plain words)."""
    pad = " " * indent
    if isinstance(value, list):
        lines = []
        for item in value:
            item_lines = _yaml(item, indent + 2)
            lines.append(pad + "- " + item_lines[0].lstrip())
            lines += item_lines[1:]
        return lines
    lines = []
    for key, item in value.items():
        if isinstance(item, (dict, list)):
            lines += [f"{pad}{key}:", *_yaml(item, indent + 2)]
        else:
            lines.append(f"{pad}{key}: {item}")
    return lines


# Hub size buckets (``size_categories``), by number of rows.
_SIZES = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")]


def size_category(rows: int) -> str:
    return next(
        (name for limit, name in _SIZES if rows < limit), "1M<n<10M" if rows < 10**7 else "n>10M"
    )


def card_header(
    tags: list[str],
    fields: list[pa.Field],
    rows: int,
    pretty_name: str,
    side_datasets: Iterable[str] = (),
    data_files: str = "train-*.parquet",
) -> list[str]:
    """The YAML front matter (also used by exports): the configs (``default``: the shards;
    one per side dataset of the build's stage, ``BuildStage.side_datasets``, e.g. an SFT
    build's preference pairs, ``load_dataset(DIR, "pairs")``), the default config's exact
    features and split size, and the Hub metadata. The license is ``other``: the rows are
    the input rollouts' text, under whatever terms those have."""
    features = [{"name": f.name, **feature_yaml(f.type)} for f in fields]
    configs = [
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        f'    path: "{data_files}"',
    ]
    for name in side_datasets:
        configs += [
            f"- config_name: {name}",
            "  data_files:",
            "  - split: train",
            f'    path: "{name}/{name}-*.parquet"',
        ]
    return [
        "---",
        f"pretty_name: {pretty_name}",
        "license: other",
        "task_categories:",
        "- reinforcement-learning",
        "- text-generation",
        "size_categories:",
        f"- {size_category(rows)}",
        "configs:",
        *configs,
        "dataset_info:",
        "  features:",
        *_yaml(features, 2),
        "  splits:",
        "  - name: train",
        f"    num_examples: {rows}",
        "tags:",
        *(f"- {tag}" for tag in tags),
        "---",
    ]


def fidelity_lines(counts: dict) -> list[str]:
    """The card's "Context fidelity" section: segments per ``context_fidelity`` value,
    the second witness (when some log reported usage) and what ``--exclude-fidelity``
    left out (docs/data.md, "Context fidelity")."""
    from pipeline.core.fidelity import COUNT_PREFIX
    from pipeline.core.rows import EXCLUDED, EXCLUDED_PREFIX
    from pipeline.core.witness import GAP_REASON, GAP_TOKENS, WITNESSED_CALLS

    lines = [
        "",
        "## Context fidelity",
        "",
        "| context_fidelity | segments |",
        "|---|---|",
        *(
            f"| {key.removeprefix(COUNT_PREFIX)} | {n} |"
            for key, n in sorted(counts.items())
            if key.startswith(COUNT_PREFIX)
        ),
    ]
    if counts.get(WITNESSED_CALLS):
        lines += [
            "",
            f"Second witness: {counts[WITNESSED_CALLS]} of {counts.get('calls', 0)} calls had "
            "the harness's reported input tokens checked against the rebuilt context; "
            f"{counts.get(COUNT_PREFIX + GAP_REASON, 0)} segment(s) depart by more than the "
            f"threshold (`{GAP_REASON}`, {counts.get(GAP_TOKENS, 0)} tokens).",
        ]
    if counts.get(EXCLUDED):
        excluded = ", ".join(
            f"`{key.removeprefix(EXCLUDED_PREFIX)}` {n}"
            for key, n in sorted(counts.items())
            if key.startswith(EXCLUDED_PREFIX)
        )
        lines += [
            "",
            f"Left out by `--exclude-fidelity`: {counts[EXCLUDED]} segment(s) ({excluded}).",
        ]
    return lines


def write_card(out: Path, manifest: dict, extra_fields=()) -> None:
    counts = manifest["counts"]
    fields = [*SHARD_SCHEMA, *extra_fields]
    side = stage_of_manifest(manifest).side_datasets
    build_dir = str(out)
    lines = [
        *card_header(
            ["seam", manifest["kind"]],
            fields,
            counts.get("segments", 0),
            f"seam {manifest['kind'].upper()} segments",
            side_datasets=side,
        ),
        "",
        f"# seam {manifest['kind'].upper()} shards",
        "",
        "One row per segment: a run of policy calls whose context only grew. Built by "
        f"seam {manifest['seam_version']} (shard schema {manifest['shard_schema_version']}).",
        "",
        "## How this was built",
        "",
        "```",
        manifest.get("command") or "(programmatic build)",
        "```",
        "",
        "Configuration:",
        "",
        "```json",
        json.dumps(manifest["config"], indent=2, sort_keys=True),
        "```",
        "",
        f"Tokenizer: `{manifest['tokenizer']['name_or_path']}` (sha256 {manifest['tokenizer']['tokenizer_sha256'][:16]}…, "
        f"chat template sha256 {manifest['tokenizer']['chat_template_sha256'][:16]}…, incremental rendering: "
        f"{manifest['tokenizer']['incremental_rendering']}).",
        "",
        "## Counts",
        "",
        "| what | count |",
        "|---|---|",
    ]
    for key in HEADLINE_COUNTS:
        lines.append(f"| {key} | {counts.get(key, 0)} |")
    lines.append(f"| task groups of one (advantage 0) | {manifest['groups_of_one']} |")
    lines += [
        "",
        "## Seam kinds",
        "",
        "| kind | meaning | segments starting with it |",
        "|---|---|---|",
    ]
    for kind, meaning in SEAM_KIND_MEANINGS.items():
        lines.append(f"| `{kind}` | {meaning} | {manifest['seams'].get(kind, 0)} |")
    lines += fidelity_lines(counts)
    lines += ["", "## Columns", "", "| column | type | meaning |", "|---|---|---|"]
    for f in fields:
        doc = f.metadata[b"doc"].decode().replace("|", "\\|")  # a bare | would split the table cell
        lines.append(f"| `{f.name}` | `{f.type}` | {doc} |")
    lines += [
        "",
        "Rejected records and why: `quarantine.jsonl`. Hashes of inputs and shards: `manifest.json`.",
        "",
        "License: the rows are the text of the input rollouts, under the terms those rollouts "
        "carry (hence `license: other`); seam itself is Apache-2.0.",
        "",
        "## Use it",
        "",
        "```python",
        "from datasets import load_dataset",
        f'segments = load_dataset("{build_dir}", split="train")  # the card: exact types, as above',
        *(
            f'{name} = load_dataset("{build_dir}", "{name}", split="train")  # {what}'
            for name, what in side.items()
        ),
        "```",
        "",
        "```",
        f"seam stats {build_dir}                      # summary and standard tables (DuckDB)",
        f'seam sql {build_dir} "SELECT * FROM rollouts LIMIT 5"   # views: segments, rollouts, calls, quarantine',
        f"seam report {build_dir} --html report.html  # one self-contained HTML file with plots",
        f"seam export {build_dir} --to trl --out export/trl   # or --to verl / --to slime",
        "```",
        "",
    ]
    write_text(out / "README.md", "\n".join(lines))
