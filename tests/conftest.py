"""Shared fixtures: the real tokenizer (built offline once per session) and renderers."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tokenizer():
    """The transformers tokenizer (an independent oracle for the build's own renderer)."""
    from pipeline.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def renderer():
    """The renderer exactly as the build uses it (torch-free tokenizer files)."""
    from pipeline.render import ChatRenderer
    from pipeline.tokenizer import load_build_tokenizer

    return ChatRenderer(load_build_tokenizer())


@pytest.fixture(scope="session")
def drop_reasoning_renderer():
    from pipeline.render import ChatRenderer
    from pipeline.tokenizer import load_build_tokenizer

    return ChatRenderer(load_build_tokenizer(None, "chatml-tools-drop-reasoning"))
