"""Model FLOPs of a step, for tokens/s → MFU.

Forward FLOPs of one packed segment of length n through a decoder of ``N`` non-embedding
parameters, ``n_layers`` layers and hidden size H (PaLM appendix B, causal attention
counted token by token):

    F_fwd = 2·N·n + 4·n_layers·H·n(n+1)/2  (+ 2·H·V per position evaluated by the LM head)

A backward pass costs twice its forward. Recomputation (checkpointing) is not model
FLOPs and is not counted, so MFU = F / (seconds · peak) is the usual, conservative one.
"""

from __future__ import annotations

from dataclasses import dataclass

H200_BF16_DENSE_PEAK = 989e12
# Dense bf16 tensor-core peaks from the vendors' data sheets (FLOP/s, no sparsity), matched
# against ``torch.cuda.get_device_name()`` in this order (the first substring that occurs).
KNOWN_BF16_PEAKS = (
    ("H200", H200_BF16_DENSE_PEAK),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM / HBM3
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
)


def device_peak_flops(device_name: str | None) -> float | None:
    """The known dense bf16 peak of a CUDA device by name; None when unknown (or on CPU)."""
    if not device_name:
        return None
    for marker, peak in KNOWN_BF16_PEAKS:
        if marker in device_name:
            return peak
    return None


@dataclass(frozen=True)
class ModelShape:
    non_embedding_params: int
    num_layers: int
    hidden_size: int
    vocab_size: int

    @classmethod
    def of(cls, model) -> ModelShape:
        """Shape of a Hugging Face model (policy or critic backbone)."""
        # The embedding is a lookup and the LM head is counted per evaluated position, so
        # both leave the body count (once each: parameters() already dedups tied weights).
        tables = {id(model.get_input_embeddings().weight)}
        if model.get_output_embeddings() is not None:
            tables.add(id(model.get_output_embeddings().weight))
        body = sum(p.numel() for p in model.parameters() if id(p) not in tables)
        config = model.config
        return cls(body, config.num_hidden_layers, config.hidden_size, config.vocab_size)

    def forward_flops(self, segment_lengths: list[int], lm_head_positions: int) -> float:
        """``F_fwd`` summed over segments; ``lm_head_positions`` positions go through the LM head."""
        body = sum(
            2 * self.non_embedding_params * n + 2 * self.num_layers * self.hidden_size * n * (n + 1)
            for n in segment_lengths
        )
        return float(body + 2 * self.hidden_size * self.vocab_size * lm_head_positions)
