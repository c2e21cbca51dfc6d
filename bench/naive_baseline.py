"""The common way to build multi-turn masks, for comparison: per-prefix rendering.

At every assistant turn i, render ``messages[:i]`` with the generation prompt and
``messages[:i+1]`` with ``apply_chat_template``, tokenize both, and take the difference
as the assistant's tokens. Each turn re-renders and re-tokenizes the whole prefix, so a
rollout of n calls costs O(n²) — the baseline seam's incremental rendering is measured
against. It handles append-only rollouts only (it has no notion of seams).
"""

from __future__ import annotations

from pipeline.core.render import template_message
from schemas.rollout import MessageEvent, Rollout


def naive_masks(rollout: Rollout, tokenizer) -> tuple[list[int], list[int]]:
    messages = [template_message(e) for e in rollout.events if isinstance(e, MessageEvent)]
    tools = rollout.tools or None
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt_text = tokenizer.apply_chat_template(
            messages[:i], tools=tools, add_generation_prompt=True, tokenize=False
        )
        full_text = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
        prompt = tokenizer.encode(prompt_text, add_special_tokens=False)
        full = tokenizer.encode(full_text, add_special_tokens=False)
        turn = full[len(prompt) :]
        end = turn.index(eos) + 1 if eos in turn else len(turn)
        mask = mask + [0] * (len(prompt) - len(mask)) + [1] * end
        ids = prompt + turn[:end]
    return ids, mask
