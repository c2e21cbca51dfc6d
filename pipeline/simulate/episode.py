"""One rollout being written: its events, its live context, and its policy calls.

``Episode`` is the only place events are created, so every invariant the canonical
schema checks holds by construction: ids are unique (``m1, m2, …`` and ``call_1, …``),
every tool call is answered by the next messages (only a final ``submit`` stays
unanswered), and a rewrite keeps only messages that are live. Each call is logged the
way the rollout's engine logs (full prompt + output ids, output ids only, or nothing).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from pipeline.simulate.context import Engine, LiveContext, log_call
from pipeline.simulate.state import Step, ToolUse
from schemas.correction import Correction
from schemas.rollout import Keep, MessageEvent, RewriteEvent, ToolCall


@dataclass(frozen=True)
class Config:
    """Per-rollout choices, drawn from the rollout's generator."""

    strategy: str  # budget | auto | memact | truncate | none
    budget: int  # C: context budget in tokens
    threshold: int  # T_comp: compact when C - |h| < T_comp
    logging: str  # full | output | none
    drift: bool  # some logged outputs use a non-canonical tokenization
    reasoning: bool
    n_steps: int
    corrected: bool  # a judge reviewed this rollout (AutoCompact rollouts only)
    auto_fraction: float  # AutoCompact: the policy compacts once |h| >= auto_fraction * C
    ramble_end: bool  # the last call is cut by max tokens (finish_reason="length")


@dataclass
class LiveStep:
    """An executed action step in the live context: its message ids and what it did."""

    ids: list[str]
    action: str
    number: int


@dataclass
class Episode:
    engine: Engine
    tools: list[dict]
    cfg: Config
    rng: random.Random
    rollout_id: str
    events: list = field(default_factory=list)
    steps: list[LiveStep] = field(default_factory=list)
    corrections: list[Correction] = field(default_factory=list)
    compactions: int = 0
    drifted_calls: int = 0
    calls: int = 0
    ended: bool = False
    pending_correction: str | None = None  # judged rollouts: the correction planned for this window
    draw_next: bool = True  # judged rollouts: draw the next window's correction
    held_correction: Correction | None = (
        None  # a too-early trigger correction, kept once compaction happens
    )
    _next_id: int = 0
    _next_call: int = 0
    _steps_done: int = 0

    def __post_init__(self) -> None:
        self.ctx = LiveContext(self.engine, self.tools)

    def new_id(self) -> str:
        self._next_id += 1
        return f"m{self._next_id}"

    def message(self, role: str, content: str, **fields) -> MessageEvent:
        return MessageEvent(id=self.new_id(), role=role, content=content, **fields)

    def append(self, role: str, content: str, **fields) -> MessageEvent:
        msg = self.message(role, content, **fields)
        self.ctx.append(msg)
        self.events.append(msg)
        return msg

    def tool_calls(self, uses: list[ToolUse]) -> list[ToolCall]:
        out = []
        for use in uses:
            self._next_call += 1
            out.append(
                ToolCall(
                    id=f"call_{self._next_call}",
                    name=use.name,
                    arguments=json.dumps(use.args, ensure_ascii=False),
                )
            )
        return out

    def draft(self, step: Step, kind: str = "action") -> MessageEvent:
        """The assistant message for ``step`` (not appended: proposals are drafts too)."""
        finish = (
            "length" if not step.uses and step.final else ("tool_calls" if step.uses else "stop")
        )
        return self.message(
            "assistant",
            step.content,
            reasoning=step.reasoning or None,
            tool_calls=self.tool_calls(step.uses),
            kind=kind,
            finish_reason=finish,
        )

    def call(self, msg: MessageEvent) -> int:
        """Append a policy call, logging what the engine saw; returns its call index."""
        prompt = self.ctx.prompt_ids() if self.cfg.logging == "full" else None
        self.ctx.append(msg)
        self.events.append(msg)
        if self.cfg.logging != "none":
            drift = self.cfg.drift and self.rng.random() < 0.3
            self.drifted_calls += log_call(self.ctx, msg, prompt, self.rng, drift)
        self.calls += 1
        return self.calls - 1

    def answer(self, msg: MessageEvent, uses: list[ToolUse]) -> list[str]:
        """Tool results for the calls of ``msg``; returns their message ids."""
        ids = []
        for call, use in zip(msg.tool_calls, uses):
            if use.result is not None:
                ids.append(self.append("tool", use.result, tool_call_id=call.id, name=use.name).id)
        return ids

    def run(
        self, step: Step, msg: MessageEvent | None = None
    ) -> tuple[int, MessageEvent, list[str]]:
        """Execute an action step: the call, its tool results, a live step record."""
        msg = msg or self.draft(step)
        index = self.call(msg)
        ids = self.answer(msg, step.uses)
        self._steps_done += 1
        self.steps.append(LiveStep([msg.id] + ids, step.action or step.intent, self._steps_done))
        return index, msg, ids

    def rewrite(self, reason: str, trigger: str, items: list, meta: dict) -> None:
        """Replace the live context: ``items`` are live message ids (kept) or new messages."""
        live = {m.id: m for m in self.ctx.messages}
        context, new_live = [], []
        for item in items:
            if isinstance(item, str):
                context.append(Keep(id=item))
                new_live.append(live[item])
            else:
                context.append(item)
                new_live.append(item)
        self.events.append(
            RewriteEvent(
                id=self.new_id(), reason=reason, trigger=trigger, context=context, meta=meta
            )
        )
        self.ctx.replace(new_live)
        kept = {m.id for m in new_live}
        self.steps = [s for s in self.steps if s.ids[0] in kept]
