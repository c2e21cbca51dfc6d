"""Seams on token ids: does a call's input extend its segment, or start a new one?

The segmenter's core, with no chat template in it (docs/design.md, "Seams and
segments"). A segment grows call by call; each call brings its input ``P`` and its
output ``O`` as token ids. The next input ``P_{i+1}`` either

- **extends** the segment ``… P_i ⊕ O_i``: the rest of ``P_{i+1}`` is appended;
- differs from it only inside the last assistant turn, where it re-tokenizes the text
  of ``O_i`` with other ids (**drift**): the segment keeps the sampled ``O_i`` (its
  logprobs stay aligned, the trained ids are the ones the policy produced), continues
  with what follows that text in ``P_{i+1}``, and counts one realignment;
- or anything else: a **seam**, and ``P_{i+1}`` opens a new segment.

``segment_token_calls`` runs this on plain ids (the id-level tests in
``tests/core/test_segment_ids.py`` drive it the way SkyRL tests its prompt/response merge);
``pipeline/core/segment.py`` feeds it the logged or rendered ids of a rollout's calls. The
only thing it needs from a tokenizer is ``decode`` (the ``Decoder`` protocol), to tell
drift from a change of text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from schemas.kinds import CallKind, SeamKind


class Decoder(Protocol):
    """What the cut needs from a tokenizer: ids back to text (special tokens kept)."""

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...


@dataclass
class CallSpan:
    """Where one call's output lies in its segment's token sequence."""

    call_index: int
    kind: CallKind
    start: int
    length: int
    truncated: bool
    logprobs: np.ndarray | None


@dataclass
class Segment:
    """A run of calls without a seam: the last call's input plus its output."""

    tokens: np.ndarray
    spans: list[CallSpan]
    seam_kind: SeamKind  # the seam that opens this segment ("none" for the first)
    seam_trigger: str | None
    drift_realigned: int


@dataclass
class SegmentBuilder:
    """A segment under construction.

    ``chunks`` is the training sequence. ``engine`` is what the inference engine's next
    prompt must extend: the last call's input as the engine had it plus that call's
    sampled output (it differs from ``chunks`` only after a drift was realigned, where
    the engine re-tokenized an earlier output that the training sequence keeps as sampled).
    """

    seam_kind: SeamKind
    seam_trigger: str | None
    chunks: list[np.ndarray] = field(default_factory=list)
    length: int = 0
    spans: list[CallSpan] = field(default_factory=list)
    drift_realigned: int = 0
    engine: list[np.ndarray] = field(default_factory=list)
    engine_length: int = 0  # kept, not summed per call: a sum would be O(calls²) per segment
    engine_output_start: int = 0

    @classmethod
    def opened_by(
        cls, prompt: np.ndarray, seam_kind: SeamKind, seam_trigger: str | None
    ) -> SegmentBuilder:
        seg = cls(seam_kind, seam_trigger)
        seg.add(prompt)
        seg.set_engine([prompt])
        return seg

    def set_engine(self, chunks: list[np.ndarray]) -> None:
        self.engine = chunks
        self.engine_length = sum(len(c) for c in chunks)

    def extend_engine(self, ids: np.ndarray) -> None:
        self.engine.append(ids)
        self.engine_length += len(ids)

    def extend_both(self, chunks: list[np.ndarray]) -> None:
        """Append consecutive chunks to the training sequence and the engine's view alike
        (the rendered path; joined when the segment is finished or the view compared).
        Empty chunks are kept: they join to nothing."""
        n = sum(map(len, chunks))
        self.chunks += chunks
        self.length += n
        self.engine += chunks
        self.engine_length += n

    def replace_last_output(self, ids: np.ndarray) -> None:
        """The engine's view of the last output, re-tokenized (drift): the engine's last
        chunk is that output (``add_call``); the training sequence keeps it as sampled."""
        self.engine_length += len(ids) - len(self.engine[-1])
        self.engine[-1] = ids

    def add(self, ids: np.ndarray) -> None:
        if len(ids):
            self.chunks.append(ids)
            self.length += len(ids)

    def add_call(
        self,
        call_index: int,
        kind: CallKind,
        output: np.ndarray,
        truncated: bool,
        logprobs: np.ndarray | None,
    ) -> None:
        """Append a call's output at the end of the sequence and record its span."""
        self.spans.append(CallSpan(call_index, kind, self.length, len(output), truncated, logprobs))
        self.engine_output_start = self.engine_length
        self.extend_engine(output)
        self.add(output)

    def tokens(self) -> np.ndarray:
        self.chunks = [joined(self.chunks)]
        return self.chunks[0]

    def engine_tokens(self) -> np.ndarray:
        self.engine = [joined(self.engine)]
        return self.engine[0]

    def finish(self) -> Segment:
        return Segment(
            self.tokens(), self.spans, self.seam_kind, self.seam_trigger, self.drift_realigned
        )


def joined(chunks: list[np.ndarray]) -> np.ndarray:
    """The ids of consecutive int32 chunks as one array. A segment is hundreds of small
    chunks (template text, message texts): their bytes are joined in C by
    ``bytearray.join`` (~50 ns a chunk; ``np.concatenate`` takes ~190). A chunk that is
    not a contiguous 4-byte array (the byte count gives a wider one away) is joined by
    numpy instead."""
    if not chunks:
        return np.zeros(0, dtype=np.int32)
    if len(chunks) == 1:
        return chunks[0]
    try:
        data = bytearray().join(chunks)  # type: ignore[arg-type]  # arrays are buffers
    except (BufferError, TypeError, ValueError):
        return np.concatenate(chunks)
    if len(data) != 4 * sum(map(len, chunks)):
        return np.concatenate(chunks)
    return np.frombuffer(data, dtype=np.int32)


def extension(
    seg: SegmentBuilder, prompt: np.ndarray, decoder: Decoder, generation_prompt_length: int
) -> np.ndarray | None:
    """The ids to append before the next call's output, or None at a seam.

    ``generation_prompt_length``: ids of the template's assistant header before each
    output; drift may start there (a BPE merge across the prompt/output boundary).
    """
    have = seg.engine_tokens()
    n = len(have)
    m = min(n, len(prompt))
    diff = np.flatnonzero(prompt[:m] != have[:m])
    first_mismatch = int(diff[0]) if len(diff) else m
    if first_mismatch == n:
        seg.set_engine([prompt])
        return prompt[n:]
    # Drift is realigned only inside the last assistant turn (its generation prompt
    # and output): an earlier difference is a change of context.
    if first_mismatch < seg.engine_output_start - generation_prompt_length:
        return None
    consumed = retokenized_length(
        decoder, prompt[first_mismatch:], decoder.decode(have[first_mismatch:])
    )
    if consumed is None:
        return None
    seg.drift_realigned += 1
    seg.set_engine([prompt])
    return prompt[first_mismatch + consumed :]


def retokenized_length(decoder: Decoder, tail: np.ndarray, text: str) -> int | None:
    """How many ids at the head of ``tail`` decode to exactly ``text`` (None if none).

    Decoded length never shrinks as ids are added, so a binary search finds the first
    prefix at least as long as ``text`` in O(log n) decodes; the next two are checked
    too, because an id may end mid-character (a partial character decodes to one
    replacement character). Shorter prefixes decode to shorter text: never a match.
    """
    lo, hi = 0, len(tail)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decoder.decode(tail[:mid])) < len(text):
            lo = mid + 1
        else:
            hi = mid
    for k in (lo, lo + 1, lo + 2):
        if 0 < k <= len(tail) and decoder.decode(tail[:k]) == text:
            return k
    return None


@dataclass(frozen=True)
class TokenCall:
    """One call as ids: its input, its sampled output, and what a seam before it is."""

    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    kind: CallKind = "action"
    truncated: bool = False
    logprobs: Sequence[float] | None = None
    seam_kind: SeamKind = "divergence"  # the kind if this call's input opens a segment
    seam_trigger: str | None = None


def segment_token_calls(
    calls: Sequence[TokenCall], decoder: Decoder, generation_prompt_length: int = 0
) -> list[Segment]:
    """Cut a rollout given as ids into segments (the first one's seam kind is ``none``)."""
    done: list[Segment] = []
    seg: SegmentBuilder | None = None
    for index, call in enumerate(calls):
        prompt = np.asarray(call.prompt_ids, dtype=np.int32)
        if seg is None:
            seg = SegmentBuilder.opened_by(prompt, "none", None)
        else:
            tail = extension(seg, prompt, decoder, generation_prompt_length)
            if tail is None:
                done.append(seg.finish())
                seg = SegmentBuilder.opened_by(prompt, call.seam_kind, call.seam_trigger)
            else:
                seg.add(tail)
        logprobs = None if call.logprobs is None else np.asarray(call.logprobs, np.float32)
        output = np.asarray(call.output_ids, dtype=np.int32)
        seg.add_call(index, call.kind, output, call.truncated, logprobs)
    if seg is not None:
        done.append(seg.finish())
    return done
