"""``seam build-sft``: the build with the SFT stage (``pipeline/sft/stage.py``) plugged in."""

from __future__ import annotations

from pipeline.build.manifest import Manifest
from pipeline.cli.aliases import deprecated_alias
from pipeline.common import options


def run_build_sft(args) -> int:
    from pipeline.cli.build_rl import config_from_args, run_configured_build
    from pipeline.sft.stage import SftStage

    stage = options.config_from_args(SftStage, args)  # its flags: pipeline/sft/config.py
    config = config_from_args(args, "sft")
    config.stage = stage
    status = run_configured_build(config, "seam build-sft", args.verify)
    print_sft_counts(Manifest.read(args.out).counts)
    return status


def print_sft_counts(counts: dict) -> None:
    """What the SFT stage did: corrections attached by type, quarantined, filtered by reason;
    and which rule checks may write corrections, with their measured precision."""
    from rich.console import Console
    from rich.table import Table

    from judge.measured import checks_report
    from judge.rules import ALL_CHECKS, DEFAULT_CHECKS

    console = Console()
    console.print(
        "rule judge corrections are kept only from checks on by default "
        f"({', '.join(DEFAULT_CHECKS) or 'none'}); the others are opt-in, their corrections "
        "quarantined:",
        highlight=False,
    )
    for line in checks_report(ALL_CHECKS):
        console.print(f"  {line}", highlight=False, soft_wrap=True)

    table = Table(title="SFT stage", show_header=True, header_style="bold")
    table.add_column("what")
    table.add_column("count", justify="right")
    for key in sorted(counts):
        if key.startswith(("corrections_", "filtered_", "trimmed_", "synthesized_")) or key == (
            "preference_pairs"
        ):
            table.add_row(key.replace("_", " "), f"{counts[key]:,}")
    console.print(table)


def register_build_sft(sub) -> None:
    from pipeline.cli.build_rl import add_build_arguments
    from pipeline.sft.config import SftOptions

    p = sub.add_parser(
        "build-sft",
        help="Build SFT shards: corrected trajectories, filters, audit columns, preference pairs.",
        description="The RL build's segment rows (input_ids, loss_mask, call_spans, ...) plus the SFT columns "
        "messages, corrections, summary_audit and tools, after attaching judge corrections (embedded in the "
        "rollouts or from --corrections) and filtering; also writes OUT/pairs/ with one preference "
        "pair per correction (prompt, chosen = executed replacement, rejected = original proposal). "
        "Corrections that do not fit their rollout and filtered rollouts go to quarantine.jsonl with "
        "the reason. See docs/sft.md.",
    )
    add_build_arguments(p)
    # --corrections, the filter switches (--max-length among them: the length filter is
    # export's --max-length) and --synthesize-summary-calls.
    options.add_options(p, SftOptions)
    deprecated_alias(p, "--max-tokens", "--max-length", dest="max_length", type=int)
    p.set_defaults(func=run_build_sft)
