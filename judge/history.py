"""Where a rollout compacted, what each summary was written from, and what came after.

A compaction is either a **summary call** (the policy wrote the summary: AutoCompact's
``compact()``, CompactionRL's ``q_sum`` call) or a compaction **rewrite** that inserts a
summary the rollout did not record as a call (Claude Code's ``isCompactSummary`` message,
Codex's replacement history, an OpenHands condensation). ``summary_of`` is the one place
that decides what a summary is; a microcompaction (tool results cleared in place), a
truncation or an edit inserts none, so it is never taken for a summary, even when it
comes right before the compaction. Either way the summary was written from the live
context at that moment and is followed by a new *window* of calls; the first calls of
that window are the "first steps after compaction" that AutoCompact's judge reviews.

Who decided to compact matters to the rules: in harness logs (Claude Code, Codex) the
agent never decides (``budget`` = the harness at its token budget, ``manual`` = the
user's ``/compact``), so trigger questions apply only to compactions the policy chose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from judge.summary import summary_text
from schemas.replay import CallView
from schemas.rollout import MessageEvent, RewriteEvent, Rollout

# AutoCompact reviews "the first steps after compaction"; three calls cover re-orienting
# (read the file the summary names), acting, and checking.
POST_COMPACTION_CALLS = 3
# Reader flags on the message a compaction rewrite inserts as its summary.
SUMMARY_FLAGS = ("compact_summary", "condensation_summary")
OPAQUE_FLAG = "opaque"  # an item whose text the log does not hold (pipeline/core/fidelity.py)
# rollout.meta["fidelity"] reasons (pipeline/core/fidelity.py) that mean the history before a
# point is not all in the rollout, so "never seen before" cannot be judged there.
INCOMPLETE_HISTORY = ("slice_start", "lost_records", "opaque_summary")


@dataclass(frozen=True)
class Compaction:
    summary: str
    message_id: str  # the summary call, or the message the rewrite inserted
    summary_call: CallView | None  # None when the rewrite inserted a summary not written by a call
    history: Sequence[MessageEvent]  # the live context the summary was written from
    prior: tuple[MessageEvent, ...]  # every message before the summary, compacted-away included
    trigger: str | None  # budget | model | manual, when a rewrite recorded it
    after: tuple[CallView, ...]  # the action calls of the window it opens
    opens: CallView | None  # the first call of the window it opens (None: the rollout ends)
    user_after: tuple[MessageEvent, ...]  # user messages between the summary and ``opens``
    history_complete: bool  # every message before the summary is in the rollout
    opaque: bool = False  # the summary's text is unknown (encrypted): nothing to check

    @property
    def user_redirect(self) -> bool:
        """The user spoke after the compaction: the agent follows them, not the summary."""
        return any(not is_harness_note(m.content) for m in self.user_after)

    @property
    def policy_chose(self) -> bool:
        """The policy decided to compact here (not the harness's budget, not the user)."""
        if self.trigger is not None:
            return self.trigger == "model"
        return self.summary_call is not None


def is_harness_note(text: str) -> bool:
    """A user-role message the harness wrote, not the user: Claude Code's slash-command
    echo (``<command-name>/compact</command-name>``), its command output, its caveats."""
    return text.lstrip().startswith(
        ("<command-name>", "<command-message>", "<local-command-", "Caveat: ")
    )


def summary_of(event: MessageEvent | RewriteEvent) -> tuple[MessageEvent, ...]:
    """The message(s) that are the summary of a compaction, or ``()`` when ``event`` is
    not one. A summary call is its own summary. A compaction rewrite's summary is what it
    inserts: the message a reader flagged as the summary; else an opaque item (Codex's
    encrypted remote compaction: a summary whose text is unknown); else every new
    user/assistant message (a handoff of several: Terminus-2's summary, questions and
    answers). A microcompaction (Claude Code's ``microcompact_boundary``: tool results
    cleared in place) and truncations and edits write no summary."""
    if isinstance(event, MessageEvent):
        return (event,) if event.role == "assistant" and event.call_kind == "summary" else ()
    if event.reason != "compaction" or event.meta.get("kind") == "microcompact":
        return ()
    new = [m for m in event.context if isinstance(m, MessageEvent)]
    flagged = [m for m in new if any(m.meta.get(f) for f in SUMMARY_FLAGS)]
    opaque = [m for m in new if m.meta.get(OPAQUE_FLAG)]
    return tuple(flagged or opaque or [m for m in new if m.role in ("user", "assistant")])


def is_compaction_rewrite(view: CallView) -> bool:
    return view.rewrite is not None and view.rewrite.reason == "compaction"


def windows(views: list[CallView], rollout: Rollout | None = None) -> list[list[CallView]]:
    """Calls grouped into context windows: a summary call closes its window, a rewrite
    that inserts a summary opens a new one (with ``rollout``; without it, any compaction
    rewrite does)."""
    opening = _summary_rewrites(rollout) if rollout is not None else None
    out: list[list[CallView]] = [[]]
    for view in views:
        opens = view.message.id in opening if opening is not None else is_compaction_rewrite(view)
        if opens and out[-1]:
            out.append([])
        out[-1].append(view)
        if view.message.call_kind == "summary":
            out.append([])
    return [w for w in out if w]


def compactions(rollout: Rollout, views: list[CallView]) -> list[Compaction]:
    every = list(_all_messages(rollout))
    position = {m.id: i for i, m in enumerate(every)}
    results = {m.tool_call_id: m for m in every if m.role == "tool"}
    by_id = {v.message.id: v for v in views}
    incomplete_from = _incomplete_from(rollout, position)
    found = []
    last: CallView | None = None
    pending_call: CallView | None = None  # a summary call whose rewrite may follow
    for event in rollout.events:
        if isinstance(event, MessageEvent) and event.role == "assistant":
            if pending_call is not None:
                found.append(_from_call(pending_call, None, every, position, incomplete_from))
                pending_call = None
            last = by_id[event.id]
            if summary_of(event):
                pending_call = last
            continue
        if not isinstance(event, RewriteEvent) or event.reason != "compaction":
            continue
        if pending_call is not None and event.meta.get("kind") != "microcompact":
            found.append(_from_call(pending_call, event, every, position, incomplete_from))
            pending_call = None
            continue
        summary = summary_of(event)
        if not summary or last is None:
            continue
        answers = tuple(results[c.id] for c in last.message.tool_calls if c.id in results)
        history = last.context + (last.message,) + answers
        first = summary[0]
        found.append(
            Compaction(
                "\n".join(m.content for m in summary),
                first.id,
                None,
                history,
                tuple(every[: position[first.id]]),
                event.trigger,
                (),
                None,
                (),
                position[first.id] < incomplete_from,
                any(OPAQUE_FLAG in m.meta for m in summary),
            )
        )
    if pending_call is not None:
        found.append(_from_call(pending_call, None, every, position, incomplete_from))
    return [_with_window(c, views) for c in found]


def _from_call(
    view: CallView,
    rewrite: RewriteEvent | None,
    every: list[MessageEvent],
    position: dict[str, int],
    incomplete_from: int,
) -> Compaction:
    at = position[view.message.id]
    return Compaction(
        summary_text(view.message),
        view.message.id,
        view,
        view.context,
        tuple(every[:at]),
        rewrite.trigger if rewrite is not None else None,
        (),
        None,
        (),
        at < incomplete_from,
    )


def _with_window(comp: Compaction, views: list[CallView]) -> Compaction:
    """Fill in the calls of the window the compaction opens: from the first call whose
    context holds the summary (or, after a summary call, the next call) to the next
    compaction."""
    if comp.summary_call is not None:
        start = comp.summary_call.index + 1
    else:
        start = next(
            (v.index for v in views if any(m.id == comp.message_id for m in v.context)),
            len(views),
        )
    window: list[CallView] = []
    for view in views[start:]:
        if window and view.rewrite is not None and summary_of(view.rewrite):
            break
        window.append(view)
        if view.message.call_kind == "summary":
            break
    opens = window[0] if window else None
    user_after: tuple[MessageEvent, ...] = ()
    if opens is not None:
        ids = [m.id for m in opens.context]
        since = ids.index(comp.message_id) + 1 if comp.message_id in ids else len(ids)
        user_after = tuple(
            m
            for m in opens.context[since:]
            if m.role == "user" and not m.meta.get("is_meta") and m.content.strip()
        )
    return Compaction(
        comp.summary,
        comp.message_id,
        comp.summary_call,
        comp.history,
        comp.prior,
        comp.trigger,
        tuple(v for v in window if v.message.call_kind == "action"),
        opens,
        user_after,
        comp.history_complete,
        comp.opaque,
    )


def _summary_rewrites(rollout: Rollout) -> set[str]:
    """Ids of the calls right after a rewrite that inserted a summary."""
    found, armed = set(), False
    for event in rollout.events:
        if isinstance(event, RewriteEvent):
            armed = armed or bool(summary_of(event))
        elif event.role == "assistant":
            if armed:
                found.add(event.id)
            armed = False
    return found


def _incomplete_from(rollout: Rollout, position: dict[str, int]) -> int:
    """The position from which the history is known to be incomplete: 0 when a reader
    recorded a missing start or lost records for the whole rollout, else the first
    affected event's position (reader convention of ``rollout.meta["fidelity"]``)."""
    entries = rollout.meta.get("fidelity") or []
    at = len(position) + 1
    for entry in entries:
        if isinstance(entry, dict) and entry.get("reason") in INCOMPLETE_HISTORY:
            event_id = entry.get("event_id")
            where = position.get(event_id) if event_id else 0
            at = min(at, 0 if where is None else where)
    return at


def _all_messages(rollout: Rollout):
    for event in rollout.events:
        if isinstance(event, MessageEvent):
            yield event
        else:
            yield from (m for m in event.context if isinstance(m, MessageEvent))
