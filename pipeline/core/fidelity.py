"""Context fidelity: is a segment's context exactly what the model received?

Readers record what they know is missing or altered as ``rollout.meta["fidelity"]``, a
list of ``{"reason": str, "event_id": str | None, "detail": str}`` (docs/data.md,
"Context fidelity"): ``event_id`` is the first event affected (every later call is
affected too), ``None`` the whole rollout. An opaque context item (e.g. Codex's
encrypted remote compaction) is a ``user`` message with ``meta["opaque"] = "<why>"``
and a short placeholder content. This module turns both into the per-segment
``context_fidelity`` column: ``["exact"]``, or the sorted reasons that apply.

An assistant message may carry ``meta["reported_input_tokens"]`` (the provider's
usage, cache tokens included); it becomes the per-call ``reported_input_tokens``
column, to compare with the rebuilt input length (``call_spans[i].start``). Those counts
are the second witness (``pipeline/core/witness.py``): a segment whose context grows between
two calls by more or less than the harness says gets ``unexplained_context_gap``.

``REASONS`` is the one vocabulary: a rollout whose ``meta["fidelity"]`` names any other
reason is refused (``UnknownReason``; the build quarantines it with that line).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pipeline.common.errors import SeamError
from pipeline.core import witness
from pipeline.core.segment import Segment
from schemas.replay import CallView, replay
from schemas.rollout import MessageEvent, RewriteEvent, Rollout

EXACT = "exact"

# Every reason a segment can carry, with its meaning (docs/data.md and the README list
# the same). Readers add entries with these names; any other name is refused.
REASONS: dict[str, str] = {
    "slice_start": "the file starts mid-session: the history before its first record is missing",
    "opaque_summary": "the context holds an opaque item (an encrypted summary) whose text is unknown",
    "opaque_tool_result": "the context holds a tool result the log does not record (a provider-run web search)",
    "lost_records": "a record of the session was lost or could not be decoded",
    "missing_system_prompt": "the log does not record the system prompt the model received",
    "missing_tool_schemas": "the log does not record the tool schemas the model received",
    "synthesized_summary_call": "the summary call was not logged; seam synthesized it",
    "unlogged_post_compaction_context": "after a compaction Claude Code re-attached files, the plan, skills and hook output, and this log version records none of them",
    "redacted_reasoning": "a call reasoned, but the log holds no text of it (a signature or an encrypted blob): its trained output is the visible text and tool calls only",
    "unrendered_attachment": "the context held a Claude Code attachment seam cannot reproduce (its type in the detail)",
    "unverified_attachment": "a Claude Code attachment from a version whose rendering seam has not observed (rendered as 2.1.197 renders it)",
    "image_content": "the context held images; seam keeps an [image] placeholder per image (a text tokenizer cannot reproduce their tokens)",
    "unrendered_tool_reference": "a tool result held tool_reference blocks, which the provider expands into tool definitions the log does not record",
    "interleaved_tool_outputs": "the log has a response's tool outputs between its calls (older Codex); the context puts them after the calls, in call order",
    witness.GAP_REASON: "the harness's own input token counts grow by more (or less) than "
    "seam's rebuilt context between two calls: something the model saw is missing (or added)",
}

# Reasons that mean the file is damaged (not merely silent about a part of the context):
# such rollouts are quarantined unless --keep-damaged.
DAMAGE = frozenset({"lost_records"})

# Build counts: segments per context_fidelity value, as "fidelity_<reason>" keys.
COUNT_PREFIX = "fidelity_"

FIDELITY_KEY = "fidelity"
OPAQUE_KEY = "opaque"
# On a call seam wrote rather than the log (e.g. pipeline/sft/synthesize.py's summary calls): the
# reason, given to the segments whose spans hold that call.
SYNTHESIZED_KEY = "synthesized_call"
# The reason an opaque item gives the segments that see it, by its kind (meta["opaque"]);
# any other kind is an opaque summary.
OPAQUE_REASONS = {"web_search_results": "opaque_tool_result"}
REPORTED_KEY = "reported_input_tokens"
# On a call whose reasoning the log holds only as a signature or an encrypted blob: how
# many such reasoning blocks (items) the response had. A segment whose calls or context
# hold such a call says ``redacted_reasoning`` (docs/data.md, "Redacted reasoning").
REDACTED_KEY = "redacted_reasoning"


class UnknownReason(SeamError, ValueError):
    """A rollout names a fidelity reason that is not in ``REASONS`` (one line)."""


def entries(rollout: Rollout) -> list[dict]:
    value = rollout.meta.get(FIDELITY_KEY) or []
    return [e for e in value if isinstance(e, dict) and e.get("reason")]


def check_reasons(rollout: Rollout) -> None:
    """Raise ``UnknownReason`` for a ``meta["fidelity"]`` reason outside ``REASONS``."""
    unknown = sorted({str(e["reason"]) for e in entries(rollout)} - REASONS.keys())
    if unknown:
        raise UnknownReason(
            f"context fidelity reason(s) {', '.join(map(repr, unknown))} not known to seam "
            f"(pipeline/core/fidelity.py REASONS: {', '.join(REASONS)})"
        )


def damage(rollout: Rollout) -> str | None:
    """One line naming the rollout's damage (reason and detail), or None if undamaged."""
    found = [e for e in entries(rollout) if e["reason"] in DAMAGE]
    if not found:
        return None
    return "; ".join(f"{e['reason']}: {e.get('detail') or ''}".rstrip(": ") for e in found)


def _positions(rollout: Rollout) -> dict[str, int]:
    """Event id → position in ``rollout.events`` (a message inside a rewrite's context
    takes the rewrite's position)."""
    where: dict[str, int] = {}
    for i, event in enumerate(rollout.events):
        where.setdefault(event.id, i)
        if isinstance(event, RewriteEvent):
            for item in event.context:
                if isinstance(item, MessageEvent):
                    where.setdefault(item.id, i)
    return where


class _Span(Protocol):
    @property
    def call_index(self) -> int: ...

    @property
    def start(self) -> int: ...


class SpannedSegment(Protocol):
    """What the fidelity of a segment depends on: which calls it holds, and where."""

    @property
    def spans(self) -> Sequence[_Span]: ...


def _marked(rollout: Rollout) -> bool:
    """Whether a message of the rollout carries a mark ``segment_fidelity`` reads: an
    opaque item or redacted reasoning (in an event or in a rewrite's context), or a
    synthesized call (an event). One pass over the events (it runs for every rollout)."""
    for event in rollout.events:
        if isinstance(event, RewriteEvent):
            for m in event.context:
                if isinstance(m, MessageEvent) and (OPAQUE_KEY in m.meta or REDACTED_KEY in m.meta):
                    return True
        elif event.meta and (
            OPAQUE_KEY in event.meta or REDACTED_KEY in event.meta or SYNTHESIZED_KEY in event.meta
        ):
            return True
    return False


def segment_fidelity(
    rollout: Rollout,
    segments: Sequence[SpannedSegment],
    witnesses: Sequence[witness.SegmentWitness] | None = None,
) -> list[list[str]]:
    """``context_fidelity`` of each segment: ``["exact"]`` or its sorted reasons.

    A reason with an ``event_id`` applies to the segments whose last call comes at or
    after that event (a segment's tokens are its last call's input and output); one
    without (or with an id not in the rollout) applies to every segment. A segment whose
    last call's context holds an opaque item gets ``opaque_summary`` (or the reason
    ``OPAQUE_REASONS`` gives its kind); one that holds a call seam synthesized gets that
    call's ``meta.synthesized_call`` reason; one whose calls or context hold a call with
    ``meta.redacted_reasoning`` gets ``redacted_reasoning``; one whose growth the
    harness's token counts contradict gets ``unexplained_context_gap``
    (``segment_witnesses``; ``witnesses``: those, when the caller has them already).
    """
    found = entries(rollout)
    if witnesses is None:
        witnesses = segment_witnesses(rollout, segments)
    gaps = [w.gap for w in witnesses]
    if not found and not _marked(rollout):
        # the common case: no second replay
        return [[witness.GAP_REASON] if gap else [EXACT] for gap in gaps]
    calls: list[CallView] = replay(rollout)
    where = _positions(rollout)
    call_pos = [where[c.message.id] for c in calls]
    result = []
    for seg, gap in zip(segments, gaps):
        last = seg.spans[-1].call_index if seg.spans else None
        reasons: set[str] = {witness.GAP_REASON} if gap else set()
        for e in found:
            event_id = e.get("event_id")
            at = where.get(event_id) if event_id is not None else None
            if at is None or last is None or call_pos[last] >= at:
                reasons.add(str(e["reason"]))
        if last is not None:
            reasons.update(
                OPAQUE_REASONS.get(str(m.meta[OPAQUE_KEY]), "opaque_summary")
                for m in calls[last].context
                if OPAQUE_KEY in m.meta
            )
        if last is not None and _sees_redacted(calls[last]):
            reasons.add(REDACTED_KEY)
        reasons.update(
            str(calls[s.call_index].message.meta[SYNTHESIZED_KEY])
            for s in seg.spans
            if SYNTHESIZED_KEY in calls[s.call_index].message.meta
        )
        result.append(sorted(reasons) or [EXACT])
    return result


def _sees_redacted(call: CallView) -> bool:
    """The call (the segment's last) or an earlier call in its context reasoned without
    a logged text: the segment trains an incomplete output, or its context lacks
    reasoning the model was sent back (Claude's thinking blocks within a tool loop,
    Codex's encrypted reasoning items), or both. Every output a segment trains lies in
    its last call's context, so this one check covers all of its calls."""
    return REDACTED_KEY in call.message.meta or any(
        m.role == "assistant" and REDACTED_KEY in m.meta for m in call.context
    )


def segment_witnesses(
    rollout: Rollout,
    segments: Sequence[SpannedSegment],
    calls: Sequence[MessageEvent] | None = None,
) -> list[witness.SegmentWitness]:
    """The second witness of each segment: its calls' reported input growth against the
    growth of its rebuilt input (``call_spans[i].start``), for ``rollout.model``.
    ``calls``: ``rollout.calls()``, when the caller has it already."""
    calls = rollout.calls() if calls is None else calls
    return [
        witness.witness(
            [s.start for s in seg.spans],
            [_reported(calls[s.call_index]) for s in seg.spans],
            rollout.model,
        )
        for seg in segments
    ]


def reported_input_tokens(
    rollout: Rollout, segment: Segment, calls: Sequence[MessageEvent] | None = None
) -> list[int | None]:
    """Per call of the segment (aligned with ``call_spans``): the input tokens the
    provider reported for that call, or None where the log has no usage. ``calls``:
    ``rollout.calls()``, when the caller has it already."""
    calls = rollout.calls() if calls is None else calls
    return [_reported(calls[span.call_index]) for span in segment.spans]


def _reported(call: MessageEvent) -> int | None:
    value = call.meta.get(REPORTED_KEY)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
