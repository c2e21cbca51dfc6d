"""Log-probs from the model's own head: a bias and Gemma's soft-capping give the model's forward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainer.models import PolicyLogprobs  # noqa: E402


def _reference(model, ids):
    logits = model(input_ids=ids[None], use_cache=False).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]


def _check(model):
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (12,))
    positions = torch.arange(11)
    with torch.no_grad():
        got, _ = PolicyLogprobs(model).eval()(ids, torch.arange(12), positions, ids[1:])
        torch.testing.assert_close(got, _reference(model.eval(), ids), rtol=1e-5, atol=1e-5)


# One decoder layer of a tiny model (both architectures below).
SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)


def test_a_head_with_a_bias():
    config = transformers.Qwen2Config(**SMALL, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    model.lm_head = torch.nn.Linear(32, 96, bias=True)
    torch.nn.init.normal_(model.lm_head.bias, std=3.0)  # large enough to change every log-prob
    _check(model)


def test_gemma2_final_logit_softcapping():
    config = transformers.Gemma2Config(**SMALL, head_dim=16, final_logit_softcapping=0.5)
    torch.manual_seed(0)
    _check(transformers.Gemma2ForCausalLM(config))
