"""A build's tokenizer loads on a thread while the command line imports and parses
(``prefetch_build_tokenizer``): the build gets that load's tokenizer, or its error."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from pipeline.core import tokenizer as tok
from pipeline.core.tokenizer import TokenizerError, load_build_tokenizer, prefetch_build_tokenizer


def _tiny(tmp_path: Path) -> str:
    """A tokenizer directory with a two-word vocabulary (a real tokenizer.json)."""
    Tokenizer(WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(
        str(tmp_path / "tokenizer.json")
    )
    return str(tmp_path)


@pytest.fixture
def nothing_loaded():
    """A process that has loaded no build tokenizer yet (the session's is loaded again by
    whoever asks next: ~1 s once)."""
    load_build_tokenizer.cache_clear()
    yield
    tok._PREFETCHED.clear()
    load_build_tokenizer.cache_clear()


def test_the_build_gets_the_prefetched_tokenizer(tmp_path, nothing_loaded):
    spec = _tiny(tmp_path)
    prefetch_build_tokenizer(spec, "chatml-tools")
    pending = tok._PREFETCHED[(spec, "chatml-tools")]
    loaded = load_build_tokenizer(spec, "chatml-tools")
    assert loaded is pending.result() and not tok._PREFETCHED
    assert loaded.backend_tokenizer.encode("a").ids == [0]
    prefetch_build_tokenizer(spec, "chatml-tools")  # one is loaded: nothing more starts
    assert not tok._PREFETCHED


def test_a_prefetch_that_fails_fails_the_load_with_its_line(tmp_path, nothing_loaded):
    spec = _tiny(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    prefetch_build_tokenizer(spec, "chatml-tools")
    assert (spec, "chatml-tools") in tok._PREFETCHED
    with pytest.raises(TokenizerError, match=f"--tokenizer {spec}: cannot load it"):
        load_build_tokenizer(spec, "chatml-tools")


def test_no_prefetch_for_a_directory_the_build_would_refuse(tmp_path, nothing_loaded):
    prefetch_build_tokenizer(str(tmp_path / "missing"), None)  # not a directory
    prefetch_build_tokenizer(str(tmp_path), None)  # no tokenizer.json (transformers' path)
    assert not tok._PREFETCHED
