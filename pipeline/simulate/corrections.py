"""Judge correction records, in AutoCompact's proportions (24% trigger, 53% state,
23% continuation), with realistic original proposals.

A corrected rollout records what was *executed*; the correction keeps what the policy
*proposed* there. Each kind is built where it happens:

- ``trigger``: at a ``compact()`` call the policy had proposed one more (redundant)
  search instead (``missing_trigger`` / ``too_late``); or at an ordinary action the
  policy had proposed to compact while evidence was still unread (``too_early``);
- ``state``: at a summary call the policy had written a deficient working state (an
  omitted file, error, test or command; no next step; a contradiction; an invented
  path) and the executed one is complete;
- ``continuation``: at the first action after compaction the policy had proposed to
  search again for what the summary records, wander off, or skip the next step.

``original`` and ``replacement`` are both ``schemas.correction.executed_output_text`` of a
call — the one definition of "a call's executed output" the attach step checks.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from schemas.correction import Correction, Evidence, OmittedItem, executed_output_text
from schemas.rollout import MessageEvent

TYPE_WEIGHTS = {"trigger": 0.24, "state": 0.53, "continuation": 0.23}
JUDGE_MODEL = "seam-sim-judge"
PROMPT_HASH = hashlib.sha256(b"seam simulated autocompact judge v1").hexdigest()[:16]
STATE_DEFECTS = (
    ("omit_item", 0.55),
    ("omit_next", 0.2),
    ("contradiction", 0.15),
    ("invented", 0.1),
)
VERDICT_OF_DEFECT = {
    "omit_item": "omission",
    "omit_next": "missing_next_step",
    "contradiction": "contradiction",
    "invented": "invented",
    "wrong_state": "contradiction",
}
_RATIONALE = {
    "too_early": "The context still had room and the failing test output had not been examined; compacting now "
    "would have discarded evidence the next step needs.",
    "missing_trigger": "The proposal repeats a search whose result is already established; the context is long and "
    "mostly stale, so this is the point to compact.",
    "too_late": "The context is close to its limit and the last steps only re-read known material; compaction "
    "should not be deferred further.",
    "omission": "The working state drops an item the next steps depend on: {items}.",
    "missing_next_step": "The working state does not say what to do next, so the continuation has no anchor.",
    "contradiction": "The working state contradicts itself: {detail}.",
    "invented": "The working state mentions {items}, which never appeared in the history.",
    "redo": "The summary already records where the symbol is defined; searching again wastes the fresh context.",
    "drift": "The proposal is off-task: it reads material unrelated to the recorded next step.",
    "ignored_next_step": "The proposal ignores the summary's next step and runs something else first.",
}


def draw_type(rng: random.Random) -> str:
    kind = rng.choices(list(TYPE_WEIGHTS), weights=list(TYPE_WEIGHTS.values()))[0]
    if kind == "trigger":
        return (
            "trigger:"
            + rng.choices(["too_early", "missing_trigger", "too_late"], weights=[0.35, 0.4, 0.25])[
                0
            ]
        )
    return kind


def draw_state_defect(rng: random.Random) -> str:
    return rng.choices([d for d, _ in STATE_DEFECTS], weights=[w for _, w in STATE_DEFECTS])[0]


def make(
    rollout_id: str,
    call_index: int,
    kind: str,
    verdict: str,
    original: MessageEvent,
    executed: MessageEvent,
    evidence: Sequence[tuple[str, str]] = (),
    omitted: Sequence[tuple[str, str]] = (),
    detail: str = "",
) -> Correction | None:
    """A correction record, or None when the proposal renders identical to what was executed."""
    before, after = executed_output_text(original), executed_output_text(executed)
    if before == after:
        return None
    items = ", ".join(f"{k.replace('_', ' ')} `{v}`" for k, v in omitted) or detail
    return Correction(
        rollout_id=rollout_id,
        call_index=call_index,
        type=kind,
        verdict=verdict,
        original=before,
        replacement=after,
        rationale=_RATIONALE[verdict].format(items=items, detail=detail),
        evidence=[Evidence(message_id=m, quote=q) for m, q in evidence if m and q],
        omitted=[OmittedItem(kind=k, value=v) for k, v in omitted],
        judge_model=JUDGE_MODEL,
        prompt_hash=PROMPT_HASH,
    )
