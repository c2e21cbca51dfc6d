"""Hypothesis strategies: random but well-formed canonical rollouts.

They mix everything the segmenter must handle — tool calls, reasoning, budget
compactions with a summary call and ``system ⊕ resume ⊕ last k steps``, context edits
that drop observations (dropping the newest one keeps the token prefix), rewrites that
keep the whole context and append a note (prefix kept), logged token ids (some with a non-canonical tokenization of
the output, so the next prompt re-tokenizes it differently) — and come with an oracle
for what each call generated, written from the template's rules, not from seam's code.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from schemas.rollout import Keep, MessageEvent, RewriteEvent, Rollout, ToolCall

# NFC-stable characters (the tokenizer normalizes to NFC), no '|' so no text spells a special token.
ALPHABET = st.sampled_from(
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789 _-.,:;()[]{}<>=+*/'\"\n\té中文🙂")
)
TEXT = st.text(ALPHABET, min_size=0, max_size=40)
WORDS = st.text(ALPHABET, min_size=1, max_size=40)
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("grep", "read", "edit")
]


def oracle_output(msg: MessageEvent) -> str:
    """What the chatml-tools template says the policy generated for ``msg`` (eos included)."""
    text = f"<think>\n{msg.reasoning}\n</think>\n\n" if msg.reasoning else ""
    text += msg.content
    for i, call in enumerate(msg.tool_calls):
        if msg.content or i:
            text += "\n"
        args = json.loads(call.arguments)
        text += (
            '<tool_call>\n{"name": "'
            + call.name
            + '", "arguments": '
            + json.dumps(args, ensure_ascii=False)
            + "}\n</tool_call>"
        )
    return text + "<|im_end|>"


@st.composite
def rollouts(draw, task_id: str = "t", rollout_id: str = "r") -> Rollout:
    ids = iter(range(10_000))
    nid = lambda p: f"{p}{next(ids)}"  # noqa: E731
    system = MessageEvent(id=nid("m"), role="system", content=draw(WORDS))
    events: list = [system, MessageEvent(id=nid("m"), role="user", content=draw(WORDS))]
    live: list[MessageEvent] = list(events)
    steps: list[list[MessageEvent]] = []
    compactions = 0
    for _ in range(draw(st.integers(1, 7))):
        op = draw(st.sampled_from(["step", "step", "step", "compact", "edit", "note"]))
        if op == "compact" and compactions < 3 and steps:
            compactions += 1
            q = MessageEvent(id=nid("m"), role="user", content="Summarize the work so far.")
            summary = MessageEvent(
                id=nid("m"), role="assistant", kind="summary", content=draw(WORDS)
            )
            events += [q, summary]
            keep_k = draw(st.integers(0, 2))
            kept = [m for step in steps[len(steps) - keep_k :] for m in step] if keep_k else []
            resume = MessageEvent(
                id=nid("m"), role="user", content="Resume from this summary:\n" + summary.content
            )
            context = [Keep(id=system.id), resume] + [Keep(id=m.id) for m in kept if m in live]
            events.append(
                RewriteEvent(id=nid("w"), reason="compaction", trigger="budget", context=context)
            )
            live = [system, resume] + [m for m in kept if m in live]
            continue
        if op == "edit" and any(m.role == "tool" for m in live):
            dropped = draw(st.sampled_from([m.id for m in live if m.role == "tool"]))
            live = [m for m in live if m.id != dropped]
            events.append(
                RewriteEvent(
                    id=nid("w"),
                    reason="edit",
                    trigger="model",
                    context=[Keep(id=m.id) for m in live],
                )
            )
            continue
        if op == "note":
            # A rewrite that keeps the whole live context and appends a user note: the
            # token prefix is unchanged, so it must not be a seam.
            note = MessageEvent(id=nid("m"), role="user", content=draw(WORDS))
            events.append(
                RewriteEvent(
                    id=nid("w"),
                    reason="edit",
                    trigger="model",
                    context=[Keep(id=m.id) for m in live] + [note],
                )
            )
            live.append(note)
            continue
        n_calls = draw(st.integers(0, 2))
        calls = [
            ToolCall(
                id=nid("c"),
                name=draw(st.sampled_from(["grep", "read", "edit"])),
                arguments=json.dumps({"arg": draw(TEXT)}, ensure_ascii=False),
            )
            for _ in range(n_calls)
        ]
        action = MessageEvent(
            id=nid("m"),
            role="assistant",
            content=draw(TEXT),
            tool_calls=calls,
            reasoning=draw(st.one_of(st.none(), WORDS)),
        )
        results = [
            MessageEvent(
                id=nid("m"), role="tool", tool_call_id=c.id, name=c.name, content=draw(TEXT)
            )
            for c in calls
        ]
        step = [action] + results
        events += step
        live += step
        steps.append(step)
    if not any(isinstance(e, MessageEvent) and e.role == "assistant" for e in events):
        final = MessageEvent(id=nid("m"), role="assistant", content=draw(WORDS))
        events.append(final)
    reward = float(draw(st.integers(0, 1)))
    return Rollout(
        rollout_id=rollout_id,
        task_id=task_id,
        source="hypothesis",
        tools=TOOLS,
        events=events,
        reward=reward,
    )


def log_token_ids(rollout: Rollout, renderer, mode: str, split_at: int) -> Rollout:
    """Add engine-logged ids: ``mode`` is 'full' (prompt + output), 'output' (output
    only) or 'noncanonical' (full, with each output tokenized in two parts at
    ``split_at`` characters: valid ids, same text, not what re-tokenization gives)."""
    from schemas.replay import replay

    rollout = rollout.model_copy(deep=True)
    for call in replay(rollout):
        prompt, output = renderer.engine_view(list(call.context), call.message, rollout.tools)
        if mode == "noncanonical":
            text = renderer.decode(output[:-1])
            cut = min(split_at, len(text))
            output = (
                renderer.encode(text[:cut]).tolist()
                + renderer.encode(text[cut:]).tolist()
                + [output[-1]]
            )
        call.message.output_ids = output
        call.message.logprobs = [-0.25] * len(output)
        if mode != "output":
            call.message.prompt_ids = prompt
    return rollout
