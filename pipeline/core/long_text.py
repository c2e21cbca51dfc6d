"""Tokenize a very long text in pieces, with the ids of the whole, in bounded memory.

The Rust tokenizer's peak while it encodes one text is ~130-190 bytes per character
(ids, token strings, offsets, words): ~0.7-1 GB for one 5 MB message. A text longer than
``LONG_TEXT_CHARS`` is therefore cut into pieces of about ``PIECE_CHARS`` characters,
each encoded alone, and the ids concatenated. That is exact only at cuts that change no
token; this module cuts only where it can prove that, and checks every cut again.

Why a cut at ``b`` changes no id. A Hugging Face tokenizer encodes a text as: split on
added (special) tokens, normalize each part, pre-tokenize it, and run the model on each
pre-token alone (BPE never merges across pre-tokens). So
``ids(S) = ids(S[:b]) + ids(S[b:])`` when (1) no added token spans ``b``, (2) the
normalizer maps ``S[:b]`` and ``S[b:]`` separately to the halves of ``NFC(S)``, and
(3) the pre-tokens of the two halves are those of the whole. For the tokenizer families
this module accepts (``supports_pieces``: Qwen2's split regex, NFC or no normalizer, a
BPE without dropout, added tokens without strip/single-word matching), the cut rule
``CUT`` guarantees (2) and (3) from the two characters around ``b``:

- ``S[b-1]`` printable ASCII (not a space) and ``S[b]`` a space, a tab or an ASCII
  digit; or ``S[b-1]`` a newline and ``S[b]`` printable ASCII.
- (3), the pre-token ending at ``b``: the regex's alternatives are
  ``'s…`` | ``[^\\r\\n\\pL\\pN]?\\pL+`` | ``\\pN`` | `` ?[^\\s\\pL\\pN]+[\\r\\n]*`` |
  ``\\s*[\\r\\n]+`` | ``\\s+(?!\\S)`` | ``\\s+``, and every character matches one of them
  (no gaps). None continues a printable character with a space, a tab or a digit
  (letters continue letters, punctuation continues with punctuation, letters or
  newlines, a digit is alone), and none continues a newline with a non-space. So a
  pre-token ends at ``b`` and the next starts there.
- (3), both halves alone: the pattern has no look-behind, so matching from ``b`` on is
  the same in ``S`` and in ``S[b:]``. Before ``b`` a match could only differ through the
  one look-ahead ``(?!\\S)`` evaluated at ``b``, which needs ``\\s+`` to end at ``b``:
  excluded when ``S[b-1]`` is printable, and for a newline ``\\s*[\\r\\n]+`` (tried
  earlier) already matches that run. Counter-example to cutting at *any* pre-token
  boundary: ``"a  \\t!"`` pre-tokenizes as ``a|··|\\t|!``, but ``"a  \\t"`` alone as
  ``a|··\\t`` (the look-ahead at the cut now sees the end) — other ids.
- (2): an ASCII character has combining class 0, no decomposition, and is never the
  second character of a canonical composition, so NFC composes nothing across ``b`` and
  keeps ``S[b-1]`` and ``S[b]`` as they are.
- (1) is checked for every added token at every cut.

Checked at run time as well, cheaply, at every cut: the tokenizer's own pre-tokenizer
reports a boundary at ``b`` in a window around it, and the window's ids equal the ids of
its two halves. On any failure the whole text is encoded at once instead, and counted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pipeline.core.tokenizer import QWEN_SPLIT_PATTERN

LONG_TEXT_CHARS = 1 << 18  # texts longer than this (256 Ki characters) are cut
PIECE_CHARS = 1 << 17  # about this many characters per piece (smaller ones cost more calls)
CHECK_CHARS = 256  # characters each side of a cut that the run-time check re-encodes

# ``b`` is the start of the match: the characters before and at a cut (see above).
CUT = re.compile(r"(?<=[!-~])[ \t0-9]|(?<=\n)[!-~]")


@dataclass
class LongTextStats:
    """What ``encode_long`` did, per renderer: texts cut into pieces, and texts whose
    cuts failed the run-time check (encoded whole instead)."""

    cut: int = 0
    fell_back: int = 0


@dataclass(frozen=True)
class _Shape:
    """What the cut needs to know of a tokenizer that ``supports_pieces``."""

    added: tuple[str, ...]  # added tokens' texts (never split by a cut)
    normalize: Callable[[str], str] | None  # the normalizer's ``normalize_str``


def _state(component) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


def _shape(backend) -> _Shape | None:
    """The tokenizer's shape when the proof above covers it, else None."""
    try:
        normalizer = _state(backend.normalizer)
        pre = _state(backend.pre_tokenizer)
        model = backend.model  # its state holds the whole vocabulary: not serialized
        added = list(backend.get_added_tokens_decoder().values())
    except Exception:  # an unusual backend: encode whole
        return None
    if normalizer not in (None, {"type": "NFC"}):
        return None
    if not pre or pre.get("type") != "Sequence" or len(pre.get("pretokenizers", [])) != 2:
        return None
    split, byte_level = pre["pretokenizers"]
    if split != {
        "type": "Split",
        "pattern": {"Regex": QWEN_SPLIT_PATTERN},
        "behavior": "Isolated",
        "invert": False,
    }:
        return None
    if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space"):
        return None
    if byte_level.get("use_regex"):
        return None
    if type(model).__name__ != "BPE" or model.dropout is not None:
        return None
    if backend.truncation is not None or backend.padding is not None:
        return None
    for token in added:
        if token.lstrip or token.rstrip or token.single_word:
            return None
        if token.normalized and normalizer is not None:
            return None
    normalize = backend.normalizer.normalize_str if normalizer else None
    return _Shape(tuple(t.content for t in added if len(t.content) > 1), normalize)


@lru_cache(maxsize=8)
def _cached_shape(backend) -> _Shape | None:
    return _shape(backend)


def supports_pieces(backend) -> bool:
    """True when ``backend`` (a ``tokenizers.Tokenizer``) is one the cut rule is proven for."""
    return _cached_shape(backend) is not None


def ascii_twin(backend):
    """``backend`` without its normalizer, for texts that are all ASCII; None where that
    could change an id.

    Qwen2's normalizer is NFC, and NFC leaves every ASCII string as it is (an ASCII
    character has no decomposition and combining class 0, and no composition has an
    ASCII second character), so for an ASCII text — and each part of it between added
    tokens — the normalizer is the identity, and skipping it gives the same ids for
    about an eighth fewer instructions. The twin shares the model (no copy of the
    vocabulary) and takes the same pre-tokenizer and added tokens at the same ids.
    """
    shape = _cached_shape(backend)
    if shape is None or shape.normalize is None:
        return None  # not a tokenizer the proofs cover, or nothing to skip
    from tokenizers import Tokenizer

    twin = Tokenizer(backend.model)
    twin.pre_tokenizer = backend.pre_tokenizer
    twin.post_processor = backend.post_processor
    twin.decoder = backend.decoder
    added = backend.get_added_tokens_decoder()
    twin.add_tokens([added[i] for i in sorted(added)])
    if twin.get_added_tokens_decoder() != added:
        return None  # the added tokens did not land at their ids
    return twin


def _spans_added_token(text: str, b: int, added: tuple[str, ...]) -> bool:
    return any(
        text.startswith(token, b - i) for token in added for i in range(1, min(len(token), b + 1))
    )


def cut_points(text: str, added: tuple[str, ...], piece_chars: int | None = None) -> list[int]:
    """Positions ``b`` (0 < b < len(text)) about ``piece_chars`` (``PIECE_CHARS``) apart
    where ``CUT`` matches and no added token spans ``b``; a stretch without one makes a
    longer piece."""
    piece_chars = piece_chars or PIECE_CHARS
    cuts: list[int] = []
    at = piece_chars
    while at < len(text):
        match = CUT.search(text, at)
        if match is None:
            break
        b = match.start()
        if _spans_added_token(text, b, added):
            at = b + 1
            continue
        cuts.append(b)
        at = b + piece_chars
    return cuts


def _ids(backend, text: str) -> np.ndarray:
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # fast: no offsets
    encoding = encode([text], add_special_tokens=False)[0]
    return np.asarray(encoding.ids, dtype=np.int32)


def _cut_holds(backend, shape: _Shape, text: str, b: int) -> bool:
    """The run-time check of one cut, on a window of ``CHECK_CHARS`` each side: the
    tokenizer's own pre-tokenizer splits the (normalized) window at ``b``, and the
    window's ids are its halves' ids."""
    left, right = text[max(0, b - CHECK_CHARS) : b], text[b : b + CHECK_CHARS]
    window = left + right
    seen = window
    if shape.normalize is not None:
        seen = shape.normalize(window)
        if seen != shape.normalize(left) + shape.normalize(right):
            return False
        cut = len(shape.normalize(left))
    else:
        cut = len(left)
    if cut not in {end for _, (_, end) in backend.pre_tokenizer.pre_tokenize_str(seen)}:
        return False
    halves = np.concatenate([_ids(backend, left), _ids(backend, right)])
    return bool(np.array_equal(_ids(backend, window), halves))


def encode_pieces(backend, text: str, cuts: list[int]) -> np.ndarray:
    """The ids of ``text[0:c₁] + text[c₁:c₂] + …``, each piece encoded alone (no check)."""
    bounds = [0, *cuts, len(text)]
    parts = [_ids(backend, text[a:z]) for a, z in zip(bounds, bounds[1:])]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def encode_long(backend, text: str, stats: LongTextStats | None = None) -> np.ndarray:
    """Token ids of ``text`` (special tokens parsed, none added), equal to encoding it
    whole; longer than ``LONG_TEXT_CHARS`` on a supported tokenizer, in pieces."""
    shape = _cached_shape(backend) if len(text) > LONG_TEXT_CHARS else None
    cuts = cut_points(text, shape.added) if shape is not None else []
    if shape is None or not cuts:
        return _ids(backend, text)
    if not all(_cut_holds(backend, shape, text, b) for b in cuts):
        if stats is not None:
            stats.fell_back += 1
        return _ids(backend, text)
    if stats is not None:
        stats.cut += 1
    return encode_pieces(backend, text, cuts)
