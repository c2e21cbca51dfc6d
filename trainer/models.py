"""Policy and critic: local Hugging Face causal LMs, never downloaded.

The policy is any causal LM directory whose logits are ``lm_head(hidden)``. The critic
is the same architecture's base model with a scalar value head, initialised from the
same checkpoint; the head starts at zero so the first values are V ≡ 0 and the first
advantages are the discounted terminal reward of ``gae.py``'s identity. Both are run on
packed rows (``batching.py``) and evaluated only at the positions the loss needs, so
the ``[positions, vocab]`` logits never cover context tokens.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VALUE_HEAD_FILE = "value_head.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
# Qwen2-style shapes: "tiny" for CPU tests and demos, "0.5b" is Qwen2.5-0.5B's geometry.
# A transformers causal LM (``PreTrainedModel``): its submodules and config
# (``base_model``, ``config.hidden_size``, ``get_output_embeddings``) are resolved at
# run time, which torch's ``nn.Module`` typing cannot express.
CausalLM = Any

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
}


def qwen2_config(preset: str, vocab_size: int):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,  # accepted through **kwargs
        **PRESETS[preset],
    )


def build_tiny_model(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write a randomly initialised Qwen2-style model plus seam's tokenizer to ``out_dir``.

    The vocabulary is the project tokenizer's (Qwen2.5, 151,665 tokens), so shards built
    by seam index straight into the embedding table. An existing ``out_dir`` is
    replaced (``seam make-tiny-model`` first checks that it holds a model).
    """
    from transformers import Qwen2ForCausalLM

    from pipeline.core.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    config = qwen2_config(preset, len(tokenizer))
    config.bos_token_id = config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    out = Path(out_dir)
    # Written beside the target, then renamed: an interrupted build leaves no half model.
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def load_policy(model_dir: str | Path, device: torch.device) -> CausalLM:
    from transformers import AutoModelForCausalLM

    # fp32 master weights: at lr 2e-6 a bf16 weight would round most updates away; bf16
    # is used for compute through autocast instead.
    model: CausalLM = AutoModelForCausalLM.from_pretrained(
        str(model_dir), local_files_only=True, dtype=torch.float32
    )
    return model.to(device).train()


def enable_activation_checkpointing(model: CausalLM) -> None:
    """Non-reentrant checkpointing of every decoder layer, Hugging Face's own wrapper
    (``activation_checkpointing_enable`` since transformers 5.x, ``gradient_checkpointing_enable``
    before). Non-reentrant ``torch.utils.checkpoint`` restores the RNG state for the
    recomputation, so dropout masks repeat and the gradients equal the plain backward's."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def activation_checkpointing_on(model: CausalLM) -> bool:
    flag = getattr(type(model), "is_activation_checkpointing", None)
    return bool(model.is_activation_checkpointing if flag else model.is_gradient_checkpointing)


def policy_hidden(
    policy: CausalLM, input_ids: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """Last hidden states ``[L, H]`` of one packed row."""
    out = policy.base_model(
        input_ids=input_ids[None], position_ids=position_ids[None], use_cache=False
    )
    return out.last_hidden_state[0]


def head_logits(policy: CausalLM, hidden: torch.Tensor) -> torch.Tensor:
    """The model's logits at ``hidden``: its output layer (bias included) and the final transform
    its Hugging Face ``forward`` applies — ``logit_scale`` (Cohere: ``z·s``), ``logits_scaling``
    (Granite: ``z/s``), ``final_logit_softcapping`` (Gemma 2/3: ``c·tanh(z/c)``).

    Under FSDP call it inside a sharded module's forward: there the head's weight is whole.
    """
    logits = policy.get_output_embeddings()(hidden)
    config = policy.config
    if getattr(config, "logit_scale", None):
        logits = logits * config.logit_scale
    if getattr(config, "logits_scaling", None):
        logits = logits / config.logits_scaling
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _chunk_logprobs(
    policy: CausalLM, hidden: torch.Tensor, targets: torch.Tensor, with_entropy: bool
):
    logits = head_logits(policy, hidden).float()
    logp = -F.cross_entropy(logits, targets, reduction="none")
    if not with_entropy:
        return logp, None
    with torch.no_grad():  # H = logsumexp(z) - Σ softmax(z)·z, a metric only
        entropy = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
    return logp, entropy


def token_logprobs(
    policy: CausalLM,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    with_entropy: bool = False,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log π(target | prefix)`` at the given hidden states ``[M, H]``, and optionally the entropy.

    Logits are ``head_logits``: the model's own head and final transform, so a head with a
    bias, a logit scale or soft-capping gives what the model's ``forward`` gives.
    Computed in chunks of positions; under autograd each chunk is checkpointed, so only
    one ``[chunk, vocab]`` block of logits is alive at a time (with a 151k vocabulary it
    is the largest tensor of the step). Entropy carries no gradient (a metric).
    """
    pieces = []
    for start in range(0, hidden.shape[0], chunk):
        args = (policy, hidden[start : start + chunk], targets[start : start + chunk], with_entropy)
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(*args))
    if not pieces:
        # Through the head even when empty: every parameter then gets a (zero) gradient, which
        # FSDP needs on a rank whose micro-batch is padding while the others train.
        return _chunk_logprobs(policy, hidden, targets, with_entropy)
    logp = torch.cat([p[0] for p in pieces])
    return logp, torch.cat([p[1] for p in pieces]) if with_entropy else None


class PolicyLogprobs(nn.Module):
    """The policy as one module whose forward returns log-probs (and entropy) at ``positions``.

    FSDP all-gathers a module's own parameters around its forward, so the output head and
    embeddings, owned by this root, are whole exactly while the log-probs are computed.
    """

    def __init__(self, policy: CausalLM):
        super().__init__()
        self.policy = policy

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        positions: torch.Tensor,
        targets: torch.Tensor,
        with_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = policy_hidden(self.policy, input_ids, position_ids)[positions]
        return token_logprobs(self.policy, hidden, targets, with_entropy=with_entropy)


class Critic(nn.Module):
    """Base model of the policy's architecture plus a scalar head: ``V = w·h + b``."""

    def __init__(self, backbone: CausalLM):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(backbone.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, device: torch.device) -> Critic:
        """A saved critic (with ``value_head.safetensors``) or a fresh one on a causal-LM checkpoint."""
        from safetensors.torch import load_file
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(
            str(model_dir), local_files_only=True, dtype=torch.float32
        )
        critic = cls(backbone)
        head = Path(model_dir) / VALUE_HEAD_FILE
        if head.exists():
            critic.value_head.load_state_dict(load_file(str(head)))
        return critic.to(device).train()

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Values ``[M]`` (float32) at ``positions`` of one packed row."""
        hidden = self.backbone(
            input_ids=input_ids[None], position_ids=position_ids[None], use_cache=False
        ).last_hidden_state[0, positions]
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            # fp32 whatever the parameters' compute dtype (FSDP's bf16 policy casts the head too)
            head = self.value_head
            values = F.linear(hidden.float(), head.weight.float(), head.bias.float())
            # A fresh tensor, not a view: FSDP2 hooks the root's output for its backward, and
            # warns that an in-place op on a returned view would skip that hook.
            return values.squeeze(-1).clone()

    def save_pretrained(self, out_dir: str | Path) -> None:
        from safetensors.torch import save_file

        self.backbone.save_pretrained(out_dir)
        save_file(
            {k: v.contiguous() for k, v in self.value_head.state_dict().items()},
            str(Path(out_dir) / VALUE_HEAD_FILE),
        )


def copy_tokenizer(model_dir: str | Path, out_dir: str | Path) -> None:
    """Keep a saved model directory self-contained: bring the tokenizer files along."""
    for name in TOKENIZER_FILES:
        src = Path(model_dir) / name
        if src.exists():
            shutil.copy2(src, Path(out_dir) / name)
