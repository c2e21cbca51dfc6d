"""Render canonical messages with a chat template and tokenize them, once per message.

A call's input is ``render(context, add_generation_prompt=True)``; its output is the
text the template puts after the generation prompt for that assistant message, up to
and including the end-of-turn token. Rendering a call's whole context at every call is
quadratic in rollout length, so seam renders each message **once** as a *piece*:

    piece(m₀)            = render([m₀])
    piece(m), later m    = render(B + [m]) − render(B)        (B: a fixed two-message base)
    generation prompt    = render(B, gen=True) − render(B)

and a call's input is ``piece(m₀) + … + piece(m_k) + generation prompt``. That identity
holds for templates that render each message independently of its neighbours. It is
checked once per template by ``probe_incremental`` on a probe conversation, in text *and*
in token space; a template that fails (for example one that drops the reasoning of
earlier turns, or merges consecutive tool results into one turn) is rendered in full
at every call instead, and the build summary says so.

Templates run in a sandboxed Jinja environment (no access to Python internals) set up
like the one ``apply_chat_template`` uses (``pipeline/core/chat_jinja.py``; tests require
the same text as ``apply_chat_template``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import orjson

from pipeline.common.errors import SeamError
from pipeline.common.step_times import StepTimes
from pipeline.core.junctions import Junctions, Piece, sub
from pipeline.core.long_text import LONG_TEXT_CHARS, LongTextStats, ascii_twin, encode_long
from pipeline.core.text_reuse import REUSE_TEXT_CHARS, PieceReuse, cutter
from schemas.rollout import MessageEvent

if TYPE_CHECKING:
    from pipeline.core.render_shapes import ShapeRenderer

ENCODE_CACHE_TOKENS = 4 << 20  # ids kept by encode_many's cache (16 MiB of int32 per process)
# Characters tokenized per call into the Rust tokenizer. While a batch is encoded, its
# ``Encoding`` objects hold ~60 bytes per character (ids, token strings, offsets, masks)
# and the tokenizer ~130 at its peak; they are cut to int32 ids (4 bytes per token) as
# soon as the batch returns. One batch for a whole rollout made ten 5 MB tool outputs
# cost 3.3 GB at once; batches of at most this many characters (a longer text alone)
# bound the peak by the largest single message instead.
ENCODE_BATCH_CHARS = 1 << 20
FIRST_PIECES_KEPT = 256  # first pieces kept per process (a system prompt with tools: ~10-50 kB)
# Template globals whose value is not a function of the messages: the clock, random text.
IMPURE_GLOBALS = ("strftime_now", "lipsum")

_BASE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
]


class TemplateError(SeamError, ValueError):
    """The chat template cannot render a rollout's messages."""


def template_message(msg: MessageEvent) -> dict:
    """The Hugging Face chat-message dict a template expects for a canonical message.

    Tool-call arguments are passed as a mapping when they parse as a JSON object (what
    every Hub template expects); otherwise as the raw string the model wrote.
    """
    out: dict = {"role": msg.role, "content": msg.content}
    if msg.reasoning:
        out["reasoning_content"] = msg.reasoning
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call_arguments(call.arguments)},
            }
            for call in msg.tool_calls
        ]
    if msg.role == "tool":
        out["tool_call_id"] = msg.tool_call_id
        if msg.name:
            out["name"] = msg.name
    return out


def call_arguments(arguments: str) -> dict | str:
    """A tool call's arguments as a template sees them: the mapping they parse to when
    they are a JSON object, else the raw string the model wrote."""
    try:
        args = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    return args if isinstance(args, dict) else arguments


def _compile(source: str):
    from pipeline.core.chat_jinja import compile_chat_template

    return compile_chat_template(source)


class ChatRenderer:
    """Renders and tokenizes canonical messages for one tokenizer + chat template."""

    def __init__(self, tokenizer, full_render: bool = False, by_shape: bool = True):
        """``full_render`` skips the incremental path even when the probe would allow it
        (the reference the incremental path is tested against); ``by_shape=False`` renders
        every piece through Jinja (the reference ``render_shapes`` is tested against)."""
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer
        # Where renders and encodes count their seconds (steps ``render`` and ``tokenize``):
        # a build worker sets its task's ``StepTimes`` here while the task runs.
        self.times: StepTimes | None = None
        # False while a caller times a run of renders as one span (``_PieceCache.prefetch``).
        self.time_each_render = True
        self.template = _compile(tokenizer.chat_template)
        self._shapes: ShapeRenderer | None = None
        self._generation_prompt: str | None = None
        self._first_pieces: dict[str, str] = {}  # ``_first_piece``'s renders, by value
        self._keep_first_pieces = by_shape and not any(
            name in tokenizer.chat_template for name in IMPURE_GLOBALS
        )
        self._by_shape = by_shape
        self.special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        self.eos_text = self._end_of_turn_text()
        self.eos_id = tokenizer.convert_tokens_to_ids(self.eos_text)
        self._encode_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cached_tokens = 0
        self.long_texts = LongTextStats()  # texts encoded in pieces, and fallbacks
        # Where a piece filled in by shape may be encoded as its parts (``junctions.py``).
        self.junctions = Junctions.for_backend(self.backend)
        # The same tokenizer without its normalizer, for ASCII texts (``ascii_twin``).
        self.ascii_backend = ascii_twin(self.backend)
        # Stretches repeated inside texts, found by content-defined pieces (``text_reuse``).
        self._cut_pieces = cutter(self.backend)
        self.reuse = PieceReuse()
        self.incremental = not full_render and probe_incremental(self)

    def _end_of_turn_text(self) -> str:
        eos = self.tokenizer.eos_token
        # Chat templates end a turn with their own token (ChatML: <|im_end|>), which is
        # not always the tokenizer's eos: take what the template puts after an assistant turn.
        rendered = self.render(_BASE + [{"role": "assistant", "content": "X"}], None, False)
        tail = rendered[rendered.rindex("X") + 1 :]
        for token in sorted(self.tokenizer.all_special_tokens, key=len, reverse=True):
            if tail.lstrip().startswith(token):
                return token
        if eos:
            return eos
        raise TemplateError("cannot tell which token ends an assistant turn in this chat template")

    # -- text ---------------------------------------------------------------------------
    def render(
        self, messages: Sequence[dict], tools: list | None, add_generation_prompt: bool
    ) -> str:
        if self.times is not None and self.time_each_render:
            with self.times.step("render"):
                return self._render(messages, tools, add_generation_prompt)
        return self._render(messages, tools, add_generation_prompt)

    def _render(
        self, messages: Sequence[dict], tools: list | None, add_generation_prompt: bool
    ) -> str:
        from pipeline.core.chat_jinja import render_bounded

        try:
            return render_bounded(
                self.template,
                messages=list(messages),
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                **self.special,
            )
        except Exception as exc:  # jinja errors and raise_exception() from the template
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None

    @lru_cache(maxsize=64)  # noqa: B019 (renderers live for the whole process)
    def _base_text(self, gen: bool) -> str:
        return self.render(_BASE, None, gen)

    def generation_prompt(self) -> str:
        gen = self._generation_prompt
        if gen is None:  # asked for at every assistant message: kept
            gen = self._generation_prompt = self._base_text(True)[len(self._base_text(False)) :]
        return gen

    def piece(self, msg_dict: dict, first: bool, tools: list | None) -> str:
        """The text one message contributes to a rendered conversation.

        A later message whose shape the template renders without reading its texts is
        filled in from that shape's constants (``render_shapes.py``), not rendered again.
        """
        if first:
            return self._first_piece(msg_dict, tools)
        if self._by_shape:
            shapes = self._shapes or self._shape_renderer()
            text = self._timed(shapes.piece, msg_dict)
            if text is not None:
                return text
        return self._jinja_piece(msg_dict)

    def message_piece(self, msg: MessageEvent, tools: list | None) -> str:
        """``piece(template_message(msg), False, tools)``, by shape read off the message
        itself (``render_shapes.flatten_event``): the dict is made only for Jinja."""
        if self._by_shape:
            shapes = self._shapes or self._shape_renderer()
            text = self._timed(shapes.piece, msg)
            if text is not None:
                return text
        return self._jinja_piece(template_message(msg))

    def _timed(self, render, *args):
        """``render(*args)``, timed as ``render`` unless a caller times a run of renders."""
        if self.times is not None and self.time_each_render:
            with self.times.step("render"):
                return render(*args)
        return render(*args)

    def _jinja_piece(self, msg_dict: dict) -> str:
        base = self._base_text(False)
        full = self.render(_BASE + [msg_dict], None, False)
        if not full.startswith(base):
            raise TemplateError("chat template re-renders earlier messages when one is appended")
        return full[len(base) :]

    def _first_piece(self, msg_dict: dict, tools: list | None) -> str:
        """``render([msg_dict], tools)``, kept by value: the rollouts of one task open with
        the same system prompt and tool schemas, which Jinja rendered again for every
        rollout (the tools' JSON included). Kept for templates that read no clock and no
        random text (``strftime_now``, ``lipsum``), whose render is a function of the
        values alone; ``repr`` tells apart what a template prints apart (1, 1.0, True,
        nan; every character of a string)."""
        if not self._keep_first_pieces:
            return self.render([msg_dict], tools, False)
        key = repr((msg_dict, tools))
        text = self._first_pieces.get(key)
        if text is None:
            text = self.render([msg_dict], tools, False)
            if len(self._first_pieces) >= FIRST_PIECES_KEPT:
                del self._first_pieces[next(iter(self._first_pieces))]  # first in, first out
            self._first_pieces[key] = text
        return text

    def _shape_renderer(self) -> ShapeRenderer:
        from pipeline.core.render_shapes import ShapeRenderer  # jinja2 only when rendering

        variables = {"tools": None, "add_generation_prompt": False, **self.special}
        self._shapes = ShapeRenderer(
            self.tokenizer.chat_template, _BASE, self._base_text(False), variables
        )
        return self._shapes

    def split_output(self, assistant_text: str) -> tuple[str, str]:
        """Split what follows the generation prompt into (generated text, template trailer).

        The generated text ends with the end-of-turn token; what the template adds after
        it (ChatML's newline) was never sampled by the policy.
        """
        return self._split_output_at(assistant_text, 0)

    def _split_output_at(self, text: str, start: int) -> tuple[str, str]:
        """``split_output(text[start:])``, cutting a ``Piece`` once per half."""
        cut = text.rfind(self.eos_text, start)
        if cut < 0:
            return sub(text, start), ""
        cut += len(self.eos_text)
        return sub(text, start, cut), sub(text, cut)

    def message_output(self, msg: MessageEvent, tools: list | None) -> tuple[str, str]:
        """``output_text(template_message(msg), tools)`` on an incremental template, by
        shape read off the message itself (``render_shapes.flatten_event``)."""
        if self.incremental and self._by_shape:
            shapes = self._shapes or self._shape_renderer()
            pair = self._timed(shapes.output_pair, msg, self.generation_prompt(), self.eos_text)
            if pair is not None:
                return pair
        return self.output_text(template_message(msg), tools)

    def output_text(
        self, call: dict, tools: list | None, context: Sequence[dict] | None = None
    ) -> tuple[str, str]:
        """(generated text, trailer) of ``call``; ``context`` (its input) is needed only
        for templates that are not incremental."""
        if self.incremental:
            gen = self.generation_prompt()
            if self._by_shape:  # the shape's split, found once (``ShapeRenderer.output_pair``)
                shapes = self._shapes or self._shape_renderer()
                pair = self._timed(shapes.output_pair, call, gen, self.eos_text)
                if pair is not None:
                    return pair
            piece = self.piece(call, False, tools)
            if not piece.startswith(gen):
                raise TemplateError("assistant turn does not start with the generation prompt")
            return self._split_output_at(piece, len(gen))
        if not context:
            raise TemplateError("an assistant call with an empty context")
        prompt = self.render(context, tools, True)
        full = self.render(list(context) + [call], tools, False)
        if not full.startswith(prompt):
            raise TemplateError("rendering the call's output changes the rendering of its input")
        return self.split_output(full[len(prompt) :])

    # -- tokens -------------------------------------------------------------------------
    def encode_many(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text (special tokens in the text are parsed), batched in Rust:
        ``encode_units``' chunks of each text, joined."""
        return [c[0] if len(c) == 1 else np.concatenate(c) for c in self.encode_units(texts)]

    def encode_units(self, texts: Sequence[str]) -> list[list[np.ndarray]]:
        """Token ids of each text as consecutive chunks, whose join is the text's ids.

        A piece filled in by shape (``junctions.Piece``) is encoded as its units: the
        message's texts, and the template's text around them (cached), cut only where
        ``junctions.py`` proves the ids are the whole piece's. Its chunks are those units'
        ids, not joined: a segment joins all the chunks of its sequence once, and joining
        each piece's units here first copied every piece's ids twice.
        """
        junctions = self.junctions
        if junctions is None or not any(type(t) is Piece for t in texts):
            return [[ids] for ids in self._encode_texts(texts)]
        flat: list[str] = []
        counts: list[int] = []
        units = junctions.units
        # Cutting into units is part of tokenizing.
        with self.times.step("tokenize") if self.times is not None else nullcontext():
            for t in texts:
                if type(t) is Piece:
                    us = units(t)
                    flat += us
                    counts.append(len(us))
                else:
                    flat.append(t)
                    counts.append(1)
        ids = self._encode_texts(flat)
        out = []
        at = 0
        for n in counts:
            out.append(ids[at : at + n])
            at += n
        return out

    def _encode_texts(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, whole.

        Rollouts of one collection repeat long texts: the system prompt with its tool
        definitions, the compaction prompt, the same file read by every rollout of a task
        (23% of the characters the first 100 sample rollouts encode). Encoded texts are
        kept, first in first out, up to ``ENCODE_CACHE_TOKENS`` ids per process. Pieces
        are encoded independently of their neighbours (``probe_incremental``), so a
        cached piece has the ids it would get again.

        They repeat stretches inside texts too (a file read again after an edit): a
        text of ``REUSE_TEXT_CHARS`` or more that is not cached whole is cut into
        content-defined pieces at proven cuts (``text_reuse.py``); the pieces are looked
        up in the same cache, the missing ones encoded, and the text's ids joined.
        """
        cache = self._encode_cache
        # One lookup per text: a rendered text is a new string, so each lookup hashes it
        # and compares it with the cached key in full.
        found = list(map(cache.get, texts))
        todo = list(dict.fromkeys(t for t, ids in zip(texts, found) if ids is None))
        if not todo:
            return cast(list[np.ndarray], found)  # every text was cached
        cut = self._cut_pieces
        pieces: dict[str, list[str]] = {}
        if (
            cut is not None
            and any(len(t) >= REUSE_TEXT_CHARS for t in todo)
            and self.reuse.wanted()
        ):
            with self.times.step("tokenize") if self.times is not None else nullcontext():
                for t in todo:
                    if len(t) >= REUSE_TEXT_CHARS:
                        ps = cut(t)
                        if len(ps) > 1:
                            pieces[t] = ps
        if pieces:
            wanted = [t for t in todo if t not in pieces]
            wanted += [p for ps in pieces.values() for p in ps if p not in cache]
            wanted = list(dict.fromkeys(wanted))
        else:
            wanted = todo
        fresh = self._encode_fresh(wanted)
        if pieces:
            fresh.update(self._join_pieces(pieces, fresh))
        out = [fresh[t] if ids is None else ids for t, ids in zip(texts, found)]
        added = 0
        for t, ids in fresh.items():
            ids.setflags(write=False)  # shared by every later caller: never edited in place
            cache[t] = ids
            added += len(ids)
        self._cached_tokens += added
        while self._cached_tokens > ENCODE_CACHE_TOKENS:
            self._cached_tokens -= len(cache.popitem(last=False)[1])
        return out

    def _encode_fresh(self, todo: list[str]) -> dict[str, np.ndarray]:
        """The ids of each of ``todo`` (distinct texts), in batches of at most
        ``ENCODE_BATCH_CHARS`` characters."""
        fresh: dict[str, np.ndarray] = {}
        if sum(map(len, todo)) < ENCODE_BATCH_CHARS:  # one batch (most calls), no trim: not cut
            fresh.update(zip(todo, self._encode_batch(todo)))
        else:
            for batch in _batches(todo, ENCODE_BATCH_CHARS):
                fresh.update(zip(batch, self._encode_batch(batch)))
                if sum(map(len, batch)) >= ENCODE_BATCH_CHARS:
                    release_free_memory()
        return fresh

    def _join_pieces(
        self, pieces: dict[str, list[str]], fresh: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Each cut text's ids: its pieces' ids (fresh or cached), joined; the reuse's
        trip-wire compares some of them with the text encoded whole (``text_reuse.py``)."""
        cache = self._encode_cache
        reuse = self.reuse
        piece_chars = sum(len(p) for ps in pieces.values() for p in ps)
        encoded = sum(
            len(p) for p in dict.fromkeys(p for ps in pieces.values() for p in ps) if p in fresh
        )
        reuse.observe(piece_chars, encoded)
        joined: dict[str, np.ndarray] = {}
        for t, ps in pieces.items():
            joined[t] = np.concatenate([fresh[p] if p in fresh else cache[p] for p in ps])
            reuse.stats.cut += 1
            if reuse.check_now():
                reuse.stats.checked += 1
                whole = self._encode_batch([t])[0]
                if not np.array_equal(whole, joined[t]):
                    reuse.failed()
                    joined[t] = whole
        return joined

    def _encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of ``texts`` in one call into the Rust tokenizer (no cache)."""
        if self.times is not None:
            with self.times.step("tokenize"):
                return self._encode_uncached(texts)
        return self._encode_uncached(texts)

    def _encode_uncached(self, texts: list[str]) -> list[np.ndarray]:
        """A text over ``LONG_TEXT_CHARS`` is encoded alone, in pieces proven to give the
        same ids (``pipeline/core/long_text.py``); the others in one call. ASCII texts
        skip the normalizer (``long_text.ascii_twin``)."""
        twin = self.ascii_backend
        if twin is None:
            return self._encode_with(self.backend, texts)
        ascii = [t.isascii() for t in texts]
        if all(ascii):
            return self._encode_with(twin, texts)
        if not any(ascii):
            return self._encode_with(self.backend, texts)
        done = iter(self._encode_with(twin, [t for t, a in zip(texts, ascii) if a]))
        rest = iter(self._encode_with(self.backend, [t for t, a in zip(texts, ascii) if not a]))
        return [next(done) if a else next(rest) for a in ascii]

    def _encode_with(self, backend, texts: list[str]) -> list[np.ndarray]:
        if any(len(t) > LONG_TEXT_CHARS for t in texts):
            short = [t for t in texts if len(t) <= LONG_TEXT_CHARS]
            done = iter(self._encode_with(backend, short) if short else [])
            return [
                encode_long(backend, t, self.long_texts) if len(t) > LONG_TEXT_CHARS else next(done)
                for t in texts
            ]
        encode = (
            backend.encode_batch_fast
            if hasattr(backend, "encode_batch_fast")
            else backend.encode_batch
        )
        return [np.asarray(e.ids, dtype=np.int32) for e in encode(texts, add_special_tokens=False)]

    def forget(self) -> None:
        """Empty the encode cache (benchmarks that must not profit from earlier rollouts)."""
        self._encode_cache.clear()
        self._cached_tokens = 0

    def encode(self, text: str) -> np.ndarray:
        return self.encode_many([text])[0]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.backend.decode(list(map(int, ids)), skip_special_tokens=False)

    def engine_view(
        self, context: Sequence[MessageEvent], call: MessageEvent, tools: list | None
    ) -> tuple[list[int], list[int]]:
        """What an inference engine would log for ``call``: (prompt ids, output ids).

        Used by the simulator to write token-logging rollouts; the build itself never
        renders a whole context per call on incremental templates.
        """
        ctx = [template_message(m) for m in context]
        prompt = self.render(ctx, tools, True)
        generated, _ = self.output_text(template_message(call), tools, ctx)
        return self.encode(prompt).tolist(), self.encode(generated).tolist()


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Tokenizing a long text allocates and frees ~130 bytes per character in
    many small pieces: the freed memory stays mapped, fragmented, and the next long
    text's pieces do not all fit in it, so without this ten 5 MB messages grew a
    worker's RSS by ~1 GB more than one does."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None  # libc.malloc_trim once looked up; False where there is none


def _batches(texts: list[str], budget: int) -> Iterator[list[str]]:
    """``texts`` in order, cut into consecutive batches of at most ``budget`` characters
    (a longer text is a batch of its own). Texts are encoded independently of each
    other, so the cut changes no id."""
    batch: list[str] = []
    size = 0
    for text in texts:
        if batch and size + len(text) > budget:
            yield batch
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        yield batch


def _probe_conversation() -> list[dict]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "grep", "arguments": {"pattern": "x"}},
    }
    call2 = {
        "id": "c2",
        "type": "function",
        "function": {"name": "read", "arguments": {"path": "a.py"}},
    }
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": "Search first.",
            "tool_calls": [call, call2],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "grep", "content": "a.py:3: x = 1"},
        {"role": "tool", "tool_call_id": "c2", "name": "read", "content": "x = 1\n"},
        {"role": "assistant", "content": "", "tool_calls": [{**call, "id": "c3"}]},
        {"role": "tool", "tool_call_id": "c3", "name": "grep", "content": "none"},
        {"role": "user", "content": "Summarize."},
        {"role": "assistant", "content": "Done: x is set in a.py."},
    ]


def probe_incremental(renderer: ChatRenderer) -> bool:
    """True when rendering message by message equals rendering whole conversations.

    Checked in text (every prefix, with and without the generation prompt) and in token
    space (pieces tokenized separately equal the whole conversation tokenized at once).
    """
    conv = _probe_conversation()
    tools = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]
    try:
        pieces = [renderer.piece(m, i == 0, tools) for i, m in enumerate(conv)]
        gen = renderer.generation_prompt()
        for k in range(1, len(conv) + 1):
            if renderer.render(conv[:k], tools, False) != "".join(pieces[:k]):
                return False
            if k < len(conv) and conv[k]["role"] == "assistant":
                if renderer.render(conv[:k], tools, True) != "".join(pieces[:k]) + gen:
                    return False
                if not pieces[k].startswith(gen):
                    return False
        texts = []
        for m, p in zip(conv, pieces):
            if m["role"] == "assistant":
                texts += [gen, *renderer.split_output(p[len(gen) :])]
            else:
                texts.append(p)
        whole = renderer.encode(renderer.render(conv, tools, False))
        parts = np.concatenate([ids for ids in renderer.encode_many([t for t in texts if t])])
        return bool(np.array_equal(whole, parts))
    except TemplateError:
        return False
