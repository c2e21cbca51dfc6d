"""``seam build-sft``: the build with the SFT stage (``pipeline/sft/stage.py``) plugged in."""

from __future__ import annotations

from pathlib import Path

from pipeline.build.manifest import Manifest
from pipeline.cli.aliases import deprecated_alias
from pipeline.common import options
from pipeline.common.errors import UsageError


def run_build_sft(args) -> int:
    from pipeline.build.config import LengthConfig
    from pipeline.cli.build_rl import config_from_args, run_configured_build
    from pipeline.sft.filter_options import FilterOptions
    from pipeline.sft.stage import SftStage

    if args.corrections and not Path(args.corrections).is_file():
        raise UsageError(f"--corrections {args.corrections}: no such file")
    filters = options.config_from_args(
        FilterOptions, args, max_tokens=options.config_from_args(LengthConfig, args).max_length
    )
    prompt = None
    if args.synthesize_summary_calls is not None:
        from pipeline.sft.synthesize import load_prompt

        given = (
            None if args.synthesize_summary_calls == "default" else args.synthesize_summary_calls
        )
        if given is not None and _looks_like_input(given):
            # nargs="?": written before the inputs, the option swallows the first one.
            raise UsageError(
                f"--synthesize-summary-calls {given}: that is a rollout input, not a prompt "
                "file; put the option after the inputs, or write --synthesize-summary-calls=FILE"
            )
        if given is not None and not Path(given).is_file():
            raise UsageError(f"--synthesize-summary-calls {given}: no such file")
        try:
            prompt = load_prompt(given)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    config = config_from_args(args, "sft")
    config.stage = SftStage(
        corrections_file=args.corrections, filters=filters, synthesize_prompt=prompt
    )
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
    from pipeline.build.config import LengthConfig
    from pipeline.cli.build_rl import add_build_arguments
    from pipeline.sft.filter_options import FilterOptions

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
    p.add_argument(
        "--corrections",
        metavar="FILE",
        help="JSONL of correction records (schemas.correction.Correction) to attach, joined by rollout_id "
        "and call_index. Each must equal the executed output at its call; see `seam schema correction`.",
    )
    options.add_options(p, LengthConfig)
    deprecated_alias(p, "--max-tokens", "--max-length", dest="max_length", type=int)
    options.add_options(p, FilterOptions)
    p.add_argument(
        "--synthesize-summary-calls",
        nargs="?",
        const="default",
        metavar="PROMPT_FILE",
        help="For harness logs whose summaries are not calls (Claude Code): add a summary call "
        "before each compaction with complete history — the context at the boundary plus the "
        "summary prompt (pipeline/sft/prompts/summary_call.txt, or PROMPT_FILE; the user's /compact "
        "instructions appended) → the summary without its wrapper. Distillation, not on-policy "
        "data; flagged synthesized_summary_call in context_fidelity and counted in the manifest. "
        "Off by default. See docs/sft.md.",
    )
    p.set_defaults(func=run_build_sft)


INPUT_SUFFIXES = (".jsonl", ".json", ".gz", ".zst", ".parquet", ".pt")


def _looks_like_input(path: str) -> bool:
    """A directory or a file named like a rollout input (the prompt is a text file)."""
    return Path(path).is_dir() or path.lower().endswith(INPUT_SUFFIXES)
