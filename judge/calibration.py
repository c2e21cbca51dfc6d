"""Calibration of the rule judge against hand labels: ``seam judge --eval LABELS.jsonl``.

A label describes one compaction of a real session file, found by its session and the
id of its summary message (Claude Code: the ``sessionId`` and the ``uuid`` of the
``isCompactSummary`` record; a summary call: the assistant message id), or by the
file's name and that id when it names no session (``label_key``). Labels never copy the session's
text. Schema (``CompactionLabel``; docs/sft.md, "Calibration"):

- ``file``, ``uuid``: where the compaction is; ``trigger``: budget | manual | model;
  ``history_complete``: the file holds every record before the boundary;
- ``omitted``: kinds of key facts the summary drops (file_path, failing_command,
  error_message, test_name, branch_commit, user_decision, ...), empty when none;
- ``next_step``: present | missing | none_needed; ``next_step_correct``: the step follows
  the user's latest request and the recorded state (null when there is none);
- ``invented_paths``: how many paths the summary names that the history never showed;
- ``contradiction``, ``wrong_state``: booleans;
- ``continuation``: follows | redo | ignores | user_redirect (the first calls after it);
- ``policy_trigger``: the verdict on the policy's decision to compact (ok, too_early,
  too_late, missing_trigger), or null where the policy did not decide (harness logs);
- ``note``: the labeller's reasons, in their own words;
- optional provenance (docs/labels.md): ``source`` (the public repository, commit and
  path of each file of the session), ``session`` (the session id), ``evidence`` (for
  each positive, the record that shows it) and ``split`` (tune | holdout).

Each check of the rule judge is scored per compaction: flagged (a finding of that
check attributed to the compaction) against labelled positive. Precision = TP / (TP +
FP) and recall = TP / (TP + FN) (undefined, shown as n/a, when the denominator is 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from judge.history import POST_COMPACTION_CALLS, Compaction, compactions
from judge.rules import ALL_CHECKS, judge_rollout
from schemas.correction import Finding
from schemas.replay import replay
from schemas.rollout import Rollout


class SourceFile(BaseModel):
    """Where a labelled session file comes from: a public repository at a commit.

    ``ref`` names a ref that holds the commit (fetch it, then ``git show COMMIT:PATH``,
    docs/labels.md); ``shared`` is the copy's path under ``../shared`` (``realworld/…``
    or ``realworld-new/…``) when the project keeps one there."""

    model_config = ConfigDict(extra="forbid")
    repo: str
    commit: str
    path: str
    ref: str | None = None
    shared: str | None = None


class Evidence(BaseModel):
    """Where the labeller verified one positive: a record of a session file, named by
    its ``uuid`` (Claude Code) or by its 1-based ``line`` (formats without record ids,
    e.g. Codex); ``what`` says in the labeller's words what is there."""

    model_config = ConfigDict(extra="forbid")
    what: str
    file: str
    uuid: str | None = None
    line: int | None = None

    @model_validator(mode="after")
    def _located(self) -> Evidence:
        if self.uuid is None and self.line is None:
            raise ValueError("evidence needs a uuid or a line")
        return self


class CompactionLabel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file: str
    uuid: str
    trigger: Literal["budget", "manual", "model"]
    history_complete: bool
    omitted: list[str]
    next_step: Literal["present", "missing", "none_needed"]
    next_step_correct: bool | None
    invented_paths: int
    contradiction: bool
    wrong_state: bool
    continuation: Literal["follows", "redo", "ignores", "user_redirect"]
    policy_trigger: Literal["ok", "too_early", "too_late", "missing_trigger"] | None
    note: str = ""
    # Optional provenance (docs/labels.md); absent in the older labels.
    source: list[SourceFile] = []
    session: str | None = None
    evidence: list[Evidence] = []
    split: Literal["tune", "holdout"] | None = None


def load_labels(path: str) -> list[CompactionLabel]:
    """The labels of a JSONL file; a line that is not a label fails with its line number."""
    labels = []
    for number, raw in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            labels.append(CompactionLabel.model_validate(orjson.loads(raw)))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            first = str(exc).splitlines()[0]
            raise ValueError(f"{path}:{number}: not a compaction label: {first}") from None
    return labels


def labelled_positive(label: CompactionLabel, check: str) -> bool | None:
    """Whether the label says ``check`` should fire on its compaction (None: the check
    does not apply there, e.g. a trigger question where the harness compacted)."""
    kind, verdict = check.split("/")
    if kind == "trigger":
        return None if label.policy_trigger is None else label.policy_trigger == verdict
    return {
        "omission": bool(label.omitted),
        "missing_next_step": label.next_step == "missing",
        "invented": label.invented_paths > 0,
        "contradiction": label.contradiction,
        "wrong_state": label.wrong_state,
        "redo": label.continuation == "redo",
        "ignored_next_step": label.continuation == "ignores",
    }[verdict]


def attribute(findings: list[Finding], comps: list[Compaction]) -> dict[str, set[str]]:
    """Checks that fired per compaction (by summary message id): a state finding names
    the summary call or the first call that saw the summary; a continuation finding one
    of the first calls after it; a trigger finding a call of the window it closes."""
    fired: dict[str, set[str]] = {c.message_id: set() for c in comps}
    bounds = [
        (
            call.index if (call := c.summary_call or c.opens) else 1 << 30,
            c,
        )
        for c in comps
    ]
    for f in findings:
        check = f"{f.type}/{f.verdict}"
        for bound, comp in bounds:
            if f.type == "state":
                hit = f.call_index == bound
            elif f.type == "continuation":
                hit = f.call_index in {v.index for v in comp.after[:POST_COMPACTION_CALLS]}
            else:
                hit = f.call_index <= bound
            if hit:
                fired[comp.message_id].add(check)
                break
    return fired


@dataclass
class Score:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    def as_dict(self) -> dict:
        return {
            "flags": self.tp + self.fp,
            "positives": self.tp + self.fn,
            "tp": self.tp,
            "fp": self.fp,
            "fn": self.fn,
            "tn": self.tn,
            "precision": self.precision,
            "recall": self.recall,
        }


@dataclass
class Evaluation:
    scores: dict[str, Score] = field(default_factory=lambda: {c: Score() for c in ALL_CHECKS})
    labelled: int = 0
    unlabelled: list[str] = field(default_factory=list)  # compactions without a label
    missing: list[str] = field(default_factory=list)  # labels naming no compaction found
    misses: list[str] = field(default_factory=list)  # "check file uuid fp|fn"


def session_of(rollout: Rollout) -> str:
    """The session a rollout records: the harness's session id (Claude Code's
    ``sessionId``, kept by the reader as ``meta.session_id``), else the rollout id."""
    return str(rollout.meta.get("session_id") or rollout.rollout_id)


def label_key(label: CompactionLabel) -> tuple[str, str]:
    """How a label finds its compaction: the session and the boundary's id when the label
    names its session — a session spread over several files is read as one rollout named
    after its first file, so the file name of a later part finds nothing — else (older
    labels) the file name and the boundary's id."""
    return (label.session, label.uuid) if label.session else (Path(label.file).name, label.uuid)


def rule_findings(rollout: Rollout) -> list[Finding]:
    """What ``--eval`` scores by default: every rule check, on or off by default."""
    return judge_rollout(rollout, ALL_CHECKS)


def evaluate(
    labels: list[CompactionLabel],
    sources: list[tuple[str, Rollout]],
    findings_of: Callable[[Rollout], list[Finding]] = rule_findings,
) -> Evaluation:
    """Score the checks on the labelled compactions of ``sources`` (``(file path,
    rollout)`` pairs) against ``labels`` (matched by ``label_key``); ``findings_of`` gives
    a rollout's findings (default: every rule check; the LLM judge's for
    ``--eval --llm``). A boundary found in several inputs (snapshots of one session) is
    scored once, on the input whose file the label names when there is one."""
    by_key = {label_key(lab): lab for lab in labels}
    seen: dict[tuple[str, str], tuple[int, Compaction]] = {}
    comps_of: list[tuple[Rollout, list[Compaction]]] = []
    result = Evaluation()
    for path, rollout in sources:
        comps_of.append((rollout, compactions(rollout, replay(rollout))))
        for comp in comps_of[-1][1]:
            name = Path(path).name
            key = next(
                (
                    k
                    for k in ((session_of(rollout), comp.message_id), (name, comp.message_id))
                    if k in by_key
                ),
                None,
            )
            if key is None:
                result.unlabelled.append(f"{name} {comp.message_id}")
            elif key not in seen or Path(by_key[key].file).name == name:
                seen[key] = (len(comps_of) - 1, comp)
    fired_in: dict[int, dict[str, set[str]]] = {}
    for key, (at, comp) in seen.items():
        if at not in fired_in:  # judge only the rollouts that hold a labelled compaction
            rollout, comps = comps_of[at]
            fired_in[at] = attribute(findings_of(rollout), comps)
        fired = fired_in[at][comp.message_id]
        label = by_key[key]
        where = f"{Path(label.file).name} {label.uuid}"
        result.labelled += 1
        for check, score in result.scores.items():
            positive = labelled_positive(label, check)
            flagged = check in fired
            if positive is None and not flagged:
                continue
            positive = bool(positive)
            if flagged and positive:
                score.tp += 1
            elif flagged:
                score.fp += 1
                result.misses.append(f"{check} {where} false positive")
            elif positive:
                score.fn += 1
                result.misses.append(f"{check} {where} missed")
            else:
                score.tn += 1
    result.missing = [
        f"{Path(lab.file).name} {lab.uuid}" for k, lab in by_key.items() if k not in seen
    ]
    return result
