"""The SFT filters' switches (``pipeline/sft/filters.py``), each field with its
``build-sft`` flag (``pipeline/common/options.py``). A module of its own, importing no
judge code, so the command line adds the flags without loading the filters. The whole
set is in the SFT stage's fingerprint (``SftStage.fingerprint``), every field always."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.build.config import LengthConfig
from pipeline.common.options import ALWAYS, flag_of, option


def _turned_off(flag: str, what: str) -> dict:
    """A filter that is on unless ``--keep-...`` turns it off."""
    return {
        "flag": flag,
        "switch": True,
        "to_field": lambda keep: not keep,
        "output": ALWAYS,
        "help": f"Turn off the {what}",
    }


@dataclass(frozen=True)
class FilterOptions:
    malformed: bool = option(
        True,
        **_turned_off(
            "--keep-malformed",
            "malformed-request filter (unparsable tool arguments, unknown tools). A last call "
            "left without its tool result is trimmed, not filtered (trimmed_dangling_calls).",
        ),
    )
    summary_loops: bool = option(
        True,
        **_turned_off(
            "--keep-summary-loops",
            "summary-loop filter (compaction right after compaction, near-identical summaries).",
        ),
    )
    off_task: bool = option(
        True,
        **_turned_off(
            "--keep-off-task",
            "off-task filter (first calls after compaction only touch files never seen before).",
        ),
    )
    resolved_only: bool = option(
        False,
        flag="--resolved-only",
        switch=True,
        output=ALWAYS,
        help="Keep only rollouts with resolved=true (filtered: unresolved, outcome_unknown).",
    )
    # Segments longer than this many tokens are left out: --max-length, the definition
    # build-sft shares with export (pipeline/build/config.py LengthConfig), under the
    # name the stage's fingerprint has always recorded.
    max_tokens: int | None = option(None, output=ALWAYS, **flag_of(LengthConfig, "max_length"))
