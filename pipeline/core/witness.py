"""The second witness: the harness's own count of each call's input tokens.

seam rebuilds every call's input from the log through its own readers, so ``seam
verify`` (which re-reads the log the same way) cannot see a record a reader gets wrong.
The log carries an independent witness: the input tokens the provider reported for each
call (``meta["reported_input_tokens"]``: Claude Code ``usage`` input + cache creation
+ cache read, Codex ``token_count``). Absolute counts differ (the harness's tokenizer is
not ours, and the system prompt and tool schemas are not logged), but between two calls
of one segment the context only grows by what the log records (the previous output and
what came back), so the two growths agree up to a per-model factor.

For calls ``j-1, j`` of one segment, both with a reported count ``r`` and with rebuilt
input lengths ``s`` (``call_spans[j].start``)::

    expected = factor(model) * (s_j - s_{j-1})
    excess   = (r_j - r_{j-1}) - expected
    flagged  iff |excess| > max(SLACK, REL * |expected|)

A flagged pair means the model saw about ``|excess|`` tokens that seam's context does
not hold (``excess > 0``: a record the reader skipped) or the reverse (``excess < 0``:
seam's context holds something the model did not see). The segment then gets the
``context_fidelity`` reason ``unexplained_context_gap`` and its ``context_gap_tokens``
is the sum of ``|excess|`` over its flagged pairs (0 when every witnessed pair agrees,
null when no pair of the segment was witnessed). ``FACTORS``, ``REL`` and ``SLACK`` were
measured on the real files (``tools/witness_calibration.py``; docs/data.md, "The second
witness").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GAP_REASON = "unexplained_context_gap"
# Build counts (manifest, summary, ``seam stats``): calls with a witness (the later call
# of a witnessed pair) and the segments' ``context_gap_tokens``, summed.
WITNESSED_CALLS = "witnessed_calls"
GAP_TOKENS = "context_gap_tokens"

# Harness tokens per seam (Qwen2.5) token of context growth, on clean pairs (nothing
# skipped between the calls), by model-name prefix: the first that matches wins.
# Measured as sum(reported growth) / sum(rebuilt growth) per model family
# (tools/witness_calibration.py over SEAM_REALWORLD_DIR and SEAM_REALWORLD_NEW_DIR).
FACTORS: tuple[tuple[str, float], ...] = (
    ("claude-opus-4-6", 1.18),
    ("claude-sonnet-5", 1.45),
    ("claude", 1.12),
    ("gpt", 1.0),
)
DEFAULT_FACTOR = 1.0  # any other model (and none recorded)
# Allowed deviation of one pair's reported growth from the expected: relative (per-pair
# tokenizer noise: code and prose tokenize differently) and absolute (per-message framing
# the two tokenizers count differently, which dominates small growths).
REL = 0.35
SLACK = 1000


def factor(model: str | None) -> float:
    """The harness-per-seam token factor of ``model`` (``FACTORS``)."""
    name = (model or "").lower()
    return next((f for prefix, f in FACTORS if name.startswith(prefix)), DEFAULT_FACTOR)


@dataclass(frozen=True)
class Pair:
    """One witnessed pair of consecutive calls of a segment."""

    position: int  # the later call's position in the segment (1 or more)
    rebuilt_growth: int  # s_j - s_{j-1}
    reported_growth: int  # r_j - r_{j-1}
    excess: float  # reported growth - factor * rebuilt growth
    allowed: float  # max(SLACK, REL * |factor * rebuilt growth|)

    @property
    def flagged(self) -> bool:
        return abs(self.excess) > self.allowed


def pairs(starts: Sequence[int], reported: Sequence[int | None], model: str | None) -> list[Pair]:
    """The witnessed pairs of one segment: consecutive calls both with a reported count
    (``starts``/``reported`` are aligned with the segment's call spans)."""
    f = factor(model)
    found = []
    for j in range(1, min(len(starts), len(reported))):
        before, now = reported[j - 1], reported[j]
        if before is None or now is None:
            continue
        rebuilt = int(starts[j]) - int(starts[j - 1])
        expected = f * rebuilt
        found.append(
            Pair(
                j,
                rebuilt,
                now - before,
                now - before - expected,
                max(SLACK, REL * abs(expected)),
            )
        )
    return found


@dataclass(frozen=True)
class SegmentWitness:
    witnessed: int  # calls of the segment with a witness (the later call of a pair)
    flagged: int  # of those, calls whose growth gap is over the threshold
    gap_tokens: int | None  # sum of |excess| over flagged pairs; None when none witnessed

    @property
    def gap(self) -> bool:
        return self.flagged > 0


def witness(
    starts: Sequence[int], reported: Sequence[int | None], model: str | None
) -> SegmentWitness:
    found = pairs(starts, reported, model)
    flagged = [p for p in found if p.flagged]
    return SegmentWitness(
        len(found),
        len(flagged),
        round(sum(abs(p.excess) for p in flagged)) if found else None,
    )
