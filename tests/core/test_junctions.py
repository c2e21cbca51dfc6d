"""A piece encoded as its units (``pipeline/core/junctions.py``) has the ids of the whole piece.

The property renders generated messages with every bundled chat template (and the
Hub-style ones of ``test_render_shapes``) by shape, with texts built to sit badly at a
junction — whitespace and newlines at either end, special-token strings and halves of
them, quotes, braces, combining characters, Unicode letters, digits and spaces, empty
texts — and compares the ids of the units (and of the assistant's output text cut from
the piece, as the build encodes it) with the real tokenizer's ids of the whole text.
The mutation test shows the pair rule is what keeps them equal.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.junctions import Junctions, Piece, pair_splits
from pipeline.core.render import ChatRenderer
from pipeline.core.render_shapes import ShapeRenderer
from pipeline.core.tokenizer import CHAT_TEMPLATES, QWEN25_SPECIAL_TOKENS, load_build_tokenizer
from tests.core.test_render_shapes import LLAMA_LIKE, MACROS, chat_messages, shapes_for
from tests.examples import examples

TEMPLATES = {**CHAT_TEMPLATES, "llama-like": LLAMA_LIKE, "macros": MACROS}

ATOMS = [
    *QWEN25_SPECIAL_TOKENS,
    "<|im_",
    "end|>",
    "|>",
    "<",
    ">",
    "</",
    "tool_call>",
    "\n",
    "\n\n",
    "\r\n",
    " ",
    "  ",
    "\t",
    "\u00a0",
    "\u3000",
    "\x85",
    "\x1c",
    "\x0b",
    '"',
    "'",
    "'s",
    "{",
    "}",
    "}}",
    ":",
    ".",
    "\\",
    "\u0301",  # combining acute: composes with a preceding letter
    "\u0338",  # combining long solidus: composes with < = >
    "e\u0301",
    "é",
    "中文",
    "🙂",
    "١٢",
    "x",
    "AB",
    "7",
    "name",
]
TEXTS = st.lists(
    st.one_of(st.sampled_from(ATOMS), st.text("ab 1.\n{}\"'<>|", max_size=3)), max_size=6
).map("".join)
ARGS = st.one_of(
    TEXTS,
    st.dictionaries(
        TEXTS, st.one_of(TEXTS, st.integers(), st.none(), st.lists(TEXTS, max_size=2)), max_size=3
    ),
)


def messages() -> st.SearchStrategy[dict]:
    """A chat-message dict as ``template_message`` writes it (texts may be empty)."""
    return chat_messages(TEXTS, ARGS, 2, st.just("c0"))


@pytest.fixture(scope="module")
def backend():
    return load_build_tokenizer().backend_tokenizer


@pytest.fixture(scope="module")
def junctions(backend) -> Junctions:
    found = Junctions.for_backend(backend)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def shapes() -> dict[str, ShapeRenderer]:
    return {name: shapes_for(source) for name, source in TEMPLATES.items()}


@pytest.fixture(scope="module")
def renderers() -> dict[str, ChatRenderer]:
    return {name: ChatRenderer(load_build_tokenizer(None, name)) for name in CHAT_TEMPLATES}


def message_texts(message: dict) -> list:
    """Every text a template may place from ``message`` (a call's arguments as given)."""
    calls = [c["function"] for c in message.get("tool_calls", ())]
    return [
        message.get("content"),
        message.get("reasoning_content"),
        message.get("name"),
        *(f["name"] for f in calls),
        *(f["arguments"] for f in calls),
    ]


def whole_ids(backend, text: str) -> list[int]:
    return backend.encode(str(text), add_special_tokens=False).ids


def output_texts(renderer: ChatRenderer, message: dict) -> list[str]:
    """An assistant turn's output text and trailer, cut from its piece as the build does."""
    return list(renderer.output_text(message, None))


def mismatches(backend, junctions: Junctions, texts: list, no_texts: bool = False) -> list[str]:
    """The texts whose units' ids differ from the whole text's. ``no_texts``: the message's
    texts are all empty, so any of its cuts may be template text only."""
    bad = []
    for text in texts:
        if type(text) is not Piece:
            template_only = no_texts or text in ("", "\n", "<|im_end|>", "<|im_end|>\n")
            assert template_only, text
            continue  # encoded whole
        units = junctions.units(text)
        assert "".join(units) == text
        composed = [i for unit in units for i in whole_ids(backend, unit)]
        if composed != whole_ids(backend, text):
            bad.append(text)
    return bad


@settings(
    max_examples=examples(200, 2000),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=messages())
def test_units_have_the_ids_of_the_whole_piece(backend, junctions, shapes, renderers, message):
    for name, shape_renderer in shapes.items():
        piece = shape_renderer.piece(message)
        assert type(piece) is Piece, "these templates fill every piece in by shape"
        assert not mismatches(backend, junctions, [piece]), name
    no_texts = not any(message_texts(message))
    for name, renderer in renderers.items():
        texts = [renderer.piece(message, False, None)]
        if message["role"] == "assistant" and renderer.incremental:
            texts += output_texts(renderer, message)
        assert not mismatches(backend, junctions, texts, no_texts), name
        # And through the renderer's own encode (its cache, units), among a plain text: a
        # piece's chunks (what segments join) are its units' ids, and join to the whole's.
        batch = ["a plain text\n", *texts]
        assert renderer.junctions is not None
        for text, chunks in zip(batch, renderer.encode_units(batch)):
            assert np.concatenate(chunks).tolist() == whole_ids(backend, text), name
            units = renderer.junctions.units(text) if type(text) is Piece else [text]
            assert len(chunks) == len(units), name
        for text, ids in zip(batch, renderer.encode_many(batch)):
            assert ids.tolist() == whole_ids(backend, text), name


# Each is cut wrongly when the pair rule is skipped: whitespace that joins the template's
# newline, a newline that joins punctuation, a letter that joins a quote. (No template text
# here ends in a character that composes; the property's Hub-style ones do: ``<a>`` + U+0338.)
MUTANT_KILLERS = [
    {"role": "user", "content": "\n\nhello"},
    {"role": "user", "content": "  \nindented"},
    {"role": "tool", "tool_call_id": "c0", "content": "ends with a newline\n"},
    {"role": "tool", "tool_call_id": "c0", "content": "done."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "grep", "arguments": {}}}
        ],
    },
]


@pytest.mark.parametrize("index", range(len(MUTANT_KILLERS)))
def test_skipping_the_pair_rule_gives_other_ids(backend, junctions, renderers, index):
    message = MUTANT_KILLERS[index]
    renderer = renderers["chatml-tools"]
    texts = [renderer.piece(message, False, None)]
    if message["role"] == "assistant":
        texts += output_texts(renderer, message)
    assert not mismatches(backend, junctions, texts)
    mutant = Junctions(junctions.added, junctions.overlap_free, check=lambda x, y: True)
    assert mismatches(backend, mutant, texts), message


@pytest.mark.slow  # ~13 s: every accepted pair in 90 contexts (CI's slow lane, make test-all)
def test_every_accepted_pair_splits_in_many_contexts():
    """The pair rule against the tokenizer itself: for every accepted ASCII pair, the two
    halves of ``left + x | y + right`` encode to the whole's ids, for left and right
    contexts that reach every alternative of the split pattern."""
    backend = load_build_tokenizer().backend_tokenizer
    pairs = [
        (chr(x), chr(y))
        for x in [*range(0x21, 0x7F), 10]
        for y in [*range(0x21, 0x7F), 9, 10, 32]
        if pair_splits(chr(x), chr(y))
    ]
    assert len(pairs) > 3000
    lefts = ["", "a", "1", "'", " ", "  ", "\n", "!", "x "]
    rights = ["", "a", "s", "1", " ", "  a", "\n", "\n\n", "!", "é"]
    cases = [(left + x, y + right) for x, y in pairs for left in lefts for right in rights]
    whole = backend.encode_batch_fast([a + b for a, b in cases], add_special_tokens=False)
    halves = backend.encode_batch_fast([t for ab in cases for t in ab], add_special_tokens=False)
    for i, (case, enc) in enumerate(zip(cases, whole)):
        got = halves[2 * i].ids + halves[2 * i + 1].ids
        assert got == enc.ids, case


def test_the_newline_rule_holds_for_non_ascii_and_refuses_whitespace():
    backend = load_build_tokenizer().backend_tokenizer
    for y in ["é", "\u0301", "\u0338", "中", "🙂", "١", "\u200b", "\ufeff"]:
        assert pair_splits("\n", y)
        for left in ["a\n", "}\n", " \n", "\n\n"]:
            whole = backend.encode(left + y + "x", add_special_tokens=False).ids
            parts = backend.encode_batch_fast([left, y + "x"], add_special_tokens=False)
            assert parts[0].ids + parts[1].ids == whole, (left, y)
    for y in [" ", "\t", "\n", "\u00a0", "\u3000", "\x85", "\x1c", "\x0b"]:
        assert not pair_splits("\n", y)
    assert not pair_splits("a", "\u0301")  # composes: é
    assert not pair_splits("<", "\u0338")  # composes: ≮


def test_units_are_cut_at_template_text_and_texts():
    renderer = ChatRenderer(load_build_tokenizer())
    piece = renderer.piece(
        {"role": "tool", "tool_call_id": "c0", "content": "a.py:3: x"}, False, None
    )
    assert type(piece) is Piece
    assert renderer.junctions.units(piece) == [
        "<|im_start|>user\n<tool_response>\n",
        "a.py:3: x",
        "\n</tool_response><|im_end|>\n",
    ]
    # A text starting with spaces keeps only the template's last character with it.
    piece = renderer.piece({"role": "user", "content": "  x"}, False, None)
    assert renderer.junctions.units(piece) == ["<|im_start|>user", "\n  x", "<|im_end|>\n"]


def test_units_cut_at_every_junction_are_the_parts_themselves():
    """Where every junction is cut, the units are the piece's part objects (the template's
    own strings); two template parts side by side are never cut apart (no junction rule
    covers them), so there the units are slices that keep them together."""
    renderer = ChatRenderer(load_build_tokenizer())
    piece = renderer.piece({"role": "tool", "tool_call_id": "c0", "content": "x = 1"}, False, None)
    units = renderer.junctions.units(piece)
    assert units == list(piece.parts) and all(u is p for u, p in zip(units, piece.parts))
    piece = Piece.of(["<|im_start|>", "user\n", "x = 1", "\n"], [True, True, False, True])
    assert renderer.junctions.units(piece) == ["<|im_start|>user\n", "x = 1", "\n"]


def test_a_piece_with_no_cut_is_one_unit_and_empty_is_empty():
    junctions = Junctions.for_backend(load_build_tokenizer().backend_tokenizer)
    assert junctions is not None
    piece = Piece.of(["a", "b", "c"], [True, False, True])
    assert junctions.units(piece) == ["abc"]
    assert junctions.units(Piece.of([], [])) == [""]
    cut = Piece.of(["ab", "cd"], [True, False]).cut(1, 3)
    assert type(cut) is Piece and list(cut.parts) == ["b", "c"] and list(cut.fixed) == [True, False]
    assert type(Piece.of(["ab", "cd"], [True, False]).cut(0, 2)) is str  # template text only
    assert Piece.of(["ab"], [False]).cut(1, 1) == ""
    # Every cut of a piece is its text's slice, parts non-empty and joined to it, and a
    # Piece exactly when it holds some of the message's text (else template text only).
    piece = Piece.of(["<|im_start|>user\n", "x" * 40, "<|im_end|>\n"], [True, False, True])
    text_start, text_end = len(piece.parts[0]), len(piece.parts[0]) + 40
    for start in range(len(piece) + 1):
        for end in range(start, len(piece) + 1):
            part = piece.cut(start, end)
            assert part == piece[start:end]
            assert (type(part) is Piece) == (start < end and start < text_end and end > text_start)
            if type(part) is Piece:
                assert "".join(part.parts) == part and all(part.parts)


def test_a_tokenizer_the_proof_does_not_cover_encodes_pieces_whole(monkeypatch):
    from pipeline.core import junctions

    monkeypatch.setattr(junctions, "_cached_shape", lambda backend: None)
    renderer = ChatRenderer(load_build_tokenizer())
    assert renderer.junctions is None
    piece = renderer.piece({"role": "user", "content": "hi"}, False, None)
    assert renderer.encode_many([piece])[0].tolist() == whole_ids(renderer.backend, piece)
