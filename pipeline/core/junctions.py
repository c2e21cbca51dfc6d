"""Tokenize a rendered piece as its template text and its message texts, with the ids of the whole.

A piece filled in by shape (``render_shapes.py``) is constant template text around a
message's texts: ``<|im_start|>user\\n<tool_response>\\n`` + output + ``\\n</tool_response>
<|im_end|>\\n``. Encoding the whole piece tokenizes the template's text again for every
message (about a tenth of a build's characters); encoding the texts alone and putting the
template text's cached ids around them does not. That is exact only where the piece can be
cut without changing a token: ``ids(S) = ids(S[:b]) + ids(S[b:])``. This module cuts a
piece only at the junctions of its parts (and at added tokens inside template text), and
only where it can prove that from the characters around the junction; elsewhere the
parts stay joined and are encoded together.

The proof, for the tokenizers ``long_text.supports_pieces`` accepts (Qwen2's split
regex, NFC or no normalizer, BPE without dropout, added tokens matched on the raw text
without strip/single-word rules). A Hugging Face tokenizer splits a text on added tokens
(leftmost-longest), normalizes and pre-tokenizes each part between them, and runs BPE on
each pre-token alone. So a cut at ``b`` changes no id when

1. no added token's occurrence spans ``b`` (then the added-token split of ``S`` is that
   of ``S[:b]`` and ``S[b:]`` together — no occurrence of one half can overlap one of
   the other), and
2. an added token starts at ``b``, or ends there and no two added tokens can overlap
   (then every occurrence is matched, so ``b`` is between two parts); or the part
   around ``b`` normalizes and pre-tokenizes as its two halves (``pair_splits``).

``pair_splits(x, y)``, with ``x = S[b-1]`` and ``y = S[b]``. Qwen2's pattern is the
ordered alternation A1 ``'s|'t|…`` (case-insensitive), A2 ``[^\\r\\n\\pL\\pN]?\\pL+``,
A3 ``\\pN``, A4 `` ?[^\\s\\pL\\pN]+[\\r\\n]*``, A5 ``\\s*[\\r\\n]+``, A6 ``\\s+(?!\\S)``,
A7 ``\\s+``; every character matches one of them, and it has no look-behind, so matching
from ``b`` on is the same in ``S`` and in ``S[b:]``. Before ``b``, a match of ``S[:b]``
alone differs from the whole's only if (a) the whole's match over ``x`` runs on past
``b`` — an alternative that continues ``x`` with ``y`` — or (b) a try that needs more
text after ``b`` fails differently at the end of ``S[:b]`` than on ``y``: only A6's
look-ahead, which succeeds at the end of text and needs ``\\s+`` to reach ``b``, i.e.
``x`` whitespace. The accepted pairs:

- ``x`` a newline, ``y`` not whitespace (``str.isspace``, a superset of the pattern's
  ``\\s``): no alternative continues a newline with a non-space (A2's optional first
  character excludes ``\\r\\n``; A4's optional first character is a space); the run of
  whitespace that ends in ``x`` is matched whole by A5 (or is the ``[\\r\\n]*`` tail of
  A4), tried before A6, in both. NFC: a newline is a starter that composes with
  nothing, so nothing composes or reorders across it.
- ``x`` printable ASCII (letter L, digit N or other P), ``y`` printable ASCII, a space,
  a tab or a newline: ``y`` a digit or a space/tab after any ``x`` (A3 is one
  character; A4's space is a prefix, its tail only newlines); ``y`` P or a newline
  after L or N (A4 continues only P, its tail newlines only after P); ``y`` a letter
  after N only (A1/A2 continue letters, and A2 starts with any P). NFC: an ASCII
  character has combining class 0 and is never the second character of a composition,
  so nothing composes or reorders across ``b``.

``tests/core/test_junctions.py`` checks composed ids against the whole piece's for every
bundled template on adversarial texts (whitespace at either end, newlines, special-token
strings, Unicode, composing characters), and that skipping the check fails it.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.core.long_text import _cached_shape

_PRINTABLE = frozenset(chr(c) for c in range(0x21, 0x7F))  # printable ASCII, no space
_LETTERS = frozenset(string.ascii_letters)
_DIGITS = frozenset(string.digits)


def _ascii_pair_splits(x: str, y: str) -> bool:
    if y in _DIGITS or y in " \t":
        return True
    if y == "\n" or (y in _PRINTABLE and y not in _LETTERS):  # P or a newline
        return x in _LETTERS or x in _DIGITS
    if y in _LETTERS:
        return x in _DIGITS
    return False


# Every accepted pair with an ASCII ``x`` (the newline rule for non-ASCII ``y`` is checked apart).
_SAFE_PAIRS = frozenset(
    x + y for x in _PRINTABLE for y in [*_PRINTABLE, " ", "\t", "\n"] if _ascii_pair_splits(x, y)
) | frozenset("\n" + y for y in _PRINTABLE)


def pair_splits(x: str, y: str) -> bool:
    """Whether Qwen2's pre-tokenizer and NFC treat ``…x`` ``y…`` as its two halves (see above)."""
    return x + y in _SAFE_PAIRS or (x == "\n" and not y.isspace())


class Piece(str):
    """A rendered piece that remembers its parts: ``parts`` joined is the text; ``fixed[i]``
    is True where part ``i`` is the template's own text (the same for every message of
    the shape), False where it is one of the message's texts."""

    parts: tuple[str, ...]
    fixed: tuple[bool, ...]

    @classmethod
    def of(cls, parts: Sequence[str], fixed: Sequence[bool]) -> Piece:
        piece = cls("".join(parts))
        piece.parts = parts  # type: ignore[assignment]  # any sequence, never changed
        piece.fixed = fixed  # type: ignore[assignment]
        return piece

    def cut(self, start: int, end: int) -> str:
        """``self[start:end]``: a ``Piece`` of the clipped parts, or a plain string where it
        holds template text only (nothing to cut it at)."""
        if start >= end:
            return ""
        # The trailer after an end-of-turn token, or a generation prompt: inside one part of
        # template text at either end, a plain string (what the loop below returns for it).
        if (self.fixed[-1] and end == len(self) and len(self) - start <= len(self.parts[-1])) or (
            self.fixed[0] and end <= len(self.parts[0])
        ):
            return self[start:end]
        parts: list[str] = []
        fixed: list[bool] = []
        at = 0
        for part, is_fixed in zip(self.parts, self.fixed):
            size = len(part)
            if at + size > start and at < end:
                if at >= start and at + size <= end:
                    parts.append(part)
                else:
                    parts.append(part[(start - at if start > at else 0) : end - at])
                fixed.append(is_fixed)
            at += size
        if all(fixed):
            return self[start:end]
        piece = Piece(self[start:end])
        piece.parts = parts  # type: ignore[assignment]
        piece.fixed = fixed  # type: ignore[assignment]
        return piece


def sub(text: str, start: int, end: int | None = None) -> str:
    """``text[start:end]``, keeping a ``Piece``'s parts."""
    end = len(text) if end is None else end
    return text.cut(start, end) if type(text) is Piece else text[start:end]


_UNKNOWN: Any = object()  # a junction not looked up before


class Junctions:
    """Cuts a ``Piece`` into units whose ids, concatenated, are the piece's ids."""

    def __init__(
        self,
        added: tuple[str, ...],
        overlap_free: bool,
        check: Callable[[str, str], bool] = pair_splits,
    ):
        self.added = added  # added tokens of two or more characters
        self.overlap_free = overlap_free  # no two added tokens can overlap in any text
        self.check = check  # the pair rule (the mutation test swaps it)
        self._firsts = frozenset(t[0] for t in added)
        self._lasts = frozenset(t[-1] for t in added)
        self._chars = frozenset("".join(added))
        self._longest = max(map(len, added), default=1)
        self._inside_cache: dict[str, tuple[int, ...]] = {}
        self._closed_cache: dict[str, bool] = {}
        self._near_cache: dict[tuple[str, int, str], int | None] = {}
        # The longest added token at a position first, so a match is the longest there.
        alternation = "|".join(map(re.escape, sorted(added, key=len, reverse=True))) or "(?!)"
        self._token = re.compile(alternation)
        self._token_end = re.compile(f"(?:{alternation})\\Z")
        self._token_starts = re.compile(f"(?=({alternation}))")  # every start, overlapping too

    @classmethod
    def for_backend(cls, backend) -> Junctions | None:
        """The junction rules for ``backend``, or None where the proof does not cover it."""
        shape = _cached_shape(backend)
        if shape is None:
            return None
        return cls(shape.added, _overlap_free(shape.added))

    def units(self, piece: Piece) -> list[str]:
        """The piece's texts, cut at its provable junctions (see the module's proof).

        Each end of a message's text is cut at the junction with the template's text
        when that is proven, else at the nearest proven cut inside the template's text
        (so that only a few of its characters are encoded with the text); what lies
        between two cuts and holds template text only is one unit, whose ids are cached.
        """
        parts, fixed = piece.parts, piece.fixed
        cuts: list[int] = []
        at = 0
        last = len(parts) - 1
        near, known = self._near, self._near_cache
        at_junctions = True  # every cut so far falls at a junction of two parts
        for i, part in enumerate(parts):
            start = at
            at += len(part)
            if fixed[i]:
                continue
            # ``_near``'s remembered cuts looked up here first: the text's first and last
            # characters are the piece's at ``start`` and ``at - 1`` (an empty text's key,
            # with "", was never stored).
            if i > 0:
                cut = (
                    known.get((parts[i - 1], -1, part[:1]), _UNKNOWN) if fixed[i - 1] else _UNKNOWN
                )
                if cut is _UNKNOWN:
                    cut = near(piece, start, parts[i - 1], fixed[i - 1], -1)
                if cut is not None:
                    cuts.append(start + cut)
                at_junctions = at_junctions and cut == 0
            if i < last:
                cut = (
                    known.get((parts[i + 1], 1, part[-1:]), _UNKNOWN) if fixed[i + 1] else _UNKNOWN
                )
                if cut is _UNKNOWN:
                    cut = near(piece, at, parts[i + 1], fixed[i + 1], 1)
                if cut is not None:
                    cuts.append(at + cut)
                at_junctions = at_junctions and cut == 0
        if not cuts:
            return [piece]
        # Cut at every junction (most pieces: both ends of each text proven): the units are
        # the parts themselves, not slices of the piece. The template's parts are then the
        # shape's own strings, whose hashes the encode cache's lookups find computed.
        if at_junctions and len(set(cuts)) == last:
            return list(parts)
        if len(cuts) > 1:
            cuts = sorted(set(cuts))
        bounds = [0, *cuts, len(piece)]
        return [piece[a:z] for a, z in zip(bounds, bounds[1:])]

    def _near(self, piece: str, b: int, neighbour: str, fixed: bool, side: int) -> int | None:
        """Where to cut at the junction ``b`` of a text with its ``neighbour`` part (before
        it: ``side`` -1, after it: 1), as an offset from ``b``: at ``b`` when proven, else
        (template text only) at the proven cut inside the neighbour nearest to ``b``, else
        None. Remembered per (template text, side, the text's character at ``b``) where
        no added token can reach from the template text into a text (``_closed``) and
        that character cannot start or end one: then nothing else decides."""
        ch = piece[b] if side < 0 else piece[b - 1]
        if not fixed:
            return self._find_near(piece, b, neighbour, fixed, side)
        key = (neighbour, side, ch)
        # Only keys that met the conditions below are stored: a stored key decides alone.
        cut = self._near_cache.get(key, _UNKNOWN)
        if cut is not _UNKNOWN:
            return cut
        cut = self._find_near(piece, b, neighbour, fixed, side)
        edge = self._firsts if side < 0 else self._lasts
        if ch not in edge and self._closed(neighbour) and len(self._near_cache) < 65536:
            self._near_cache[key] = cut
        return cut

    def _find_near(self, piece: str, b: int, neighbour: str, fixed: bool, side: int) -> int | None:
        if self.cuts(piece, b):
            return 0
        if not fixed:
            return None
        inside = self._inside(neighbour)
        offsets = [k - len(neighbour) for k in reversed(inside)] if side < 0 else list(inside)
        for k in offsets:
            if self.cuts(piece, b + k):
                return k
        return None

    def _closed(self, text: str) -> bool:
        """Whether no added token can overlap both ``text`` and a character outside it:
        no token's proper prefix ends it, and no token's proper suffix starts it."""
        found = self._closed_cache.get(text)
        if found is None:
            found = not any(
                text.endswith(t[:k])
                or t[:k].endswith(text)
                or text.startswith(t[k:])
                or t[k:].startswith(text)
                for t in self.added
                for k in range(1, len(t))
            )
            if len(self._closed_cache) < 4096:
                self._closed_cache[text] = found
        return found

    def _inside(self, text: str) -> tuple[int, ...]:
        """Positions inside template text where the rule may allow a cut (checked again
        in the piece: an added token may span one from the neighbouring text)."""
        found = self._inside_cache.get(text)
        if found is None:
            found = tuple(k for k in range(1, len(text)) if self.cuts(text, k))
            if len(self._inside_cache) < 4096:
                self._inside_cache[text] = found
        return found

    def cuts(self, s: str, b: int) -> bool:
        """Whether ``ids(s) = ids(s[:b]) + ids(s[b:])`` is proven (0 < b < len(s))."""
        x, y = s[b - 1], s[b]
        # An added token can start at b only with one of their first characters, end
        # there only with a last one, and span b only with both x and y among their characters.
        spans = x in self._chars and y in self._chars and self._spans(s, b)
        if not spans and y in self._firsts and self._token.match(s, b):
            return True
        if (
            self.overlap_free
            and x in self._lasts
            and self._token_end.search(s, b - self._longest, b)
        ):
            return True  # no occurrence can overlap the one ending at b: none spans it
        return not spans and self.check(x, y)

    def _spans(self, s: str, b: int) -> bool:
        """Whether an occurrence of an added token starts before ``b`` and ends after it."""
        return any(
            m.end(1) > b
            for m in self._token_starts.finditer(
                s, max(0, b - self._longest + 1), b + self._longest
            )
            if m.start() < b
        )


def _overlap_free(added: tuple[str, ...]) -> bool:
    """True when no added token is inside another, nor ends with another's beginning."""
    for a in added:
        for t in added:
            if a != t and a in t:
                return False
            if any(a.endswith(t[:k]) for k in range(1, min(len(a), len(t)))):
                return False
    return True
