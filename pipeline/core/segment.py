"""Find the seams of a rollout and cut it into segments whose prefix only grows.

Invariants (docs/design.md, "Seams and segments"):

- The test is done in token space. A call's input ``P_i`` is its logged ``prompt_ids``
  when the engine logged them, else the chat template's rendering of its context; its
  output ``O_i`` is the logged ``output_ids``, else the tokenized rendered output.
- Calls i and i+1 are in one segment iff ``P_{i+1}`` extends the segment so far
  (``… P_i ⊕ O_i``). On templates that render message by message (see ``render.py``)
  this is decided in message-id space: an unchanged id prefix means an unchanged token
  prefix, and only a changed id prefix (a rewrite) is compared token by token.
- **Re-tokenization drift** — ``P_{i+1}`` re-tokenizes the text of ``O_i`` differently
  than it was sampled, and nothing else differs — is *realigned*, not split (as slime
  does): the segment keeps the sampled ``O_i`` (so its logprobs stay aligned and the
  trained tokens are the ones the policy produced) and continues with the rest of
  ``P_{i+1}``. Realignments are counted per segment.
- Any other mismatch is a seam. Its kind is the reason of the rewrite event between the
  two calls (``compaction`` | ``edit`` | ``truncation``); without a rewrite it is
  ``divergence`` when the call's input ids were logged (they do not extend the segment)
  and ``template`` when they were rendered (the template re-rendered history, e.g.
  dropped earlier reasoning).
- The cut itself — extend, realign drift, or open a new segment — is decided on ids
  alone in ``pipeline/core/seams.py``; this module replays the rollout and supplies each
  call's ids (logged, or rendered through ``render.py``).
- A segment's sequence is its last call's input plus that call's output; every call's
  output in it lies at a known span (``CallSpan``) and is trained exactly once, in the
  segment that generated it. A summary call closes its segment; in the next segment
  the summary is context.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.core.render import ENCODE_BATCH_CHARS, ChatRenderer, template_message
from pipeline.core.seams import CallSpan, Segment, SegmentBuilder, extension, joined
from schemas.kinds import SeamKind
from schemas.replay import CallContext, CallView, replay
from schemas.rollout import MessageEvent, RewriteEvent, Rollout

__all__ = ["CallSpan", "Segment", "Segmenter"]


class Segmenter:
    """Cuts rollouts into segments for one renderer (tokenizer + chat template)."""

    def __init__(self, renderer: ChatRenderer):
        self.renderer = renderer
        self._generation_prompt_ids = renderer.encode(renderer.generation_prompt())

    def segments(self, rollout: Rollout) -> list[Segment]:
        calls = replay(rollout)
        tools = rollout.tools or None
        pieces = _PieceCache(self.renderer, tools)
        if self.renderer.incremental and any(c.message.prompt_ids is None for c in calls):
            pieces.prefetch(rollout, calls)
        done: list[Segment] = []
        seg: SegmentBuilder | None = None
        prev: CallView | None = None
        prev_out: np.ndarray | None = None
        # Message-by-message mode: the previous call's context, rendered so far (its
        # output follows it), or None when that call's input was logged.
        rendered: CallContext | None = None
        for call in calls:
            if seg is None:
                seg = self._start(call, pieces, "none", None)
            else:
                assert prev is not None and prev_out is not None  # set after the first call
                if not self._extend(seg, rendered, prev, prev_out, call, pieces):
                    done.append(seg.finish())
                    kind = call.rewrite.reason if call.rewrite else _unrewritten(call)
                    trigger = call.rewrite.trigger if call.rewrite else None
                    seg = self._start(call, pieces, kind, trigger)
            out = self._output(call, pieces)
            logprobs = call.message.logprobs
            seg.add_call(
                call.index,
                call.message.call_kind,
                out,
                call.message.finish_reason == "length",
                None if logprobs is None else np.asarray(logprobs, dtype=np.float32),
            )
            incremental = self.renderer.incremental and call.message.prompt_ids is None
            rendered = call.context if incremental else None
            prev, prev_out = call, out
        if seg is not None:
            done.append(seg.finish())
        return done

    # -- the input of a call ------------------------------------------------------------
    def _prompt(self, call: CallView, pieces: _PieceCache) -> np.ndarray:
        """The call's whole input. Made once per call: at a seam, the check that found it
        (``extension``) and the segment it opens (``_start``) both need it."""
        if pieces.prompt_of is call:
            return pieces.prompt
        if call.message.prompt_ids is not None:
            ids = np.asarray(call.message.prompt_ids, dtype=np.int32)
        elif self.renderer.incremental:
            ids = joined([*pieces.context_chunks(call.context), pieces.generation_prompt()])
        else:
            ctx = [template_message(m) for m in call.context]
            ids = self.renderer.encode(self.renderer.render(ctx, pieces.tools, True))
        pieces.prompt_of, pieces.prompt = call, ids
        return ids

    def _output(self, call: CallView, pieces: _PieceCache) -> np.ndarray:
        if call.message.output_ids is not None:
            return np.asarray(call.message.output_ids, dtype=np.int32)
        return pieces.output(call)

    def _start(
        self, call: CallView, pieces: _PieceCache, kind: SeamKind, trigger: str | None
    ) -> SegmentBuilder:
        return SegmentBuilder.opened_by(self._prompt(call, pieces), kind, trigger)

    # -- does call i+1 extend the segment? ------------------------------------------------
    def _extend(
        self,
        seg: SegmentBuilder,
        rendered: CallContext | None,
        prev: CallView,
        prev_out: np.ndarray,
        call: CallView,
        pieces: _PieceCache,
    ) -> bool:
        """Append to ``seg`` the tokens before ``call``'s output (as consecutive chunks: the
        segment joins its chunks once, when it is finished); False at a seam."""
        now = call.context
        done = 0 if rendered is None else len(rendered)
        if (
            rendered is not None
            and call.message.prompt_ids is None
            and len(now) > done
            and now.extends(rendered)
            and now[done].id == prev.message.id
        ):
            rendered_out, trailer = pieces.output_pair(prev)
            tail = [
                trailer,
                *pieces.context_chunks(now[done + 1 :], False),
                pieces.generation_prompt(),
            ]
            if prev.message.output_ids is None or np.array_equal(prev_out, rendered_out):
                seg.extend_both(tail)
                return True
            if self.renderer.decode(prev_out) == self.renderer.decode(rendered_out):
                # History re-renders the sampled output with other ids, same text: realign.
                seg.drift_realigned += 1
                seg.replace_last_output(rendered_out)
                seg.extend_both(tail)
                return True
        ids = extension(
            seg, self._prompt(call, pieces), self.renderer, len(self._generation_prompt_ids)
        )
        if ids is None:
            return False
        seg.add(ids)
        return True


def _unrewritten(call: CallView) -> SeamKind:
    """The kind of a seam no rewrite explains: ``divergence`` when the engine logged the
    call's input (the logged ids themselves stop extending the segment: a retry, a
    context the harness changed without saying so), else ``template`` (the chat
    template re-rendered history, e.g. dropped earlier reasoning)."""
    return "divergence" if call.message.prompt_ids is not None else "template"


class _PieceCache:
    """Tokenized pieces of one rollout's messages, each rendered and encoded once."""

    def __init__(self, renderer: ChatRenderer, tools: list | None):
        self.r = renderer
        self.tools = tools
        # Each message's piece as consecutive chunks of ids (``ChatRenderer.encode_units``),
        # joined only with the rest of its segment.
        self._pieces: dict[tuple[str, bool], list[np.ndarray]] = {}
        self._outputs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._generation_prompt: np.ndarray | None = None  # asked for at every call: kept
        self.prompt_of: CallView | None = None  # the call whose whole input ``prompt`` is
        self.prompt = np.zeros(0, dtype=np.int32)

    def generation_prompt(self) -> np.ndarray:
        if self._generation_prompt is None:
            self._generation_prompt = self.r.encode(self.r.generation_prompt())
        return self._generation_prompt

    def prefetch(self, rollout: Rollout, calls: list[CallView]) -> None:
        """Render every message of the rollout once and tokenize them all in one batch
        (one call into the Rust tokenizer per rollout instead of one per message)."""
        messages = [e for e in rollout.events if isinstance(e, MessageEvent)]
        messages += [
            m
            for e in rollout.events
            if isinstance(e, RewriteEvent)
            for m in e.context
            if isinstance(m, MessageEvent)
        ]
        firsts: dict[str, MessageEvent] = {}  # each context's first message, by id
        for c in calls:
            if len(c.context):
                first = c.context[0]
                firsts[first.id] = first
        jobs: list[tuple[str, Any]] = []
        texts: list[str] = []

        def encode() -> None:
            encoded = iter(self.r.encode_units(texts))
            for kind, key in jobs:
                if kind == "output":
                    self._outputs[key] = (joined(next(encoded)), joined(next(encoded)))
                else:
                    self._pieces[key] = next(encoded)
            jobs.clear()
            texts.clear()

        # The renders between two encodes are timed as one ``render`` span (a clock
        # reading per render cost more than a tenth of the render time).
        times = self.r.times
        start = times.clock() if times is not None else (0.0, 0.0)

        def rendered() -> None:
            nonlocal start
            if times is not None:
                times.add_nested_since("render", start)
            encode()
            if times is not None:
                start = times.clock()

        self.r.time_each_render = False
        try:
            # Rendered texts are encoded a batch of ENCODE_BATCH_CHARS at a time: a rollout
            # of many multi-megabyte tool outputs never holds all of them rendered at once.
            size = 0
            for m in messages:
                if m.role == "assistant":
                    new = list(self.r.message_output(m, self.tools))
                    jobs.append(("output", m.id))
                elif (m.id, False) not in self._pieces:
                    new = [self.r.message_piece(m, self.tools)]
                    jobs.append(("piece", (m.id, False)))
                else:
                    continue
                texts += new
                size += sum(map(len, new))
                if size >= ENCODE_BATCH_CHARS:
                    rendered()
                    size = 0
            for mid, m in firsts.items():
                texts.append(self.r.piece(template_message(m), True, self.tools))
                jobs.append(("piece", (mid, True)))
            rendered()
        finally:
            self.r.time_each_render = True

    def context_chunks(self, messages, at_start: bool = True) -> list[np.ndarray]:
        """Tokens of ``messages`` as consecutive chunks, one or more per message (not
        joined: the caller joins them once, with what surrounds them); ``at_start`` when
        they open the context (the first piece differs).

        An assistant turn in history is tokenized as it was generated — generation
        prompt, output, trailer — so history never re-tokenizes what the policy sampled.
        """
        # Most calls: every message already encoded (``prefetch``), its chunk taken as
        # it is; else the messages are rendered and encoded below.
        pieces, found = self._pieces, []
        for i, m in enumerate(messages):
            chunks = pieces.get((m.id, at_start and i == 0))
            if chunks is None:
                break
            found += chunks
        else:
            return found
        keys = [(m.id, at_start and i == 0) for i, m in enumerate(messages)]
        todo = [
            (k, m)
            for k, m in zip(keys, messages)
            if k not in self._pieces and not self._as_turn(k, m)
        ]
        if todo:
            texts = [self.r.piece(template_message(m), first, self.tools) for (_, first), m in todo]
            for (key, _), chunks in zip(todo, self.r.encode_units(texts)):
                self._pieces[key] = chunks
        for key, m in zip(keys, messages):
            if key not in self._pieces:
                out, trailer = self._output_pair(m)
                self._pieces[key] = [self.generation_prompt(), out, trailer]
        return [ids for k in keys for ids in self._pieces[k]]

    @staticmethod
    def _as_turn(key: tuple[str, bool], m: MessageEvent) -> bool:
        return m.role == "assistant" and not key[1]

    def _output_pair(self, message: MessageEvent, context=None) -> tuple[np.ndarray, np.ndarray]:
        if message.id not in self._outputs:
            ctx = None if self.r.incremental else [template_message(m) for m in context]
            generated, trailer = self.r.output_text(template_message(message), self.tools, ctx)
            out, tr = self.r.encode_many([generated, trailer])
            self._outputs[message.id] = (out, tr)
        return self._outputs[message.id]

    def output(self, call: CallView) -> np.ndarray:
        return self._output_pair(call.message, call.context)[0]

    def output_pair(self, call: CallView) -> tuple[np.ndarray, np.ndarray]:
        """``output`` and ``trailer`` of one call at once."""
        return self._output_pair(call.message, call.context)
