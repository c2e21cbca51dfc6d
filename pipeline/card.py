"""The dataset card (``README.md``) written into every build directory.

Its YAML header tells Hugging Face ``datasets`` where the shards are and what their
features are, so ``load_dataset("parquet", data_dir=...)`` and the Hub viewer restore
the exact schema; the body says how the directory was built and what each column means.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.shard_schema import COLUMNS

SEAM_KINDS = {
    "none": "first segment of a rollout",
    "compaction": "the context was replaced by a summary (budget, model or manual trigger)",
    "edit": "the agent or harness edited the context (deleted or replaced items)",
    "truncation": "old context was cut off",
    "template": "no rewrite, but the chat template re-rendered history differently (e.g. dropped earlier reasoning)",
}


def write_card(out: Path, manifest: dict) -> None:
    counts = manifest["counts"]
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        '    path: "train-*.parquet"',
        "tags:",
        "- seam",
        f"- {manifest['kind']}",
        "---",
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
    for key in ("read", "accepted", "quarantined", "segments", "calls", "tokens", "trainable_tokens", "drift_realigned"):
        lines.append(f"| {key} | {counts.get(key, 0)} |")
    lines.append(f"| task groups of one (advantage 0) | {manifest['groups_of_one']} |")
    lines += ["", "## Seam kinds", "", "| kind | meaning | segments starting with it |", "|---|---|---|"]
    for kind, meaning in SEAM_KINDS.items():
        lines.append(f"| `{kind}` | {meaning} | {manifest['seams'].get(kind, 0)} |")
    lines += ["", "## Columns", "", "| column | type | meaning |", "|---|---|---|"]
    for name, dtype, _, doc in COLUMNS:
        lines.append(f"| `{name}` | `{dtype}` | {doc} |")
    lines += ["", "Rejected records and why: `quarantine.jsonl`. Hashes of inputs and shards: `manifest.json`.", ""]
    path = out / "README.md"
    tmp = path.with_name(".README.md.tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)
