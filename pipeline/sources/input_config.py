"""The input options (issue 24, item 3): which reader reads the inputs, the outcomes joined
to them, the readers' options and the record limits, each field with its flag
(``pipeline/common/options.py``). The builds, ``seam ingest``, ``judge`` and ``audit``
add these flags from here (``add_options``), so each means one thing with one default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.common.options import ALWAYS, WHEN_SET, nested, option
from pipeline.sources.limits import Limits
from pipeline.sources.read_context import ReadContext


def _rewards_sha256(path: str) -> str:
    """The rewards file's content decides the outcomes, not its name."""
    from pipeline.common.hashing import file_sha256

    return file_sha256(Path(path))


@dataclass
class InputConfig:
    format: str = option(
        "auto",
        flag="--format",
        output=ALWAYS,
        help="Input format: auto (detect each file's format from its content; an ambiguous or "
        "unknown file is refused), canonical, or one reader name used for every input (the "
        "list: `seam ingest --help`). Default: {default}.",
    )
    rewards: str | None = option(
        None,
        flag="--rewards",
        metavar="FILE",
        output=WHEN_SET,
        fingerprint_key="rewards_sha256",
        fingerprint_value=_rewards_sha256,
        help="CSV or JSONL joining outcomes to rollouts that do not record them (Claude Code, "
        "Codex, ...): columns rollout_id (or session_id / id), reward, optional task_id and "
        "resolved. See docs/readers.md.",
    )
    group_by: str | None = option(
        None,
        flag="--group-by",
        metavar="FIELD",
        output=WHEN_SET,
        to_field=lambda field: field or None,
        help="chat-completions logs only (refused for other inputs): dotted path of the field "
        "that names the rollout a call belongs to (default: session_id, conversation_id, "
        "rollout_id, ... else the first messages).",
    )
    # Limits decide which records are quarantined; the defaults keep older fingerprints.
    limits: Limits = nested(Limits, output=WHEN_SET, fingerprint_value=Limits.as_dict)

    def read_context(self) -> ReadContext:
        """What the inputs are read under: the limits and ``--group-by``."""
        return ReadContext.of(self.limits, self.group_by)
