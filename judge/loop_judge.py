"""seam's rule judge in the gateway's loop (``seam gateway --judge rules``): a
``pipeline.gateway.judging.LoopJudge`` over ``judge/rules.py``.

Every check runs on the session so far, candidate included; its findings are recorded on
the call. Only a finding of a check on by default (``judge/measured.py``: precision >= 0.8
on held-out real labels) that says what to do instead becomes a correction: a summary
that drops key state is replaced by the same summary with the dropped items appended.
"""

from __future__ import annotations

import asyncio

from judge.rules import ALL_CHECKS, DEFAULT_CHECKS, RULE_JUDGE, judge_rollout
from pipeline.gateway.judging import Outcome, Review
from schemas.rollout import Rollout


class RuleJudge:
    """``correcting``: the checks whose findings may replace a response (default: the
    checks on by default, ``judge.rules.DEFAULT_CHECKS``)."""

    def __init__(self, correcting: tuple[str, ...] | None = None) -> None:
        self.name = RULE_JUDGE
        self.correcting = DEFAULT_CHECKS if correcting is None else correcting

    async def review(self, rollout: Rollout, call_index: int, candidate: dict) -> Outcome:
        return await asyncio.to_thread(self._review, rollout, call_index, candidate)

    def _review(self, rollout: Rollout, call_index: int, candidate: dict) -> Outcome:
        found = [f for f in judge_rollout(rollout, ALL_CHECKS) if f.call_index == call_index]
        findings = [
            {
                **f.model_dump(exclude={"rollout_id", "call_index"}),
                "on_by_default": f"{f.type}/{f.verdict}" in DEFAULT_CHECKS,
            }
            for f in found
        ]
        # Only a check that cleared the precision bar (judge/measured.py) corrects; an
        # opt-in check's finding is recorded, never executed in place of the original.
        omission = next(
            (
                f
                for f in found
                if "state/omission" in self.correcting
                and (f.type, f.verdict) == ("state", "omission")
                and f.omitted
            ),
            None,
        )
        if omission is None:
            return Outcome(None, findings)
        kept = "\n".join(f"- {o.kind.replace('_', ' ')}: {o.value}" for o in omission.omitted)
        replacement = {
            **candidate,
            "content": (candidate.get("content") or "").rstrip()
            + "\n\nKey state the summary must keep:\n"
            + kept,
        }
        evidence = [e.model_dump() for e in omission.evidence]
        review = Review("state", "omission", replacement, omission.rationale, self.name, evidence)
        return Outcome(review, findings)
