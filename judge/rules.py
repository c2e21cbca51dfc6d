"""The rule judge: deterministic findings on finished rollouts, no network.

AutoCompact's Judge reviews three decisions; each rule below is a checkable floor for
one of them (docs/summaries.md: grep-level checks are "a floor, not a ceiling"):

- (a) ``trigger`` / ``missing_trigger`` or ``too_late``: inside one context window the
  agent repeats a read or search it already made (same tool, same arguments) while
  nothing was written since, so the answer is already in its context. Repeating
  established work is the symptom of a context that no longer serves the agent: it
  should have compacted. ``too_late`` when the window does end in a compaction.
- (b) ``trigger`` / ``too_early``: the policy compacted while the evidence its next step
  needs was not gathered: files were written after the last test run, so whether the
  edit works is unknown and the fresh diff is about to leave the context. Compactions
  the harness forced on budget are not the policy's decision and are not judged.
- (c) ``state`` / ``omission`` | ``invented`` | ``missing_next_step`` | ``contradiction`` |
  ``wrong_state``: the summary checks of ``summary.py``.
- (d) ``continuation`` / ``redo`` | ``ignored_next_step``: among the first calls after a
  compaction, one repeats a read, search or edit whose result the summary records as
  established (and its next step does not ask for again), or none of them touches
  anything the summary's next step names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from judge.audit import summary_check
from judge.facts import classify, command_core, mentions_path, paths_in, test_names_in
from judge.history import POST_COMPACTION_CALLS, Compaction, compactions, windows
from judge.measured import default_checks
from judge.summary import says_none_needed, split_summary, summary_body
from judge.workspace import steps_in, workspace_state
from schemas.correction import Evidence, Finding, OmittedItem
from schemas.replay import CallView, replay
from schemas.rollout import MessageEvent, Rollout, ToolCall

RULE_JUDGE = "seam-rules/2"
_QUOTE_CHARS = 160

ALL_CHECKS = (
    "trigger/missing_trigger",
    "trigger/too_late",
    "trigger/too_early",
    "state/omission",
    "state/invented",
    "state/missing_next_step",
    "state/contradiction",
    "state/wrong_state",
    "continuation/redo",
    "continuation/ignored_next_step",
)
# On by default: the checks whose precision on the held-out labelled real compactions is
# >= 0.8 over >= 5 flags, and the trigger checks, which harness logs cannot exercise
# (judge/measured.py, judge/labels/measured.json; docs/sft.md, "Calibration"). Today no
# state or continuation check clears the bar: they are opt-in (--checks).
DEFAULT_CHECKS = default_checks(ALL_CHECKS)
OPT_IN_CHECKS = tuple(c for c in ALL_CHECKS if c not in DEFAULT_CHECKS)


def judge_rollout(rollout: Rollout, checks: tuple[str, ...] = DEFAULT_CHECKS) -> list[Finding]:
    """The findings of ``checks`` ("type/verdict" names) on one rollout, ordered by call
    index (then type, verdict)."""
    views = replay(rollout)
    comps = compactions(rollout, views)
    findings = early_compactions(rollout, comps)
    if policy_compacts(rollout, views, comps):
        findings += missed_triggers(rollout, views)
    if any(c.startswith("state/") for c in checks):  # (skipped: they cost most)
        findings += summary_findings(rollout, comps)
    if any(c.startswith("continuation/") for c in checks):
        findings += continuation_findings(rollout, comps)
    findings = [f for f in findings if f"{f.type}/{f.verdict}" in checks]
    return sorted(findings, key=lambda f: (f.call_index, f.type, f.verdict))


def policy_compacts(rollout: Rollout, views: list[CallView], comps: list[Compaction]) -> bool:
    """The policy can decide to compact: it chose a compaction, has a ``compact``-style
    tool, or called one. In harness logs (Claude Code, Codex) it cannot — the harness
    compacts at its budget, the user with ``/compact`` — so "should have compacted"
    questions do not apply there."""
    if any(c.policy_chose for c in comps):
        return True
    tools = [str(t.get("function", t).get("name", "")) for t in rollout.tools]
    if any(classify(ToolCall(id="t", name=n, arguments="{}")).kind == "compact" for n in tools):
        return True
    return any(classify(tc).kind == "compact" for v in views for tc in v.message.tool_calls)


def missed_triggers(rollout: Rollout, views: list[CallView]) -> list[Finding]:
    """Rule (a): one finding per window, at the first repeated read or search (a re-read
    of a file the call then edits is the harness's read-before-edit rule, not a symptom)."""
    findings = []
    for window in windows(views, rollout):
        compacts = window[-1].message.call_kind == "summary"
        first_seen: dict[str, MessageEvent] = {}  # read/search signature -> first call that made it
        hit = None
        for view in window:
            for step in steps_in([view.message]):
                if step.op.written:
                    first_seen.clear()  # a write can change what a repeated read returns
                if step.op.kind not in ("read", "search"):
                    continue
                earlier = first_seen.setdefault(step.op.signature, view.message)
                if earlier.id != view.message.id and not _read_before_edit(step, window):
                    hit = (view, earlier, step)
                    break
            if hit:
                break
        if hit:
            view, earlier, step = hit
            findings.append(
                _finding(
                    rollout,
                    view,
                    "trigger",
                    "too_late" if compacts else "missing_trigger",
                    f"repeats {step.op.kind} `{_short(step.op.signature)}` already made by an earlier call "
                    "with nothing written since: the answer is in context but no longer used; compact here",
                    [
                        _evidence(earlier, step.op.signature),
                        _evidence(view.message, step.op.signature),
                    ],
                )
            )
    return findings


def early_compactions(rollout: Rollout, comps: list[Compaction]) -> list[Finding]:
    """Rule (b): a policy compaction right after unverified writes."""
    findings = []
    for comp in comps:
        if comp.summary_call is None or not comp.policy_chose:
            continue
        state = workspace_state(comp.history)
        if state.unverified_writes:
            writes = ", ".join(state.unverified_writes)
            findings.append(
                _finding(
                    rollout,
                    comp.summary_call,
                    "trigger",
                    "too_early",
                    f"compacted after writing {writes} with no test run since: whether the edit works "
                    "is not yet known, and the diff leaves the context",
                    [
                        _evidence(m, p)
                        for p in state.unverified_writes[:3]
                        if (m := _last_mention(comp.history, p))
                    ],
                )
            )
    return findings


def summary_findings(rollout: Rollout, comps: list[Compaction]) -> list[Finding]:
    """Rule (c): one finding per failed summary check, for every summary (a summary
    call, or a summary a rewrite inserted: then the finding names the first call that
    saw it, and its evidence the summary message)."""
    findings = []
    for comp in comps:
        view = comp.summary_call or comp.opens
        if view is None or comp.opaque:  # an encrypted summary's text is unknown
            continue
        summary_msg = _summary_message(comp)
        check = summary_check(comp)
        if check.omitted:
            findings.append(
                _finding(
                    rollout,
                    view,
                    "state",
                    "omission",
                    "the summary drops key state: "
                    + "; ".join(f"{o.kind} {o.value}" for o in check.omitted),
                    [
                        _evidence(m, o.value)
                        for o in check.omitted
                        if (m := _last_mention(comp.history, o.value))
                    ],
                    check.omitted,
                )
            )
        if check.invented_paths:
            findings.append(
                _finding(
                    rollout,
                    view,
                    "state",
                    "invented",
                    "the summary names paths never seen before it: "
                    + ", ".join(check.invented_paths),
                    [_evidence(summary_msg, p) for p in check.invented_paths],
                )
            )
        if not check.has_next_step:
            what = (
                f"its next step is vague: {_short(check.next_step)!r}"
                if check.next_step
                else "it has no next step"
            )
            findings.append(
                _finding(
                    rollout,
                    view,
                    "state",
                    "missing_next_step",
                    f"the summary lacks a concrete next step: {what}",
                    [],
                    [OmittedItem(kind="next_step", value=check.next_step or "")],
                )
            )
        for verdict, reasons in (
            ("contradiction", check.contradictions),
            ("wrong_state", check.wrong_state),
        ):
            if reasons:
                findings.append(_finding(rollout, view, "state", verdict, "; ".join(reasons), []))
    return findings


def continuation_findings(rollout: Rollout, comps: list[Compaction]) -> list[Finding]:
    """Rule (d): redone work and ignored next steps in the first calls after a compaction.
    A re-read of a file the window then edits is required by harnesses (Claude Code
    refuses an edit of a file not read in the current context), not a redo; a user
    message after the compaction overrides the summary's next step."""
    findings = []
    for comp in comps:
        first = comp.after[:POST_COMPACTION_CALLS]
        if not first or comp.opaque:
            continue
        body = summary_body(comp.summary)
        state_part, next_part = split_summary(body)
        next_part = next_part or ""
        targets = (
            []
            if says_none_needed(next_part)  # nothing left to do: nothing to follow
            else paths_in(next_part)
            + test_names_in(next_part)
            + _identifiers(next_part)
            + _commands(next_part)
        )
        state_paths = paths_in(state_part)
        before = _established(comp.history)
        for view in first:
            redo = next(
                (
                    s
                    for s in steps_in([view.message])
                    if s.op.signature in before
                    and _recorded(before[s.op.signature], state_paths)
                    and not _mentions_any(f"{s.tool_call.name} {s.tool_call.arguments}", targets)
                    and not _read_before_edit(s, comp.after)
                ),
                None,
            )
            if redo:
                quoted = [_evidence(_summary_message(comp), t) for t in redo.op.targets[:1]]
                findings.append(
                    _finding(
                        rollout,
                        view,
                        "continuation",
                        "redo",
                        f"repeats `{_short(redo.op.signature)}`, which the summary records as done; "
                        f"its next step was: {_short(next_part or '(none)')}",
                        quoted,
                    )
                )
                break
        looked = _first_acting(comp.after)
        if (
            targets
            and not comp.user_redirect
            and not any(_touches(view, targets + paths_in(body)) for view in looked)
        ):
            findings.append(
                _finding(
                    rollout,
                    looked[0],
                    "continuation",
                    "ignored_next_step",
                    f"none of the first {len(looked)} calls after compaction touches what the summary's next "
                    f"step names ({', '.join(targets[:4])}) or any file the summary names",
                    [],
                )
            )
    return findings


# How far the ignored-next-step check looks past the first calls while the agent only
# looks around (reads, searches, ``git status``): real agents re-read before they act.
LOOK_AROUND_CALLS = 8
_INSPECT_RE = re.compile(r"^\s*git\s+(?:status|diff|log|show|branch|stash list)\b")


def _first_acting(after: Sequence[CallView]) -> list[CallView]:
    """The first ``POST_COMPACTION_CALLS`` calls after a compaction, and then more while
    every call so far only looked around, up to the first call that acts (writes, runs,
    tests) or ``LOOK_AROUND_CALLS`` calls."""
    taken = list(after[:POST_COMPACTION_CALLS])
    for view in after[POST_COMPACTION_CALLS:LOOK_AROUND_CALLS]:
        if any(not _looks_around(s.op) for v in taken for s in steps_in([v.message])):
            break
        taken.append(view)
    return taken


def _looks_around(op) -> bool:
    return op.kind in ("read", "search") or bool(
        op.command and _INSPECT_RE.match(command_core(op.command))
    )


def _read_before_edit(step, calls) -> bool:
    """A read of a file that one of ``calls`` then writes: the read an edit needs."""
    if step.op.kind != "read" or not step.op.targets:
        return False
    written = [p for v in calls for s in steps_in([v.message]) for p in s.op.written]
    return any(mentions_path(written, t) for t in step.op.targets)


def _summary_message(comp: Compaction) -> MessageEvent:
    if comp.summary_call is not None:
        return comp.summary_call.message
    return next(
        m for v in (comp.opens,) if v is not None for m in v.context if m.id == comp.message_id
    )


def _established(history) -> dict:
    """Reads, searches and writes before the compaction whose result still holds: a read
    or search is dropped once a later write touches a file it read or found."""
    live: dict = {}
    for step in steps_in(history):
        if step.op.written:
            live = {
                sig: s
                for sig, s in live.items()
                if s.op.kind == "write"
                or not any(mentions_path(list(step.op.written), t) for t in _found(s))
            }
        if step.op.kind in ("read", "search", "write"):
            live[step.op.signature] = step
    return live


def _found(step) -> tuple[str, ...]:
    """The files a step is about: what a search found (its path argument is only a
    scope), else the files it read or wrote."""
    if step.op.kind == "search":
        return tuple(paths_in(step.result or "")) or step.op.targets
    return step.op.targets


def _recorded(step, state_paths: list[str]) -> bool:
    """The summary records a step's result: it names the file the step read or wrote, or
    (for a search) a file the search found."""
    return any(mentions_path(state_paths, t) for t in _found(step))


def _touches(view: CallView, targets: list[str]) -> bool:
    """A call works on something the next step names (in what it says or what it calls);
    a test run follows a next step that names a test (the suite runs it)."""
    if any(_is_test_name(t) for t in targets) and any(
        classify(c).kind == "test" for c in view.message.tool_calls
    ):
        return True
    return _mentions_any(
        view.message.content
        + " "
        + " ".join(f"{c.name} {c.arguments}" for c in view.message.tool_calls),
        targets,
    )


def _mentions_any(text: str, targets: list[str]) -> bool:
    mentioned = paths_in(text)
    squashed = " ".join(text.split())
    return any(
        t in squashed
        if " " in t
        else mentions_path(mentioned, t)
        if "." in t
        else re.search(rf"\b{re.escape(t)}\b", text)
        for t in targets
    )


def _code_spans(text: str) -> list[str]:
    """What the text quotes in backticks, pairing them left to right (the words between
    two quotes are not a quote)."""
    return [t.strip() for t in re.findall(r"`([^`\n]+)`", text)]


def _commands(text: str) -> list[str]:
    """Commands the next step quotes in backticks (``mise run test``): quoted words with a
    space between them; a chain (``mise run fmt && mise run lint``) is run one part per
    call as often as in one, so each part is a target of its own."""
    return [
        part.strip()
        for span in _code_spans(text)
        if " " in span
        for part in re.split(r"&&|\|\||;", span)
        if " " in part.strip()
    ]


def _is_test_name(target: str) -> bool:
    return bool(re.fullmatch(r"(?:test_\w+|Test\w+)", target))


def _identifiers(text: str) -> list[str]:
    """Code identifiers the next step quotes in backticks (``parse_date``, ``Config.load``,
    ``logging.Init(sessionID)`` names ``logging.Init``)."""
    found = []
    for span in _code_spans(text):
        match = re.fullmatch(r"([A-Za-z_][\w.]*)(?:\(.*\))?", span)
        if match and not paths_in(match.group(1)):
            found.append(match.group(1))
    return found


def _last_mention(messages, value: str) -> MessageEvent | None:
    for msg in reversed(messages):
        if value in msg.content or any(value in c.arguments for c in msg.tool_calls):
            return msg
    return None


def _evidence(msg: MessageEvent, needle: str) -> Evidence:
    """A quote around ``needle`` in the message (its content, else its tool calls)."""
    text = (
        msg.content
        if needle in msg.content
        else " ".join(c.arguments for c in msg.tool_calls) or msg.content
    )
    at = max(text.find(needle), 0)
    start = max(at - _QUOTE_CHARS // 2, 0)
    return Evidence(message_id=msg.id, quote=text[start : start + _QUOTE_CHARS])


def _finding(rollout, view: CallView, type_, verdict, rationale, evidence, omitted=()) -> Finding:
    return Finding(
        rollout_id=rollout.rollout_id,
        call_index=view.index,
        type=type_,
        verdict=verdict,
        rationale=rationale,
        evidence=list(evidence),
        omitted=list(omitted),
        judge_model=RULE_JUDGE,
    )


def _short(text: str | None, limit: int = 120) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
