"""What ``seam show`` displays of one rollout, independent of how it is drawn.

A ``RolloutView`` holds the rollout's segments as shard rows hold them (``input_ids``,
``loss_mask``, ``call_spans``, seam columns) plus, when the canonical rollout is at hand,
what only the rollout knows: which messages each rewrite kept, dropped and added, the
judge corrections and the summary audit. Each segment's tokens are cut into ``Run``s:
maximal stretches with one owner (context, or one call's output) and one mask value,
every special token (``<|im_start|>``, ``<|im_end|>``, ...) a run of its own, so the role
and call boundaries of the chat template are visible in every rendering.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipeline.core.render import ChatRenderer, template_message
from schemas.replay import replay
from schemas.rollout import MessageEvent, Rollout

SEGMENT_COLUMNS = [
    "rollout_id",
    "task_id",
    "source",
    "segment_index",
    "num_segments",
    "input_ids",
    "loss_mask",
    "call_spans",
    "seam_kind",
    "seam_trigger",
    "drift_realigned",
    "truncated",
    "reward",
    "advantage",
    "num_trainable_tokens",
    "trainable_tokens_after",
]


@dataclass
class Run:
    """Consecutive tokens with one owner and one mask value."""

    kind: str  # "context" | "output" | "special" (a special token, in context or output)
    ids: list[int]
    text: str
    trained: bool
    call_index: int | None = None  # the call whose output this is


@dataclass
class Rewrite:
    """What the rewrite before a segment did to the live context (message ids)."""

    reason: str
    trigger: str | None
    kept: list[str]
    dropped: list[str]
    added: list[str]  # new messages (a summary's resume message, a replaced result)


@dataclass
class CallNote:
    """What the rollout knows about one call beyond its tokens."""

    index: int
    kind: str
    truncated: bool
    message_id: str
    corrections: list[dict] = field(default_factory=list)  # original vs replacement
    audit: dict | None = None  # summary-audit findings of a summary call
    drift: str | None = None  # how a realigned re-tokenization drift differs


@dataclass
class SegmentView:
    index: int
    seam_kind: str
    seam_trigger: str | None
    drift_realigned: int
    truncated: bool
    advantage: float
    num_trainable_tokens: int
    trainable_tokens_after: int
    context_fidelity: list[str] | None
    spans: list[dict]
    runs: list[Run]
    context_text: str  # the last call's input, decoded
    first_context_text: str  # the first call's input, decoded (what follows a seam)
    rewrite: Rewrite | None = None


@dataclass
class RolloutView:
    rollout_id: str
    task_id: str
    source: str
    reward: float | None
    segments: list[SegmentView]
    calls: dict[int, CallNote]
    origin: str  # where it was read from
    decode: Callable[[list[int]], str] = field(repr=False)  # the build's tokenizer
    names: dict[str, str] = field(default_factory=dict)  # message id → role and excerpt
    note: str | None = None  # e.g. why rewrite details are missing

    def _repr_html_(self) -> str:
        """Jupyter displays a view as its ``seam show --html`` page."""
        from pipeline.inspect.show.html import render_html

        return render_html(self, standalone=False)

    @property
    def seams(self) -> list[SegmentView]:
        return [s for s in self.segments if s.seam_kind != "none"]


def segment_view(row: dict, renderer: ChatRenderer) -> SegmentView:
    """A segment (a shard row, or a row made on the fly) cut into runs."""
    tokens = np.asarray(row["input_ids"], dtype=np.int64)
    mask = np.asarray(row["loss_mask"], dtype=np.int8)
    spans = list(row["call_spans"])
    owner = np.full(len(tokens), -1, dtype=np.int64)
    for s in spans:
        owner[s["start"] : s["start"] + s["length"]] = s["call_index"]
    tok = renderer.tokenizer
    special_ids = [tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens]
    special = np.isin(tokens, [i for i in special_ids if i is not None])
    cut = np.flatnonzero(
        (owner[1:] != owner[:-1]) | (mask[1:] != mask[:-1]) | special[1:] | special[:-1]
    )
    bounds = [0, *(cut + 1).tolist(), len(tokens)]
    runs = []
    for a, b in zip(bounds, bounds[1:]):
        if a == b:
            continue
        ids = tokens[a:b].tolist()
        who = int(owner[a])
        runs.append(
            Run(
                "special" if special[a] else ("context" if who < 0 else "output"),
                ids,
                renderer.decode(ids),
                bool(mask[a]),
                None if who < 0 else who,
            )
        )
    last, first = spans[-1]["start"] if spans else 0, spans[0]["start"] if spans else 0
    fidelity = row.get("context_fidelity")
    return SegmentView(
        index=int(row["segment_index"]),
        seam_kind=row["seam_kind"],
        seam_trigger=row.get("seam_trigger"),
        drift_realigned=int(row.get("drift_realigned") or 0),
        truncated=bool(row.get("truncated")),
        advantage=float(row.get("advantage") or 0.0),
        num_trainable_tokens=int(mask.sum()),
        trainable_tokens_after=int(row.get("trainable_tokens_after") or 0),
        context_fidelity=list(fidelity) if fidelity is not None else None,
        spans=spans,
        runs=runs,
        context_text=renderer.decode(tokens[:last].tolist()),
        first_context_text=renderer.decode(tokens[:first].tolist()),
    )


def call_notes(rollout: Rollout | None, spans: list[dict]) -> dict[int, CallNote]:
    """Per call: kind, truncation, corrections and (summary calls) the audit's findings."""
    if rollout is None:
        return {
            s["call_index"]: CallNote(s["call_index"], s["kind"], s["truncated"], "?")
            for s in spans
        }
    from pipeline.inspect.show.audits import call_findings

    calls = rollout.calls()
    notes = {
        i: CallNote(i, m.call_kind, m.finish_reason == "length", m.id) for i, m in enumerate(calls)
    }
    for c in rollout.corrections:
        if c.call_index in notes:
            notes[c.call_index].corrections.append(c.model_dump(mode="json"))
    # The registered audits' findings (the judge's summary audit, plugged in by the
    # command line and ``import seam``: this layer imports no judge code).
    for call_index, findings in call_findings(rollout):
        if call_index in notes:
            notes[call_index].audit = findings
    return notes


def mark_drift(
    notes: dict[int, CallNote], segments: list[SegmentView], rollout: Rollout, renderer
) -> None:
    """Name the outputs a segment realigned: logged ids the template's history re-tokenizes
    differently (the segment keeps, and trains, the sampled ids)."""
    calls = replay(rollout)
    tools = rollout.tools or None
    for seg in segments:
        if not seg.drift_realigned:
            continue
        for span in seg.spans[:-1]:  # drift shows in the input of the call after it
            call = calls[span["call_index"]]
            sampled = call.message.output_ids
            if sampled is None:
                continue
            context = [template_message(m) for m in call.context]
            text = renderer.output_text(template_message(call.message), tools, context)[0]
            again = renderer.encode(text).tolist()
            if again != list(sampled):
                notes[call.index].drift = (
                    f"drift realigned: sampled as {len(sampled)} ids, history re-tokenizes the "
                    f"same text as {len(again)}; the sampled ids are kept and trained"
                )


def attach_rewrites(segments: list[SegmentView], rollout: Rollout) -> None:
    """Give each seam segment the kept / dropped / added message ids of its rewrite."""
    calls = replay(rollout)
    for prev, seg in zip(segments, segments[1:]):
        if seg.seam_kind == "none" or not seg.spans or not prev.spans:
            continue
        before = calls[prev.spans[-1]["call_index"]]
        after = calls[seg.spans[0]["call_index"]]
        old = [m.id for m in before.context] + [before.message.id]
        was = set(old)
        new = [m.id for m in after.context]
        event = after.rewrite
        seg.rewrite = Rewrite(
            reason=event.reason if event else seg.seam_kind,
            trigger=event.trigger if event else None,
            kept=[i for i in new if i in was],
            dropped=[i for i in old if i not in set(new)],
            added=[i for i in new if i not in was],
        )


def message_texts(rollout: Rollout | None) -> dict[str, str]:
    """Message id → role and a one-line excerpt (for naming kept / dropped messages)."""
    if rollout is None:
        return {}
    out: dict[str, str] = {}
    for event in rollout.events:
        items = getattr(event, "context", None) or [event]
        for m in items:
            if isinstance(m, MessageEvent):
                text = " ".join((m.content or "").split())
                out[m.id] = f"{m.role}: {text[:70]}{'…' if len(text) > 70 else ''}"
    return out
