"""The live context of a rollout being generated: exact token counts and engine logs.

Every message is rendered with the chat template and tokenized **once**, as its piece
(see ``pipeline/core/render.py``); the input of the next call is the concatenation of the
live pieces plus the generation prompt. That makes ``|h|`` for the CompactionRL budget
test an exact token count at O(1) per call, and it is exactly what an inference engine
logs as ``prompt_ids`` (a test checks it against ``ChatRenderer.engine_view``).

Sampled outputs can be logged with a *non-canonical* tokenization: the same text split
inside a word and encoded as two parts. The ids differ, the text does not — and the
next call's ``prompt_ids`` still carry the canonical ids, as a server that re-tokenizes
its history would. That is re-tokenization drift.
"""

from __future__ import annotations

import random
import re

import numpy as np
import orjson

from pipeline.core.render import ChatRenderer, template_message
from schemas.rollout import MessageEvent

_WORD = re.compile(r"[A-Za-z]{5,}")
# Rollouts of one group read the same files and see the same test output: a process-wide
# cache of rendered, tokenized pieces (keyed by the template message) saves most of the
# rendering and tokenization. It only affects speed, never the output.
_PIECE_CACHE: dict[bytes, tuple[np.ndarray, str | None, int]] = {}
_PIECE_CACHE_MAX = 40_000


class Engine:
    """The renderer plus the fastest encoder that gives its tokenizer's ids (one per process)."""

    def __init__(self, renderer: ChatRenderer):
        from pipeline.simulate.fastenc import make_encoder

        self.renderer = renderer
        self.encode_many = make_encoder(renderer)


class LiveContext:
    def __init__(self, engine: Engine, tools: list[dict]):
        self.r = engine.renderer
        self.encode_many = engine.encode_many
        self.tools = tools
        self.gen_text = self.r.generation_prompt()
        self.gen_ids = self.encode_many([self.gen_text])[0]
        self.messages: list[MessageEvent] = []
        self.pieces: dict[str, np.ndarray] = {}
        self.outputs: dict[
            str, str
        ] = {}  # assistant message id -> generated text (end-of-turn included)
        self.output_len: dict[str, int] = {}
        self.specials = [t for t in self.r.tokenizer.all_special_tokens if t]
        self.total = 0

    def piece_ids(self, msg: MessageEvent, first: bool) -> np.ndarray:
        """Token ids ``msg`` contributes when rendered (cached per message)."""
        if msg.id in self.pieces:
            return self.pieces[msg.id]
        as_dict = template_message(msg)
        key = orjson.dumps([first, as_dict, self.tools if first else None])
        hit = _PIECE_CACHE.get(key)
        if hit is None:
            hit = self._render(as_dict, first)
            if len(_PIECE_CACHE) >= _PIECE_CACHE_MAX:
                _PIECE_CACHE.clear()
            _PIECE_CACHE[key] = hit
        ids, generated, out_len = hit
        if generated is not None:
            self.outputs[msg.id] = generated
            self.output_len[msg.id] = out_len
        self.pieces[msg.id] = ids
        return ids

    def _render(self, as_dict: dict, first: bool) -> tuple[np.ndarray, str | None, int]:
        text = self.r.piece(as_dict, first, self.tools)
        if as_dict["role"] != "assistant":
            return self.encode_many([text])[0], None, 0
        generated, trailer = self.r.split_output(text[len(self.gen_text) :])
        out, tail = self.encode_many([generated, trailer])
        return np.concatenate([self.gen_ids, out, tail]), generated, len(out)

    def append(self, msg: MessageEvent) -> None:
        self.total += len(self.piece_ids(msg, not self.messages))
        self.messages.append(msg)

    def replace(self, messages: list[MessageEvent]) -> None:
        self.messages = []
        self.total = 0
        for msg in messages:
            self.append(msg)

    def tokens(self) -> int:
        """|h|: the length of the next call's input (live context + generation prompt)."""
        return self.total + len(self.gen_ids)

    def tokens_of(self, messages: list[MessageEvent]) -> int:
        return sum(len(self.piece_ids(m, False)) for m in messages)

    def prompt_ids(self) -> list[int]:
        return np.concatenate([self.pieces[m.id] for m in self.messages] + [self.gen_ids]).tolist()

    def output_ids(self, msg: MessageEvent) -> np.ndarray:
        """Canonical ids of a call's generated text (the call must have been appended)."""
        start = len(self.gen_ids)
        return self.pieces[msg.id][start : start + self.output_len[msg.id]]


def log_call(
    ctx: LiveContext, msg: MessageEvent, prompt: list[int] | None, rng: random.Random, drift: bool
) -> bool:
    """Attach what the engine logged for ``msg`` (already appended); True when the
    logged output ids are a non-canonical tokenization of the text."""
    ids = ctx.output_ids(msg)
    text = ctx.outputs[msg.id]
    if msg.finish_reason == "length":  # cut by max tokens: the end-of-turn token was never sampled
        ids, text = ids[:-1], text[: -len(ctx.r.eos_text)]
    logged = _noncanonical(ctx, text, ids, rng) if drift else None
    drifted = logged is not None
    output_ids = logged if logged is not None else ids.tolist()
    msg.output_ids = output_ids
    msg.logprobs = _logprobs(len(output_ids), rng)
    msg.prompt_ids = prompt
    return drifted


def _noncanonical(
    ctx: LiveContext, text: str, canonical: np.ndarray, rng: random.Random
) -> list[int] | None:
    """The text encoded as two parts split inside a word (never inside a special token),
    if that changes the ids; None when no tried split does."""
    special = [
        (m.start(), m.end()) for tok in ctx.specials for m in re.finditer(re.escape(tok), text)
    ]
    words = [
        m
        for m in _WORD.finditer(text)
        if not any(a < m.end() and m.start() < b for a, b in special)
    ]
    for match in rng.sample(words, min(4, len(words))):
        cut = rng.randint(match.start() + 1, match.end() - 1)
        left, right = ctx.encode_many([text[:cut], text[cut:]])
        ids = np.concatenate([left, right])
        if not np.array_equal(ids, canonical):
            return ids.tolist()
    return None


def _logprobs(n: int, rng: random.Random) -> list[float]:
    """Plausible sampling log-probabilities: mostly near zero, a few uncertain tokens."""
    out = []
    for _ in range(n):
        x = rng.expovariate(9.0) if rng.random() < 0.88 else rng.uniform(0.3, 5.0)
        out.append(-round(x + 1e-4, 4))
    return out
