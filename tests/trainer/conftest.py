"""A tiny Qwen2-style model with seam's real tokenizer, built once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from trainer.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
