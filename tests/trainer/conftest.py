"""A tiny Qwen2-style model with seam's real tokenizer, built once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread: CI runs two pytest processes on two cores, and on a shared machine
    torch's thread pool spinning against other processes made a tiny step ~10x slower."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from trainer.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


SMALL_VOCAB = 512


@pytest.fixture(scope="session")
def small_vocab_model_dir(tmp_path_factory):
    """The tiny Qwen2 shape with a 512-token vocabulary (fast steps; shards must use ids < 512)."""
    pytest.importorskip("torch")
    import torch
    from transformers import Qwen2ForCausalLM

    from trainer.models import qwen2_config

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("small-vocab-model")
    Qwen2ForCausalLM(qwen2_config("tiny", SMALL_VOCAB)).save_pretrained(out)
    (out / "tokenizer_config.json").write_text('{"model_max_length": 32768}\n')  # travels along
    return out
