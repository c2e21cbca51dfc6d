"""How a rollout manages its context: the papers' strategies, run before each action.

- ``budget`` (CompactionRL): when ``C - |h| < T_comp`` the harness asks ``Q_SUM``, the
  policy writes a summary (a call, ``kind="summary"``), and the context is rebuilt as
  system ⊕ resume(summary) ⊕ the last k = 2 steps — fewer when they do not fit: the
  kept steps get at most ``T_comp`` tokens and the rebuilt context at most ``C - T_comp``
  (so it never re-triggers at once); a step (action + its results) is never cut. At
  most 3 compactions; when the budget runs out again the last call is cut by the
  length limit.
- ``auto`` (AutoCompact): the policy itself calls ``compact()`` once the context passes
  its own threshold, writing a ``# Auto Context Summary`` working state; the context
  becomes system ⊕ task ⊕ working state (``trigger="model"``). Judge corrections are
  made here, in the rollouts a judge reviewed.
- ``memact`` (MemAct): the policy prunes stale steps with ``prune_context`` and leaves a
  note in their place (``reason="edit"``); the harness truncates if that is not enough.
- ``truncate``: the harness drops the oldest steps (``reason="truncation"``).
"""

from __future__ import annotations

from pipeline.simulate import corrections as corr
from pipeline.simulate.agent import Agent
from pipeline.simulate.episode import Episode
from pipeline.simulate.state import Step, ToolUse
from pipeline.simulate.summaries import (
    AUTO_PREFIX,
    Q_SUM,
    RESUME_PREFIX,
    RESUME_SUFFIX,
    draw_defects,
    write_summary,
)

MAX_COMPACTIONS = 3
KEEP_LAST_STEPS = 2


def budget_due(ep: Episode) -> bool:
    return ep.cfg.budget - ep.ctx.tokens() < ep.cfg.threshold


def before_action(ep: Episode, agent: Agent) -> None:
    """Apply the rollout's strategy; may end the episode when the budget is exhausted."""
    s = ep.cfg.strategy
    if s == "budget" and budget_due(ep):
        if ep.compactions < MAX_COMPACTIONS:
            budget_compaction(ep, agent)
        else:
            ep.ended = True
    elif (
        s == "auto"
        and ep.compactions < MAX_COMPACTIONS
        and (ep.ctx.tokens() >= ep.cfg.auto_fraction * ep.cfg.budget or budget_due(ep))
    ):
        auto_compaction(ep, agent)
    elif s == "memact" and ep.ctx.tokens() > 0.45 * ep.cfg.budget and len(ep.steps) > 10:
        memact_edit(ep)
    if s != "budget" and budget_due(ep) and len(ep.steps) > KEEP_LAST_STEPS:
        truncate(ep)


def _summary(ep: Episode, agent: Agent, auto: bool, defects: list[str]):
    t = agent.task
    return write_summary(t, agent.state, agent.workspace[t.module_path], ep.rng, defects, auto)


def _meta(summary) -> dict:
    meta = {}
    if summary.defects:
        meta["sim_defects"] = summary.defects
    if summary.omitted:
        meta["sim_omitted"] = [{"kind": k, "value": v} for k, v in summary.omitted]
    if summary.invented:
        meta["sim_invented"] = summary.invented
    return meta


def budget_compaction(ep: Episode, agent: Agent) -> None:
    h = ep.ctx.tokens()
    ep.append("user", Q_SUM)
    summary = _summary(ep, agent, False, draw_defects(ep.rng, clean=False))
    ep.call(
        ep.message(
            "assistant", summary.text, kind="summary", finish_reason="stop", meta=_meta(summary)
        )
    )
    resume = ep.message("user", RESUME_PREFIX + summary.text + RESUME_SUFFIX)
    system = ep.ctx.messages[0]
    limit = ep.cfg.budget - ep.cfg.threshold
    base = ep.ctx.tokens_of([system, resume]) + len(ep.ctx.gen_ids)
    live = {m.id: m for m in ep.ctx.messages}
    for k in range(KEEP_LAST_STEPS, -1, -1):
        kept = ep.steps[len(ep.steps) - k :] if k else []
        ids = [i for s in kept for i in s.ids]
        steps_tokens = ep.ctx.tokens_of([live[i] for i in ids])
        if steps_tokens <= ep.cfg.threshold and base + steps_tokens <= limit:
            break
    ep.rewrite(
        "compaction",
        "budget",
        [system.id, resume, *ids],
        {
            "tokens_before": h,
            "budget": ep.cfg.budget,
            "threshold": ep.cfg.threshold,
            "kept_steps": len(kept),
        },
    )
    ep.compactions += 1
    agent.after_compaction(redo=ep.rng.random() < 0.08, reread=ep.rng.random() < 0.12)


def auto_compaction(ep: Episode, agent: Agent) -> None:
    """The policy calls ``compact()``; in judged rollouts the judge may have corrected
    this call (``state`` or ``trigger``) or the next action (``continuation``)."""
    h = ep.ctx.tokens()
    pending = ep.pending_correction
    clean = ep.cfg.corrected
    summary = _summary(ep, agent, True, draw_defects(ep.rng, clean=clean))
    step = Step(
        "compact",
        summary.text,
        "",
        [ToolUse("compact", {}, f"Working state saved ({h} tokens of history).")],
    )
    msg = ep.draft(step, kind="summary")
    msg.meta = _meta(summary)
    original = None
    if pending == "state":
        defect = corr.draw_state_defect(ep.rng)
        bad = _summary(ep, agent, True, [defect])
        if bad.defects:
            original = (ep.draft(Step("compact", bad.text, "", step.uses), kind="summary"), bad)
    elif pending in ("trigger:missing_trigger", "trigger:too_late"):
        original = (ep.draft(agent.propose("redo")), None)
    index = ep.call(msg)
    ep.answer(msg, step.uses)
    if original is not None:
        _keep(ep, _record(ep, agent, index, pending, original[0], msg, original[1]))
    if (
        ep.held_correction is not None
    ):  # a too-early proposal counts once the compaction it anticipated happens
        _keep(ep, ep.held_correction)
        ep.held_correction = None
    task_msg = next(m for m in ep.ctx.messages if m.role == "user")
    resume = ep.message("user", AUTO_PREFIX + summary.text)
    ep.rewrite(
        "compaction",
        "model",
        [ep.ctx.messages[0].id, task_msg.id, resume],
        {"tokens_before": h, "budget": ep.cfg.budget},
    )
    ep.compactions += 1
    ep.pending_correction = "continuation:now" if pending == "continuation" else None
    ep.draw_next = True
    follow = clean or ep.rng.random() < 0.8
    agent.after_compaction(redo=not follow and ep.rng.random() < 0.5, reread=not follow)


def _keep(ep: Episode, record) -> None:
    if record is not None:
        ep.corrections.append(record)


def _record(
    ep: Episode, agent: Agent, index: int, pending: str | None, original, executed, bad=None
):
    kind, _, verdict = (pending or "").partition(":")
    facts = agent.state.facts
    evidence = [
        (f.message_id, f.quote) for key, f in facts.items() if key in ("definition", "error")
    ]
    omitted, detail = [], ""
    if kind == "state":
        verdict = corr.VERDICT_OF_DEFECT[bad.defects[-1]]
        omitted = list(bad.omitted)
        detail = (
            "it says an error remains but its next step is to submit"
            if "wrong_state" not in bad.defects
            else "a test that was only added is recorded as passing"
        )
        if verdict == "invented":
            omitted, detail = [], ", ".join(bad.invented)
    return corr.make(
        ep.rollout_id, index, kind, verdict, original, executed, evidence, omitted, detail
    )


def judged_action(ep: Episode, agent: Agent) -> None:
    """The next action in a judged rollout, with a ``too_early`` or ``continuation``
    correction when one is pending here."""
    if ep.pending_correction is None and ep.draw_next:
        ep.draw_next = False
        if ep.rng.random() < 0.9:
            ep.pending_correction = corr.draw_type(ep.rng)
    pending = ep.pending_correction
    original = None
    if (
        pending == "trigger:too_early"
        and ep.ctx.tokens() >= 0.6 * ep.cfg.auto_fraction * ep.cfg.budget
    ):
        early = _summary(ep, agent, True, [])
        original = ep.draft(
            Step("compact", early.text, "", [ToolUse("compact", {}, "")]), kind="summary"
        )
        ep.pending_correction = "trigger:held"
    elif pending == "continuation:now":
        kind = ep.rng.choice(["redo", "drift", "skip"])
        original = ep.draft(agent.propose(kind))
        pending = (
            "continuation:" + {"redo": "redo", "drift": "drift", "skip": "ignored_next_step"}[kind]
        )
        ep.pending_correction = None
    step = agent.next_step()
    index, msg, ids = ep.run(step)
    agent.commit(step, ids)
    if original is None:
        return
    record = _record(ep, agent, index, pending, original, msg)
    if pending == "trigger:too_early":
        ep.held_correction = record
    else:
        _keep(ep, record)


def memact_edit(ep: Episode) -> None:
    """Prune the oldest steps but the last three; a note replaces them."""
    old = ep.steps[:-3]
    dropped = old if len(old) <= 3 else [s for s in old if ep.rng.random() < 0.8] or old[:1]
    note = (
        "Pruned steps "
        + ", ".join(str(s.number) for s in dropped)
        + ": "
        + " ".join(s.action for s in dropped)
    )
    args = {"steps": [s.number for s in dropped], "note": note}
    ids = {i for s in dropped for i in s.ids}
    live = {m.id: m for m in ep.ctx.messages}
    freed = ep.ctx.tokens_of([live[i] for i in ids])
    step = Step(
        "prune",
        "Dropping stale outputs to keep the context focused.",
        "",
        [
            ToolUse(
                "prune_context",
                args,
                f"Removed {len(ids)} messages ({freed} tokens) from the context.",
            )
        ],
        action=f"Pruned {len(dropped)} stale steps.",
    )
    ep.run(step)
    note_msg = ep.message("user", "[memory] " + note)
    items: list = []
    for m in ep.ctx.messages:
        if m.id in ids:
            if note_msg not in items:
                items.append(note_msg)
            continue
        items.append(m.id)
    ep.rewrite("edit", "model", items, {"dropped_steps": len(dropped), "tokens_freed": freed})


def truncate(ep: Episode) -> None:
    """The harness drops the oldest steps until the context is at half the budget."""
    target = ep.cfg.budget // 2
    dropped, freed = [], 0
    live = {m.id: m for m in ep.ctx.messages}
    for s in ep.steps[:-KEEP_LAST_STEPS]:
        if ep.ctx.tokens() - freed <= target:
            break
        dropped.append(s)
        freed += ep.ctx.tokens_of([live[i] for i in s.ids])
    ids = {i for s in dropped for i in s.ids}
    marker = ep.message(
        "user",
        f"[Context truncated: {len(dropped)} earlier steps ({freed} tokens) were removed "
        f"to fit the {ep.cfg.budget}-token window.]",
    )
    keep = [m.id for m in ep.ctx.messages if m.id not in ids]
    at = 2 if len(keep) > 1 and live[keep[1]].role == "user" else 1
    ep.rewrite(
        "truncation",
        "budget",
        keep[:at] + [marker] + keep[at:],
        {"dropped_steps": len(dropped), "tokens_freed": freed},
    )
