"""``build-sft``'s own options: the SFT stage's configuration, each field with its flag
(``pipeline/common/options.py``). ``SftStage`` (``pipeline/sft/stage.py``) is this config
plus the stage's work, so the flags, the stage a command line gives
(``config_from_args(SftStage, args)``) and the stage's fingerprint come from these fields.
A module of its own, importing no judge code, so the command line adds the flags without
loading the stage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.common.errors import UsageError
from pipeline.common.options import ALWAYS, BY_CONTENT, WHEN_SET, fingerprint_of, nested, option
from pipeline.sft.filter_options import FilterOptions

# What a rollout input is named like (the summary prompt is a text file).
INPUT_SUFFIXES = (".jsonl", ".json", ".gz", ".zst", ".parquet", ".pt")


def _looks_like_input(path: str) -> bool:
    """A directory or a file named like a rollout input."""
    return Path(path).is_dir() or path.lower().endswith(INPUT_SUFFIXES)


def prompt_text(given: str | None) -> str | None:
    """``--synthesize-summary-calls [PROMPT_FILE]`` → the summary prompt's text: None when
    the flag is not given, the packaged prompt for the flag alone ("default")."""
    if given is None:
        return None
    from pipeline.sft.synthesize import load_prompt

    path = None if given == "default" else given
    if path is not None and _looks_like_input(path):
        # nargs="?": written before the inputs, the option swallows the first one.
        raise UsageError(
            f"--synthesize-summary-calls {path}: that is a rollout input, not a prompt "
            "file; put the option after the inputs, or write --synthesize-summary-calls=FILE"
        )
    if path is not None and not Path(path).is_file():
        raise UsageError(f"--synthesize-summary-calls {path}: no such file")
    try:
        return load_prompt(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True)
class SftOptions:
    """The SFT stage's options, in the order of its fingerprint (``SftStage.fingerprint``:
    the filters, the corrections file's SHA-256, the synthesis prompt when one is used)."""

    # Fingerprinted by its content (the stage records ``corrections_sha256``), not its path.
    corrections_file: str | None = option(
        None,
        flag="--corrections",
        metavar="FILE",
        output=BY_CONTENT,
        check=lambda path: Path(path).is_file(),
        error="--corrections {value}: no such file",
        help="JSONL of correction records (schemas.correction.Correction) to attach, joined by "
        "rollout_id and call_index. Each must equal the executed output at its call; see `seam "
        "schema correction`.",
    )
    filters: FilterOptions = nested(FilterOptions, output=ALWAYS, fingerprint_value=fingerprint_of)
    # The prompt's text (not its path): what verify re-applies to replay the build.
    synthesize_prompt: str | None = option(
        None,
        flag="--synthesize-summary-calls",
        nargs="?",
        const="default",
        metavar="PROMPT_FILE",
        to_field=prompt_text,
        output=WHEN_SET,
        fingerprint_key="synthesize_summary_calls",
        fingerprint_value=lambda prompt: {"prompt": prompt},
        help="For harness logs whose summaries are not calls (Claude Code): add a summary call "
        "before each compaction with complete history — the context at the boundary plus the "
        "summary prompt (pipeline/sft/prompts/summary_call.txt, or PROMPT_FILE; the user's "
        "/compact instructions appended) → the summary without its wrapper. Distillation, not "
        "on-policy data; flagged synthesized_summary_call in context_fidelity and counted in "
        "the manifest. Off by default. See docs/sft.md.",
    )
