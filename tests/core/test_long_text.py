"""Long texts tokenized in pieces (``pipeline/core/long_text.py``) get the ids of the whole text.

The property test cuts random mixes of base64, code, Unicode (decomposed and combining
characters included), whitespace runs, newlines, digits and special tokens every few
characters — hundreds of cuts per example — and compares the pieces' ids with the real
tokenizer's ids of the whole text. The hand-checked cases show why a cut needs more
than a pre-tokenizer boundary, and which tokenizers the rule is not claimed for.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core import long_text
from pipeline.core.long_text import (
    CUT,
    LongTextStats,
    cut_points,
    encode_long,
    encode_pieces,
    supports_pieces,
)
from pipeline.core.tokenizer import QWEN25_SPECIAL_TOKENS, QWEN_SPLIT_PATTERN, load_build_tokenizer
from tests.examples import examples


@pytest.fixture(scope="module")
def backend():
    return load_build_tokenizer().backend_tokenizer


def _whole(backend, text: str) -> list[int]:
    return backend.encode(text, add_special_tokens=False).ids


_B64 = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", max_size=60)
_CODE = st.sampled_from(
    [
        "def f(x):\n    return x**2  # ok\n",
        '{"name": "grep", "args": [1, 2.5e-3]}',
        "if (a && b) { c++; }\r\n",
        "x = y  \n\n\tz;\n",
        "it's they'LL we've I'M don't",
        "2024-12-02T00:31:07Z INFO 127.0.0.1:8080 GET /a?b=1 200",
        ";\n\n",
        "!!!\n",
        "...  \t!",
    ]
)
_UNICODE = st.lists(
    st.sampled_from(
        list("é中文🙂ßΣ١٢٣")  # letters, CJK, emoji, Arabic-Indic digits
        + ["e\u0301", "\u0301", "\u0323\u0307", "\u1100\u1161", "\u11a8", "\u212b", "\u0b47"]
        + ["\u0b3e", "\u00a0", "\u2000", "\u3000", "\u0085", "\u200b", "\ufeff"]
    ),
    max_size=12,
).map("".join)
_SPACE = st.text(st.sampled_from([" ", "\t", "\n", "\r", "\x0b", "\x0c", "\u00a0"]), max_size=8)
_DIGITS = st.text("0123456789", min_size=1, max_size=8)
_SPECIAL = st.sampled_from([*QWEN25_SPECIAL_TOKENS, "<|im_", "end|>", "<tool_", "|>", "<|"])
TEXTS = st.lists(
    st.one_of(_B64, _CODE, _UNICODE, _SPACE, _DIGITS, _SPECIAL), min_size=1, max_size=40
).map("".join)


@settings(max_examples=examples(60, 200), deadline=None)
@given(TEXTS, st.integers(1, 48))
def test_pieces_cut_by_the_rule_have_the_whole_texts_ids(text, piece_chars):
    backend = load_build_tokenizer().backend_tokenizer  # cached; not a fixture (its repr is huge)
    shape = long_text._cached_shape(backend)
    cuts = cut_points(text, shape.added, piece_chars)
    assert cuts == sorted(set(cuts)) and all(0 < b < len(text) for b in cuts)
    assert encode_pieces(backend, text, cuts).tolist() == _whole(backend, text)
    # Every cut passes the run-time check too (a false alarm would cost a whole encode).
    assert [b for b in cuts if not long_text._cut_holds(backend, shape, text, b)] == []


def test_a_pre_tokenizer_boundary_alone_is_not_a_safe_cut(backend):
    """Hand-checked: ``a|··|\\t|!`` — but ``"a  \\t"`` alone is ``a|··\\t`` (the look-ahead
    of ``\\s+(?!\\S)`` sees the end of the piece instead of ``!``), so cutting before ``!``
    changes the ids. The rule cuts only after ``a`` (a tab is not printable)."""
    text = "a  \t!"
    ends = [end for _, (_, end) in backend.pre_tokenizer.pre_tokenize_str(text)]
    assert ends == [1, 3, 4, 5]
    assert encode_pieces(backend, text, [4]).tolist() != _whole(backend, text)
    assert [m.start() for m in CUT.finditer(text)] == [1]
    assert encode_pieces(backend, text, [1]).tolist() == _whole(backend, text)


def test_cuts_land_where_the_rule_says_and_never_inside_a_special_token(backend):
    added = long_text._cached_shape(backend).added
    assert cut_points("ab cd1\nef", added, 1) == [2, 5, 7]
    assert cut_points("aaaa" * 10, added, 1) == []  # one letter run: one piece
    # A token holding a space is never cut (Qwen's have none: checked on the rule alone).
    assert cut_points("x<my tok>y z", ("<my tok>",), 1) == [10]


def test_no_canonical_composition_ends_in_an_ascii_character():
    """Why NFC composes nothing across a cut before an ASCII character (Python's Unicode
    tables; the rule's normalization step): no pair decomposition ends in one (singletons
    such as U+037E -> ';' are never composed to), and ASCII is unchanged, class 0."""
    for cp in range(0x80, 0x110000):
        decomposition = unicodedata.decomposition(chr(cp))
        if decomposition and not decomposition.startswith("<"):
            parts = [int(p, 16) for p in decomposition.split()]
            assert len(parts) == 1 or parts[1] >= 0x80, hex(cp)
    ascii_ = "".join(map(chr, range(0x80)))
    assert unicodedata.normalize("NFC", ascii_) == ascii_
    assert all(unicodedata.combining(c) == 0 for c in ascii_)


@pytest.fixture
def small_pieces(monkeypatch):
    """Thresholds small enough for fast tests (the renderer's test uses the real ones)."""
    monkeypatch.setattr(long_text, "LONG_TEXT_CHARS", 4096)
    monkeypatch.setattr(long_text, "PIECE_CHARS", 512)


def test_a_long_text_is_encoded_in_pieces_with_the_same_ids(backend, small_pieces):
    line = "2024-12-02 INFO worker 7: é 中文 value=12345 <|im_end|>\n"
    text = line * 100
    stats = LongTextStats()
    ids = encode_long(backend, text, stats)
    assert ids.dtype == np.int32
    assert ids.tolist() == _whole(backend, text)
    assert (stats.cut, stats.fell_back) == (1, 0)
    assert len(cut_points(text, long_text._cached_shape(backend).added)) >= 4


def test_a_cut_that_fails_the_check_falls_back_to_the_whole_text_counted(
    backend, small_pieces, monkeypatch
):
    text = "abcdefgh" * 1000  # one letter run: any cut in it changes the ids
    monkeypatch.setattr(long_text, "CUT", re.compile(r"e"))
    stats = LongTextStats()
    assert encode_long(backend, text, stats).tolist() == _whole(backend, text)
    assert (stats.cut, stats.fell_back) == (0, 1)


def test_short_texts_and_other_tokenizers_are_encoded_whole(backend, small_pieces):
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

    stats = LongTextStats()
    assert encode_long(backend, "short 123\n", stats).tolist() == _whole(backend, "short 123\n")
    assert stats == LongTextStats()
    assert supports_pieces(backend)

    def tiny(pattern=QWEN_SPLIT_PATTERN, normalizer=None, token=None):
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        t = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
        t.normalizer = normalizer
        t.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        t.add_special_tokens([token or AddedToken("<t>")])
        return t

    assert supports_pieces(tiny()) and supports_pieces(tiny(normalizer=normalizers.NFC()))
    assert not supports_pieces(tiny(pattern=r"\s+|\S+"))  # another split rule
    assert not supports_pieces(tiny(normalizer=normalizers.NFKC()))  # not covered by the proof
    assert not supports_pieces(tiny(token=AddedToken("<t>", rstrip=True)))  # eats spaces
    big = "word 1 " * 1000
    other = tiny(pattern=r"\s+|\S+")
    assert encode_long(other, big, stats).tolist() == other.encode(big).ids
    assert stats == LongTextStats()


def test_the_renderer_encodes_long_texts_in_pieces(renderer, backend):
    short = "<|im_start|>tool\nok 1<|im_end|>\n"
    big = "<|im_start|>tool\n" + "x = 1  # 2\n" * 24_000 + "<|im_end|>\n"
    assert len(big) > long_text.LONG_TEXT_CHARS
    before = (renderer.long_texts.cut, renderer.long_texts.fell_back)
    assert [ids.tolist() for ids in renderer._encode_batch([short, big, short])] == [
        _whole(backend, short),
        _whole(backend, big),
        _whole(backend, short),
    ]
    assert (renderer.long_texts.cut, renderer.long_texts.fell_back) == (before[0] + 1, before[1])
