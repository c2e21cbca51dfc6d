"""ASCII texts encoded without the normalizer (``long_text.ascii_twin``) get the real ids.

NFC is the identity on ASCII, so the twin (the same model, pre-tokenizer and added
tokens, no normalizer) must give every ASCII text the tokenizer's own ids; a text with
any other character must still go through NFC (the renderer sends it to the real one).
"""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.long_text import ascii_twin
from pipeline.core.render import ChatRenderer
from pipeline.core.tokenizer import QWEN25_SPECIAL_TOKENS, load_build_tokenizer
from tests.examples import examples

ASCII = st.lists(
    st.one_of(
        st.text(st.characters(max_codepoint=0x7F), max_size=8),
        st.sampled_from([*QWEN25_SPECIAL_TOKENS, "<|im_", "'s", "  \n", "\r\n", "123", "x y"]),
    ),
    max_size=8,
).map("".join)


def ids(backend, text: str) -> list[int]:
    return backend.encode(text, add_special_tokens=False).ids


def test_the_twin_shares_the_model_and_the_added_tokens():
    backend = load_build_tokenizer().backend_tokenizer
    twin = ascii_twin(backend)
    assert twin is not None and twin.normalizer is None
    assert twin.get_added_tokens_decoder() == backend.get_added_tokens_decoder()
    assert twin.get_vocab_size() == backend.get_vocab_size()


@settings(max_examples=examples(300, 3000), deadline=None)
@given(text=ASCII)
def test_an_ascii_text_gets_the_same_ids_without_the_normalizer(text):
    backend = load_build_tokenizer().backend_tokenizer
    assert ids(ascii_twin_of(backend), text) == ids(backend, text)


_TWINS: dict = {}


def ascii_twin_of(backend):
    if id(backend) not in _TWINS:
        _TWINS[id(backend)] = ascii_twin(backend)
    return _TWINS[id(backend)]


def test_every_ascii_character_and_pair_gets_the_same_ids():
    backend = load_build_tokenizer().backend_tokenizer
    twin = ascii_twin_of(backend)
    chars = [chr(c) for c in range(128)]
    texts = chars + [a + b for a in chars for b in string.printable]
    got = twin.encode_batch_fast(texts, add_special_tokens=False)
    want = backend.encode_batch_fast(texts, add_special_tokens=False)
    assert [e.ids for e in got] == [e.ids for e in want]


def test_the_renderer_normalizes_every_text_that_is_not_ascii():
    renderer = ChatRenderer(load_build_tokenizer())
    assert renderer.ascii_backend is not None
    texts = ["e\u0301 composes", "plain ascii", "A\u030a", "\u212b ohm", "x" * 10]
    got = [a.tolist() for a in renderer.encode_many(texts)]
    assert got == [ids(renderer.backend, t) for t in texts]
    # The twin alone would not compose them: the split by character set is needed.
    twin = renderer.ascii_backend
    assert ids(twin, "e\u0301 composes") != ids(renderer.backend, "e\u0301 composes")


def test_no_twin_for_a_tokenizer_without_a_normalizer():
    twin = ascii_twin_of(load_build_tokenizer().backend_tokenizer)
    assert ascii_twin(twin) is None  # nothing to skip
