"""``seam verify DIR``: the mask audit (``pipeline/inspect/verify.py``), printed and kept in the manifest."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def audit_build(
    out: str | Path,
    mode: str,
    tokenizer: str | None = None,
    per_rollout: bool = False,
    progress: bool = False,
    workers: int | None = None,
    inputs_checked: bool = False,
) -> int:
    """Run the audit, print its counts, record them in ``manifest.json`` (key ``verify``);
    exit code 1 on any mismatch, each mismatch printed with its shard, row and rollout.
    ``workers``: the processes that check the rollouts (default: every core);
    ``inputs_checked``: ``verify_build``'s (the build that just made ``out``)."""
    from rich.table import Table

    from pipeline.common.atomic import write_json
    from pipeline.inspect.verify import verify_build

    result = verify_build(out, mode, tokenizer, progress, workers, inputs_checked)
    if mode == "none":
        return 0
    manifest_path = Path(out) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["verify"] = result.as_manifest()
    write_json(manifest_path, manifest)
    from pipeline.build.summary_table import table_console

    console = table_console()
    table = Table(title=f"seam verify ({mode}) {out}", header_style="bold")
    for name in ("source", "rollouts", "rows", "call spans", "trained tokens", "mismatches"):
        table.add_column(name, justify="left" if name == "source" else "right")
    for source, c in sorted(result.by_source.items()):
        table.add_row(
            source,
            *(f"{c[k]:,}" for k in ("rollouts", "rows", "spans", "trained_tokens", "mismatches")),
        )
    console.print(table)
    if per_rollout or any(c["mismatches"] for c in result.by_rollout.values()):
        console.print(_rollout_table(result, per_rollout))
    else:
        console.print(
            f"per-rollout counts: {manifest_path} (verify.by_rollout), or seam verify --per-rollout"
        )
    for mismatch in result.mismatches:
        console.print(f"[red]MISMATCH[/] {mismatch.line()}", highlight=False, soft_wrap=True)
    total = result.totals()
    if not result.ok:
        console.print(
            f"[red]{len(result.mismatches)} mismatch(es)[/]: the build does not train what the policy generated"
        )
        return 1
    console.print(
        f"verified {total['rollouts']:,} rollout(s), {total['rows']:,} row(s): every trained span is "
        "the call's output, nothing else is trained, every context is the rollout's"
    )
    return 0


def _rollout_table(result, every: bool):
    """Counts per rollout: all of them (``--per-rollout``), else those with mismatches."""
    from rich.table import Table

    table = Table(title="per rollout", header_style="bold")
    for name in ("rollout", "rows", "call spans", "trained tokens", "mismatches"):
        table.add_column(name, justify="left" if name == "rollout" else "right")
    for rollout_id, c in sorted(result.by_rollout.items()):
        if every or c["mismatches"]:
            table.add_row(
                rollout_id,
                *(f"{c[k]:,}" for k in ("rows", "spans", "trained_tokens", "mismatches")),
            )
    return table


def run(args) -> int:
    progress = not args.no_progress and sys.stderr.isatty()
    return audit_build(args.dir, args.verify, args.tokenizer, args.per_rollout, progress)


def add_verify_argument(p, default: str) -> None:
    p.add_argument(
        "--verify",
        choices=["all", "sample", "none"],
        default=default,
        help="Mask audit after writing (as `seam verify`): every rollout, a deterministic sample "
        f"(at least 16 rollouts, 2%% of a larger build) or none. Default: {default}.",
    )


def register(sub) -> None:
    from pipeline.build.config import OutputConfig, TokenizerConfig
    from pipeline.common.options import add_options

    p = sub.add_parser(
        "verify",
        help="Prove that every row trains exactly what its calls generated (re-reads the inputs).",
        description="Re-read the build's inputs (hashes must match the manifest) and check every "
        "row: each trained span is exactly its call's output (logged ids as ids, rendered "
        "outputs as text), nothing else is trained, every call's context is the full rendering "
        "of the rollout's context (or its logged prompt ids), and context_fidelity is what the "
        "rollout says. Prints counts per source, writes them into manifest.json (key verify) "
        "and exits 1 naming the shard, row and rollout of every mismatch.",
    )
    p.add_argument("dir", help="A build directory (with manifest.json).")
    add_verify_argument(p, "all")
    p.add_argument(
        "--per-rollout", action="store_true", help="Print the counts of every rollout, too."
    )
    add_options(p, TokenizerConfig, only=("tokenizer",))  # the build's, if it moved
    add_options(p, OutputConfig, only=("progress",))
    p.set_defaults(func=run)
