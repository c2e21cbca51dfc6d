"""``--rewards FILE``: outcomes for formats that do not record them (Claude Code, Codex,
Gemini CLI, ...), joined to rollouts by id.

The file is CSV (with a header) or JSONL (or a JSON list of objects). Each row names a
rollout by ``rollout_id``, ``session_id`` or ``id`` and gives ``reward`` (a number) and
optionally ``task_id`` (the GRPO group key) and ``resolved`` (true/false). A rollout
matches a row by its ``rollout_id`` first, then by ``meta.session_id`` (so a Claude
Code sub-agent rollout gets its session's outcome), then by ``parent_rollout_id`` (any
sub-agent gets its parent's outcome). A row value replaces the value the
reader found. A malformed file fails before any work, naming the line; so do two rows
for one id with different outcomes (naming both lines). Identical repeats are allowed.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.common.errors import SeamError
from pipeline.sources.canonical_io import open_text_stream
from schemas.rollout import Rollout

ID_FIELDS = ("rollout_id", "session_id", "id")
TRUE, FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


class RewardsError(SeamError, ValueError):
    """A rewards file that cannot be used: one actionable line."""


@dataclass(frozen=True)
class Outcome:
    reward: float | None
    task_id: str | None
    resolved: bool | None


def load_rewards(path: Path) -> dict[str, Outcome]:
    try:
        with open_text_stream(path) as fh:
            text = fh.read().decode("utf-8")
    except OSError as exc:
        raise RewardsError(f"rewards file {path}: {exc}") from None
    rows: list[tuple[int, Any]]
    if path.name.endswith((".csv", ".csv.gz", ".csv.zst")):
        rows = [(i + 2, row) for i, row in enumerate(csv.DictReader(text.splitlines()))]
    elif text.lstrip().startswith("["):
        rows = [(i + 1, row) for i, row in enumerate(json.loads(text))]
    else:
        rows = []
        for i, json_line in enumerate(text.splitlines(), start=1):
            if json_line.strip():
                try:
                    rows.append((i, json.loads(json_line)))
                except json.JSONDecodeError as exc:
                    raise RewardsError(f"rewards file {path}:{i}: invalid JSON: {exc}") from None
    table: dict[str, Outcome] = {}
    first_line: dict[str, int] = {}
    for line, row in rows:
        if not isinstance(row, dict):
            raise RewardsError(
                f"rewards file {path}:{line}: expected an object with an id and a reward"
            )
        key = next((str(row[f]) for f in ID_FIELDS if row.get(f) not in (None, "")), None)
        if key is None:
            raise RewardsError(f"rewards file {path}:{line}: no {' / '.join(ID_FIELDS)} column")
        task = str(row["task_id"]) if row.get("task_id") else None
        outcome = Outcome(
            _number(row.get("reward"), path, line), task, _flag(row.get("resolved"), path, line)
        )
        if key in table and table[key] != outcome:
            # Taking either row would train on an outcome chosen by file order.
            raise RewardsError(
                f"rewards file {path}: lines {first_line[key]} and {line} give {key!r} different "
                f"outcomes ({_show(table[key])} vs {_show(outcome)}); keep one row per rollout"
            )
        table[key] = outcome
        first_line.setdefault(key, line)
    return table


def _show(outcome: Outcome) -> str:
    return (
        ", ".join(f"{name}={value}" for name, value in vars(outcome).items() if value is not None)
        or "no outcome"
    )


def _number(value: Any, path: Path, line: int) -> float | None:
    if value in (None, ""):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RewardsError(
            f"rewards file {path}:{line}: reward {value!r} is not a number"
        ) from None


def _flag(value: object, path: Path, line: int) -> bool | None:
    if value in (None, "") or isinstance(value, bool):
        return value if isinstance(value, bool) else None
    if str(value).lower() in TRUE | FALSE:
        return str(value).lower() in TRUE
    raise RewardsError(f"rewards file {path}:{line}: resolved {value!r} is not true/false")


def apply_rewards(rollout: Rollout, table: dict[str, Outcome]) -> tuple[Rollout, str | None]:
    """The rollout with its outcome from ``table``, and the key that matched (or None)."""
    for key in (rollout.rollout_id, rollout.meta.get("session_id"), rollout.parent_rollout_id):
        outcome = table.get(str(key)) if key is not None else None
        if outcome is not None:
            update = {
                name: value
                for name, value in (
                    ("reward", outcome.reward),
                    ("task_id", outcome.task_id),
                    ("resolved", outcome.resolved),
                )
                if value is not None
            }
            return rollout.model_copy(update=update), str(key)
    return rollout, None
