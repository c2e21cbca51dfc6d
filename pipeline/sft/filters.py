"""Filters that keep bad trajectories out of SFT data, each with a named reason and a
switch. AutoCompact filters its corrected trajectories for malformed requests, summary
loops and off-task continuations before SFT; seam adds unresolved rollouts
(``--resolved-only``) and over-length segments.

- ``malformed_request``: a tool call whose arguments are not a JSON object (each tool
  judged by its own kind: a ``custom`` (freeform) tool's input is raw text by design,
  see ``meta.tool_kinds`` in docs/readers.md), or a call of a tool the rollout's tool
  list does not define.
- A rollout that ends waiting for a tool result (its last call asked for tools, and not to
  finish or to compact) is not malformed: the transcript was saved mid-tool (a running
  sub-agent, a ``git commit`` in flight). ``trim_dangling_call`` removes that last call
  (counted as ``trimmed_dangling_calls``) and the rollout is kept.
- ``summary_loop``: two compactions with no action call between them, or consecutive
  summaries whose text is near-identical (``difflib`` ratio ≥ ``LOOP_SIMILARITY``):
  the agent compacts instead of working. An opaque summary (an encrypted remote
  compaction) has no known text and is never compared.
- ``off_task``: the first calls after a compaction work only on files that appear
  nowhere before it — not in the history, the summary or the task, nor in a directory
  of a file that does: the agent lost the task with its context. (A file guessed next to
  the ones the agent works on is a guess on the task, not a departure from it; after a
  user message that follows the compaction, the user sets the task.)
- ``unresolved`` / ``outcome_unknown`` (only with ``resolved_only``).
- ``over_length`` (per segment): more tokens than ``max_tokens``.

Rollout filters run in this order and the first that fires is the reason counted.
"""

from __future__ import annotations

import difflib

from judge.facts import (
    classify,
    mentions_path,
    parse_arguments,
    paths_in,
    paths_memo,
    same_path,
)
from judge.history import POST_COMPACTION_CALLS, compactions
from judge.workspace import workspace_state
from pipeline.sft.filter_options import FilterOptions
from schemas.replay import replay
from schemas.rollout import MessageEvent, RewriteEvent, Rollout

# Working-state summaries share their headings and code excerpts, so consecutive summaries
# of real progress are already 85-93% similar (difflib ratio on the embedded sample);
# a summary rewritten without progress is >= 95% similar.
LOOP_SIMILARITY = 0.95
_ENDING_KINDS = ("submit", "compact")
# Tool kinds whose input is not a JSON object by design (meta.tool_kinds of a call).
_FREEFORM_KINDS = ("custom",)


def rollout_filter(rollout: Rollout, options: FilterOptions) -> tuple[str, str] | None:
    """(reason, detail) for the first filter that drops ``rollout``, or None to keep it."""
    checks = [
        (options.resolved_only, outcome),
        (options.malformed, malformed_request),
        (options.summary_loops, summary_loop),
        (options.off_task, off_task),
    ]
    with paths_memo():
        for enabled, check in checks:
            found = check(rollout) if enabled else None
            if found:
                return found
    return None


def over_length(num_tokens: int, options: FilterOptions) -> bool:
    return options.max_tokens is not None and num_tokens > options.max_tokens


def outcome(rollout: Rollout) -> tuple[str, str] | None:
    if rollout.resolved is True:
        return None
    if rollout.resolved is False:
        return "unresolved", "resolved is false"
    return "outcome_unknown", "resolved is not recorded"


def malformed_request(rollout: Rollout) -> tuple[str, str] | None:
    known = {t.get("function", t).get("name") for t in rollout.tools}
    calls = rollout.calls()
    for index, call in enumerate(calls):
        kinds = call.meta.get("tool_kinds") or {}
        for tc in call.tool_calls:
            if kinds.get(tc.id) not in _FREEFORM_KINDS and parse_arguments(tc) is None:
                return (
                    "malformed_request",
                    f"call {index}: arguments of {tc.name} are not a JSON object",
                )
            if known and tc.name not in known:
                return "malformed_request", f"call {index}: unknown tool {tc.name!r}"
    return None


def trim_dangling_call(rollout: Rollout) -> Rollout | None:
    """The rollout without its last call when that call waits for a tool result it never
    got (and it has calls before it); None when there is nothing to trim. The events
    from that call on are dropped: results of its other parallel calls go with it."""
    answered = {
        e.tool_call_id for e in rollout.events if isinstance(e, MessageEvent) and e.role == "tool"
    }
    last_at = max(
        (
            i
            for i, e in enumerate(rollout.events)
            if isinstance(e, MessageEvent) and e.role == "assistant"
        ),
        default=None,
    )
    if last_at is None:
        return None
    last = rollout.events[last_at]
    assert isinstance(last, MessageEvent)  # found as an assistant message above
    pending = [
        tc
        for tc in last.tool_calls
        if tc.id not in answered and classify(tc).kind not in _ENDING_KINDS
    ]
    earlier = any(
        isinstance(e, MessageEvent) and e.role == "assistant" for e in rollout.events[:last_at]
    )
    if not pending or not earlier:
        return None
    return rollout.model_copy(update={"events": rollout.events[:last_at]})


def summary_loop(rollout: Rollout) -> tuple[str, str] | None:
    comps = compactions(rollout, replay(rollout))
    opaque = _opaque_summaries(rollout)
    for first, second in zip(comps, comps[1:]):
        if not first.after:
            return (
                "summary_loop",
                f"compaction at {second.message_id} follows {first.message_id} with no action between",
            )
        if first.message_id in opaque or second.message_id in opaque:
            continue  # an encrypted summary's text is unknown: nothing to compare
        ratio = similarity_at_least(first.summary, second.summary, LOOP_SIMILARITY)
        if ratio is not None:
            return (
                "summary_loop",
                f"summaries {first.message_id} and {second.message_id} are {ratio:.0%} identical",
            )
    return None


def similarity_at_least(a: str, b: str, threshold: float) -> float | None:
    """``difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()`` when it is at least
    ``threshold``, else None.

    ``ratio()`` finds the matching blocks, quadratic in the texts' length (~70 ms for two
    summaries of the sample, 8 s of CPU over its 118 consecutive pairs). ``real_quick_ratio()``
    (from the lengths) and ``quick_ratio()`` (from the characters shared, order ignored) are
    upper bounds on ``ratio()`` (difflib's documentation of both), so a pair either bound
    puts under the threshold cannot reach it and the full ratio is not computed (94 of the
    118 pairs of the sample); the verdict is the one the full ratio gives."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if matcher.real_quick_ratio() < threshold or matcher.quick_ratio() < threshold:
        return None
    ratio = matcher.ratio()
    return ratio if ratio >= threshold else None


def _opaque_summaries(rollout: Rollout) -> set[str]:
    """Ids of the messages a compaction rewrite inserted when it holds an opaque item
    (``meta.opaque``): that rewrite's summary text is not known."""
    found: set[str] = set()
    for event in rollout.events:
        if isinstance(event, RewriteEvent):
            inserted = [m for m in event.context if isinstance(m, MessageEvent)]
            if any("opaque" in m.meta for m in inserted):
                found.update(m.id for m in inserted)
    return found


def off_task(rollout: Rollout) -> tuple[str, str] | None:
    task_text = next(
        (e.content for e in rollout.events if isinstance(e, MessageEvent) and e.role == "user"), ""
    )
    for comp in compactions(rollout, replay(rollout)):
        if comp.user_redirect:  # the user gave new work: following it is on task
            continue
        ops = [
            classify(tc) for v in comp.after[:POST_COMPACTION_CALLS] for tc in v.message.tool_calls
        ]
        # A search's path argument is a scope ("src"), not a file it works on.
        touched = [t for op in ops if op.kind != "search" for t in op.targets if paths_in(t)]
        if not touched:
            continue
        known = (
            workspace_state(comp.history).seen_paths + paths_in(comp.summary) + paths_in(task_text)
        )
        if not any(mentions_path(known, t) or _near_known(t, known) for t in touched):
            return (
                "off_task",
                f"after {comp.message_id} the agent works only on unseen files: {', '.join(touched[:3])}",
            )
    return None


def _near_known(path: str, known: list[str]) -> bool:
    """``path`` lies in the directory of a known file, or in a directory above or below
    one (``src/pkg/new.py`` next to a known ``src/pkg/a.py``)."""
    folder = path.rsplit("/", 1)[0] if "/" in path.strip("/") else ""
    if not folder.strip("/"):
        return False
    dirs = {k.rsplit("/", 1)[0] for k in known if "/" in k.strip("/")}
    return any(
        same_path(folder, d)
        or d.endswith("/" + folder)
        or (folder + "/") in (d + "/")
        or (d + "/") in (folder + "/")
        for d in dirs
    )
