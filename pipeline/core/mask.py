"""Loss masks: 1 exactly on the tokens the policy generated in a segment.

For each call span of a segment the output tokens (end-of-turn token included) are
trained; everything else — system, user, tool observations, the resume message that
carries a copied summary, template scaffolding — is 0. Options of the papers'
ablations:

- ``mask_summaries``: summary outputs are not trained ("no summary training");
- ``last_call_only``: only the last call of each segment is trained;
- a truncated output (``finish_reason="length"``) that was rendered rather than logged
  ends with an end-of-turn token the template added and the policy never sampled: it
  is masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.core.segment import Segment


@dataclass(frozen=True)
class MaskOptions:
    mask_summaries: bool = False
    last_call_only: bool = False


@dataclass
class MaskedSegment:
    segment: Segment
    loss_mask: np.ndarray  # int8, len == len(tokens)
    logprobs: np.ndarray | None  # float32 aligned with tokens, or None
    trained: list[bool]  # per call span
    # n_s = sum(loss_mask), counted once (the rows, the counts and the stage all ask).
    num_trainable_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_trainable_tokens = int(np.count_nonzero(self.loss_mask))


def mask_segment(
    seg: Segment, options: MaskOptions, eos_id: int, logged_output: list[bool]
) -> MaskedSegment:
    """``logged_output[j]``: span j's tokens are the engine's logged output ids."""
    tokens = seg.tokens
    mask = np.zeros(len(tokens), dtype=np.int8)
    trained = []
    last = len(seg.spans) - 1
    for j, span in enumerate(seg.spans):
        train = not (options.mask_summaries and span.kind == "summary") and not (
            options.last_call_only and j != last
        )
        trained.append(train)
        if not train:
            continue
        end = span.start + span.length
        if span.truncated and not logged_output[j] and span.length and tokens[end - 1] == eos_id:
            end -= 1
        mask[span.start : end] = 1
    return MaskedSegment(seg, mask, _trained_logprobs(seg, trained), trained)


def _trained_logprobs(seg: Segment, trained: list[bool]) -> np.ndarray | None:
    """The segment's logprobs column: each trained span's logged logprobs at its place, 0
    elsewhere; None unless at least one span is trained and every trained span logged
    them (a rollout from text logs none: no array is made for it)."""
    spans = [s for s, t in zip(seg.spans, trained) if t]
    if not spans or any(s.logprobs is None for s in spans):
        return None
    logprobs = np.zeros(len(seg.tokens), dtype=np.float32)
    for span in spans:
        logprobs[span.start : span.start + span.length] = span.logprobs
    return logprobs
