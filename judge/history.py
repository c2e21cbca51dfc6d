"""Where a rollout compacted, what each summary was written from, and what came after.

A compaction is either a **summary call** (the policy wrote the summary: AutoCompact's
``compact()``, CompactionRL's ``q_sum`` call) or a compaction **rewrite** that inserts a
summary the rollout did not record as a call (Claude Code's ``isCompactSummary`` message).
Either way the summary was written from the live context at that moment and is followed
by a new *window* of calls; the first calls of that window are the "first steps after
compaction" that AutoCompact's judge reviews.
"""

from __future__ import annotations

from dataclasses import dataclass

from judge.summary import summary_text
from pipeline.segment import CallView
from schemas.rollout import MessageEvent, RewriteEvent, Rollout

# AutoCompact reviews "the first steps after compaction"; three calls cover re-orienting
# (read the file the summary names), acting, and checking.
POST_COMPACTION_CALLS = 3


@dataclass(frozen=True)
class Compaction:
    summary: str
    message_id: str  # the summary call, or the message the rewrite inserted
    summary_call: CallView | None  # None when the rewrite inserted a summary not written by a call
    history: tuple[MessageEvent, ...]  # the live context the summary was written from
    prior: tuple[
        MessageEvent, ...
    ]  # every message before the summary, compacted-away ones included
    trigger: str | None  # budget | model | manual, when a rewrite recorded it
    after: tuple[CallView, ...]  # the action calls of the window it opens


def is_compaction_rewrite(view: CallView) -> bool:
    return view.rewrite is not None and view.rewrite.reason == "compaction"


def windows(views: list[CallView]) -> list[list[CallView]]:
    """Calls grouped into context windows: a summary call closes its window, a compaction
    rewrite opens a new one."""
    out: list[list[CallView]] = [[]]
    for view in views:
        if is_compaction_rewrite(view) and out[-1]:
            out.append([])
        out[-1].append(view)
        if view.message.call_kind == "summary":
            out.append([])
    return [w for w in out if w]


def compactions(rollout: Rollout, views: list[CallView]) -> list[Compaction]:
    every = list(_all_messages(rollout))
    position = {m.id: i for i, m in enumerate(every)}
    results = {m.tool_call_id: m for m in every if m.role == "tool"}
    rewrite_after = _rewrite_after_call(rollout)
    wins = windows(views)
    found = []
    for i, window in enumerate(wins):
        nxt = wins[i + 1] if i + 1 < len(wins) else []
        last = window[-1]
        rewrite = rewrite_after.get(last.message.id)
        if rewrite is not None and rewrite.reason != "compaction":
            rewrite = None
        after = tuple(v for v in nxt if v.message.call_kind == "action")
        trigger = rewrite.trigger if rewrite is not None else None
        if last.message.call_kind == "summary":
            found.append(
                Compaction(
                    summary_text(last.message),
                    last.message.id,
                    last,
                    last.context,
                    tuple(every[: position[last.message.id]]),
                    trigger,
                    after,
                )
            )
        elif rewrite is not None:
            inserted = [
                m for m in rewrite.context if isinstance(m, MessageEvent) and m.role != "system"
            ]
            if not inserted:
                continue
            answers = tuple(results[c.id] for c in last.message.tool_calls if c.id in results)
            found.append(
                Compaction(
                    "\n".join(m.content for m in inserted),
                    inserted[0].id,
                    None,
                    last.context + (last.message,) + answers,
                    tuple(every[: position[inserted[0].id]]),
                    trigger,
                    after,
                )
            )
    return found


def _rewrite_after_call(rollout: Rollout) -> dict[str, RewriteEvent]:
    """The first rewrite after each call (before the next call), by call message id; the
    rewrite that installs a summary can be the rollout's last event."""
    found, last_call = {}, None
    for event in rollout.events:
        if isinstance(event, RewriteEvent):
            if last_call is not None:
                found.setdefault(last_call, event)
        elif event.role == "assistant":
            last_call = event.id
    return found


def _all_messages(rollout: Rollout):
    for event in rollout.events:
        if isinstance(event, MessageEvent):
            yield event
        else:
            yield from (m for m in event.context if isinstance(m, MessageEvent))
