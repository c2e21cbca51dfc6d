"""Benchmark inputs, derived from simulated rollouts (``seam simulate``).

- ``text_only``: the same rollouts without any logged token ids (the build must render
  and tokenize everything);
- ``append_only``: rollouts of exactly N calls and no rewrite, stitched from simulated
  message events (realistic tool outputs, code and tracebacks), for the per-prefix
  baseline whose cost grows with N²;
- ``token_logged``: every call carries the prompt and output ids an engine would log
  (the token-in/token-out path);
- ``replicated``: k copies with fresh ids, for the scaling ratio.
"""

from __future__ import annotations

from pipeline.core.render import ChatRenderer
from schemas.replay import replay
from schemas.rollout import MessageEvent, Rollout


def text_only(rollouts: list[Rollout]) -> list[Rollout]:
    out = []
    for r in rollouts:
        r = r.model_copy(deep=True)
        for e in r.events:
            if isinstance(e, MessageEvent) and e.role == "assistant":
                e.prompt_ids = e.output_ids = e.logprobs = None
        out.append(r)
    return out


def append_only(rollouts: list[Rollout], calls: int, count: int) -> list[Rollout]:
    """``count`` rollouts of exactly ``calls`` calls: system + task, then whole steps
    (assistant message and its tool results) taken in order from the source rollouts."""
    steps: list[list[MessageEvent]] = []
    for r in text_only(rollouts):
        events = [e for e in r.events if isinstance(e, MessageEvent)]
        current: list[MessageEvent] = []
        for e in events:
            if e.role == "assistant":
                if current:
                    steps.append(current)
                current = [e]
            elif e.role == "tool" and current:
                current.append(e)
        if current:
            steps.append(current)
    steps = [s for s in steps if {c.id for c in s[0].tool_calls} == {m.tool_call_id for m in s[1:]}]
    head = [e for e in text_only(rollouts[:1])[0].events if isinstance(e, MessageEvent)][:2]
    out, cursor = [], 0
    for n in range(count):
        events = [m.model_copy(update={"id": f"{n}-{m.id}"}) for m in head]
        for _ in range(calls):
            step = steps[cursor % len(steps)]
            cursor += 1
            for m in step:
                update = {"id": f"{n}-{cursor}-{m.id}"}
                if m.tool_call_id:
                    update["tool_call_id"] = f"{n}-{cursor}-{m.tool_call_id}"
                if m.tool_calls:
                    update["tool_calls"] = [
                        c.model_copy(update={"id": f"{n}-{cursor}-{c.id}"}) for c in m.tool_calls
                    ]
                events.append(m.model_copy(update=update))
        out.append(
            Rollout(
                rollout_id=f"append-{calls}-{n}",
                task_id=f"append-{n // 4}",
                source="bench",
                tools=rollouts[0].tools,
                events=events,
                reward=float(n % 2),
            )
        )
    return out


def token_logged(rollouts: list[Rollout], renderer: ChatRenderer) -> list[Rollout]:
    out = []
    for r in text_only(rollouts):
        for call in replay(r):
            prompt, output = renderer.engine_view(list(call.context), call.message, r.tools or None)
            call.message.prompt_ids, call.message.output_ids = prompt, output
            call.message.logprobs = [-0.1] * len(output)
        out.append(r)
    return out


def replicated(rollouts: list[Rollout], copies: int) -> list[Rollout]:
    return [
        r.model_copy(update={"rollout_id": f"{r.rollout_id}~{k}", "task_id": f"{r.task_id}~{k}"})
        for k in range(copies)
        for r in rollouts
    ]
