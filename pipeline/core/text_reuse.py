"""Reuse the ids of repeated stretches *inside* texts: content-defined pieces.

Rollouts repeat more than whole texts. An agent reads a file, edits one line and reads
it again; a test run prints the same header and the same passing lines as the last run;
every rollout of a task reads the same modules with a different slice around them. The
whole-text cache (``ChatRenderer._encode_texts``) finds none of that: the texts differ.
How much this finds depends on the input. Share of the piece characters of long texts
found in the cache (one renderer, one message at a time, no pause; 3 Dec 2026): within
one session, 4% in the real Claude Code sessions of ``shared/realworld*``, 9% in the real
Codex ones, 29% in the simulated held-out rollouts of ``bench/``; across a whole input,
5% / 9% for the real ones (independent sessions) and 60% for the simulated ones (groups of
rollouts of one task read the same repository, as an RL group does).

**Where a text is cut.** Only where ``long_text.py`` proves that the ids of the whole
are the ids of the two halves, one after the other (the cut rule ``CUT`` and its proof
are in that module's docstring; the tokenizer must be one ``supports_pieces`` accepts).
Of those positions, this module uses the first one of each line:

- a line that starts with a printable ASCII character: the cut is at its start
  (``S[b-1]`` a newline, ``S[b]`` printable ASCII);
- a line indented by spaces: the cut is where its first printable run meets a space, a
  tab or a digit (``S[b-1]`` printable, ``S[b]`` one of those) — in ``cat -n`` output,
  between the line number and its tab.

A cut is *content-defined*, as in rsync and restic: it is taken where the hash of the
``WINDOW`` characters before it falls in one of ``1 / (MASK + 1)`` buckets, and a piece
holds at least ``MIN_PIECE`` characters. An edit therefore moves only the cuts near it,
and the other pieces of the edited text are the pieces of the old one, found in the
cache by content.

**Why a cut after a newline or in a printable run cannot split an added token.** A
token spans ``b`` only if it holds the pair ``S[b-1] S[b]``; ``cutter`` refuses a
tokenizer with an added token holding a newline followed by printable ASCII, or a
printable character followed by a space, a tab or a digit (Qwen2's hold none).

**A trip-wire on top of the proof.** The first ``CHECK_FIRST`` texts cut and every
``CHECK_EVERY``-th after are also encoded whole, and the ids compared. A difference
turns the reuse off for the renderer and is counted (``ReuseStats.fell_back``); the
text gets the whole text's ids.

**When it does not pay.** Cutting costs ~4% of the tokenizer's time, and small pieces
each cost an ``Encoding``: on texts that repeat nothing that is 10-15% more time for
nothing. So each renderer keeps a running share of piece characters it did not have to
encode; below ``MIN_SAVED`` it cuts only every ``PROBE_EVERY``-th eligible batch (to
notice when repeats appear), and encodes whole texts otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.core.long_text import _cached_shape

REUSE_TEXT_CHARS = 512  # shorter texts are cached whole only (a piece costs an Encoding)
MIN_PIECE = 64  # characters a piece holds at least (before the cut the hash picks)
MASK = 3  # a cut is taken where hash(window) & MASK == 0: about one line start in four
WINDOW = 64  # characters before a cut that decide it
CHECK_FIRST = 8  # texts cut and also encoded whole, per renderer, at the start
CHECK_EVERY = 512  # and then one text in this many
MIN_SAVED = 0.03  # share of piece characters found in the cache below which cutting pauses
PROBE_EVERY = 16  # while paused, batches cut anyway (to see whether repeats came back)
SAVED_WEIGHT = 0.1  # weight of one batch in the running share

# The first cut of a line (see the module docstring): the match's last character.
LINE_CUT = re.compile(r"\n(?:[!-~]| +[!-~]+[ \t0-9])")
# Character pairs around a cut that an added token must not hold.
_SPANNING_PAIR = re.compile(r"\n[!-~]|[!-~][ \t0-9]")


@dataclass
class ReuseStats:
    """What the reuse did in one renderer: texts cut into pieces, piece characters found
    in the cache, characters of pieces encoded, texts checked whole, and failed checks."""

    cut: int = 0
    reused_chars: int = 0
    encoded_chars: int = 0
    checked: int = 0
    fell_back: int = 0


def cut_pieces(text: str, min_piece: int = MIN_PIECE, mask: int = MASK) -> list[str]:
    """``text`` as consecutive pieces (their join is ``text``), cut at content-defined
    line starts where the cut rule holds (module docstring). Deterministic per process
    (``hash`` of ``str`` is seeded per process; the ids do not depend on the cuts).
    ``min_piece`` and ``mask`` are the tests' handles (``mask=0``: every candidate)."""
    out: list[str] = []
    start = 0
    for m in LINE_CUT.finditer(text):
        b = m.end() - 1
        lo = b - WINDOW if b - WINDOW > start else start  # the window stays in the piece
        if b - start >= min_piece and not hash(text[lo:b]) & mask:
            out.append(text[start:b])
            start = b
    out.append(text[start:])
    return out


class PieceReuse:
    """Per renderer: whether to cut now, and the running share of characters saved."""

    def __init__(self) -> None:
        self.stats = ReuseStats()
        self.on = True  # False after a failed check: never cut again
        self._saved = 0.5  # running share of piece characters found in the cache
        self._paused_batches = 0

    def wanted(self) -> bool:
        """Cut this batch? Yes while cutting saves; while it does not, one batch in
        ``PROBE_EVERY``."""
        if not self.on:
            return False
        if self._saved >= MIN_SAVED:
            return True
        self._paused_batches += 1
        return self._paused_batches % PROBE_EVERY == 0

    def check_now(self) -> bool:
        """Encode this cut text whole as well, and compare?"""
        n = self.stats.cut
        return n < CHECK_FIRST or n % CHECK_EVERY == 0

    def observe(self, piece_chars: int, encoded_chars: int) -> None:
        """One batch's piece characters, and how many of them had to be encoded."""
        if piece_chars:
            self.stats.reused_chars += piece_chars - encoded_chars
            self.stats.encoded_chars += encoded_chars
            saved = 1 - encoded_chars / piece_chars
            self._saved += SAVED_WEIGHT * (saved - self._saved)

    def failed(self) -> None:
        self.stats.fell_back += 1
        self.on = False


def cutter(backend) -> Callable[[str], list[str]] | None:
    """``cut_pieces`` when the cut rule is proven for ``backend`` and no added token can
    span a cut; else None (texts are then cached whole only)."""
    shape = _cached_shape(backend)
    if shape is None or any(_SPANNING_PAIR.search(token) for token in shape.added):
        return None
    return cut_pieces
