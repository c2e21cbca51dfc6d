"""Join correction records to the rollouts they name; refuse the ones that do not fit.

A correction says: at call k the policy proposed ``original``, a judge replaced it, and
``replacement`` was executed. The rollout records what was executed, so SFT trains the
replacement exactly where the rollout has it, and the original proposal never enters
a training sequence (it is kept only in the ``corrections`` column and in preference
pairs). A correction is attached only when (docs/design.md: a correction that does not
match its rollout is reported, never silently dropped):

- its call exists;
- ``replacement`` equals the call's executed output text (``executed_output_text``);
- ``original`` differs from it (else nothing was corrected);
- its type fits the call: ``state`` → a summary call; ``trigger`` → a call at a
  compaction decision (it compacts, its original proposal compacted, or a compaction
  follows within ``TRIGGER_WINDOW`` calls); ``continuation`` → one of the first
  ``POST_COMPACTION_CALLS`` action calls after a compaction;
- no other correction of the same type names the same call;
- it was not made by an opt-in check of seam's rule judge (``judge/measured.py``: a
  check below the precision bar on held-out real labels writes findings, not targets).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from pydantic import ValidationError

from judge.facts import classify
from judge.history import POST_COMPACTION_CALLS, compactions
from judge.measured import opt_in_rule_correction
from schemas.correction import Correction, executed_output_text
from schemas.replay import CallView, replay
from schemas.rollout import Rollout

# A "too early" trigger correction replaces a compaction with more work; the compaction
# then comes a few calls later. Three calls is the distance AutoCompact's examples show.
TRIGGER_WINDOW = 3
_COMPACT_CALL_RE = re.compile(r'<tool_call>\s*\{"name":\s*"[^"]*compact', re.I)


@dataclass(frozen=True)
class Rejection:
    """A correction that was not attached, and where it came from."""

    reason: str
    correction: dict
    origin: str  # "embedded" or "FILE:LINE"

    def quarantine_entry(self) -> dict:
        return {
            "record": "correction",
            "origin": self.origin,
            "reason": self.reason,
            "raw": self.correction,
        }


def attach(
    rollout: Rollout, extra: Sequence[tuple[Correction, str]] = ()
) -> tuple[Rollout, list[Rejection]]:
    """The rollout with every fitting correction (embedded ones first, then ``extra`` —
    (correction, origin) pairs from a corrections file) and the rejected ones."""
    views = replay(rollout)
    compacting = _compaction_calls(rollout, views)
    first_after = {
        v.index for c in compactions(rollout, views) for v in c.after[:POST_COMPACTION_CALLS]
    }
    accepted: list[Correction] = []
    rejected: list[Rejection] = []
    seen: set[tuple[int, str]] = set()
    for correction, origin in [(c, "embedded") for c in rollout.corrections] + list(extra):
        reason = misfit(rollout, views, compacting, first_after, correction)
        if reason is None and (correction.call_index, correction.type) in seen:
            reason = f"duplicate: another {correction.type} correction already names call {correction.call_index}"
        if reason is None:
            seen.add((correction.call_index, correction.type))
            accepted.append(correction)
        else:
            rejected.append(Rejection(reason, correction.model_dump(mode="json"), origin))
    return rollout.model_copy(update={"corrections": accepted}), rejected


def misfit(
    rollout: Rollout,
    views: list[CallView],
    compacting: set[int],
    first_after: set[int],
    correction: Correction,
) -> str | None:
    """Why ``correction`` cannot be attached to ``rollout``, or None when it fits."""
    k = correction.call_index
    if correction.rollout_id != rollout.rollout_id:
        return f"names rollout {correction.rollout_id!r} but is attached to rollout {rollout.rollout_id!r}"
    below_bar = opt_in_rule_correction(correction.judge_model, correction.type, correction.verdict)
    if below_bar:
        return below_bar
    if k >= len(views):
        return f"call {k} does not exist: the rollout has {len(views)} calls"
    executed = executed_output_text(views[k].message)
    if correction.replacement != executed:
        at = next(
            (i for i, (a, b) in enumerate(zip(correction.replacement, executed)) if a != b),
            min(len(correction.replacement), len(executed)),
        )
        return f"replacement does not equal the executed output of call {k} (first difference at character {at})"
    if correction.original == correction.replacement:
        return f"original equals replacement at call {k}: nothing was corrected"
    kind = views[k].message.call_kind
    if correction.type == "state" and kind != "summary":
        return f"type 'state' needs a summary call; call {k} is an {kind} call"
    if correction.type == "trigger" and not (
        k in compacting
        or _COMPACT_CALL_RE.search(correction.original)
        or any(j in compacting for j in range(k + 1, k + 1 + TRIGGER_WINDOW))
    ):
        return (
            f"type 'trigger' needs a call at a compaction decision; call {k} does not compact, its original "
            f"proposal does not compact, and no compaction follows within {TRIGGER_WINDOW} calls"
        )
    if correction.type == "continuation" and k not in first_after:
        return f"type 'continuation' needs one of the first {POST_COMPACTION_CALLS} calls after a compaction; call {k} is not"
    return None


def _compaction_calls(rollout: Rollout, views: list[CallView]) -> set[int]:
    """Calls that compact: summary calls, calls of a ``compact``-style tool, and the last
    call before a compaction rewrite."""
    found = {
        v.index
        for v in views
        if v.message.call_kind == "summary"
        or any(classify(tc).kind == "compact" for tc in v.message.tool_calls)
    }
    found |= {
        v.index - 1
        for v in views
        if v.index and v.rewrite is not None and v.rewrite.reason == "compaction"
    }
    return found


class CorrectionsFile:
    """Correction records from a JSONL file (``--corrections FILE``), by rollout id.

    Each record's origin is ``FILE:LINE``. Lines that are not valid correction records,
    and records whose rollout never shows up among the accepted inputs, are rejections
    too (``invalid``, ``unclaimed``): nothing in the file is silently ignored.
    """

    def __init__(self, path: str):
        self.path = path
        self.by_rollout: dict[str, list[tuple[Correction, str]]] = {}
        self.invalid: list[Rejection] = []
        with open(path, "rb") as fh:
            for line_no, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                origin = f"{path}:{line_no}"
                try:
                    obj = orjson.loads(raw)
                    correction = Correction.model_validate(obj)
                except orjson.JSONDecodeError as exc:
                    self.invalid.append(
                        Rejection(
                            f"invalid JSON: {exc}", {"text": raw.decode("utf-8", "replace")}, origin
                        )
                    )
                    continue
                except ValidationError as exc:
                    first = exc.errors()[0]
                    where = ".".join(str(p) for p in first["loc"]) or "record"
                    self.invalid.append(
                        Rejection(
                            f"not a correction record: {where}: {first['msg']}",
                            obj if isinstance(obj, dict) else {"value": obj},
                            origin,
                        )
                    )
                    continue
                self.by_rollout.setdefault(correction.rollout_id, []).append((correction, origin))

    def for_rollout(self, rollout_id: str) -> list[tuple[Correction, str]]:
        return self.by_rollout.get(rollout_id, [])

    def unclaimed(self, claimed_rollout_ids: set[str]) -> list[Rejection]:
        return [
            Rejection(
                f"names rollout {rid!r}, which is not among the accepted input rollouts",
                c.model_dump(mode="json"),
                origin,
            )
            for rid, items in self.by_rollout.items()
            if rid not in claimed_rollout_ids
            for c, origin in items
        ]
