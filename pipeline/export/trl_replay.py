"""Train TRL's ``GRPOTrainer`` on exported seam rows instead of fresh generations.

``GRPOTrainer`` generates completions, scores them and hands ``_compute_loss`` a padded
batch. ``ReplayGRPOTrainer`` keeps everything after that point — TRL's own loss,
clipping, normalization, optimizer — and replaces generation by the recorded segments
of a ``seam export --to trl --mode grpo`` directory: ``grpo_batch`` pads them (prompts
left, completions right) into exactly the fields ``_generate_and_score_completions``
returns, with ``num_items_in_batch`` = the trainable tokens of the generation batch, which
``loss_type="dapo"`` (TRL's default) divides by: token-level normalization across
segments and micro-batches.

Needs ``trl`` (``pip install 'seam-rl[trainers]'`` in a virtualenv of its own); nothing in
seam imports this module.
"""

from __future__ import annotations

import torch
from torch.utils.data import SequentialSampler
from trl import GRPOTrainer


def _padded(rows, key, width, value, dtype, left=False):
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        seq = torch.as_tensor(row[key], dtype=dtype)
        if left:
            out[i, width - seq.numel() :] = seq
        else:
            out[i, : seq.numel()] = seq
    return out


def grpo_batch(rows: list[dict], pad_token_id: int, device="cpu") -> dict[str, torch.Tensor]:
    """The batch ``GRPOTrainer._compute_loss`` consumes, from exported rows."""
    p_len = max(len(r["prompt_ids"]) for r in rows)
    c_len = max(len(r["completion_ids"]) for r in rows)
    batch = {
        "prompt_ids": _padded(rows, "prompt_ids", p_len, pad_token_id, torch.long, left=True),
        "prompt_mask": _padded(
            [{"m": [1] * len(r["prompt_ids"])} for r in rows], "m", p_len, 0, torch.long, True
        ),
        "completion_ids": _padded(rows, "completion_ids", c_len, pad_token_id, torch.long),
        "completion_mask": _padded(rows, "completion_mask", c_len, 0, torch.long),
        # TRL pads tool_mask with 1; completion_mask already zeroes the padding.
        "tool_mask": _padded(rows, "tool_mask", c_len, 1, torch.long),
        "advantages": torch.tensor([r["advantages"] for r in rows], dtype=torch.float32),
    }
    if all(r["old_per_token_logps"] is not None for r in rows):
        batch["old_per_token_logps"] = _padded(
            rows, "old_per_token_logps", c_len, 0.0, torch.float32
        )
    trained = batch["completion_mask"] * batch["tool_mask"]
    batch["num_items_in_batch"] = trained.sum()
    return {k: v.to(device) for k, v in batch.items()}


class ReplayGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose generation step returns recorded seam rows, in order.

    ``train_dataset`` is the exported Parquet loaded with ``datasets`` (plus a ``prompt``
    column TRL's constructor looks for); ``GRPOConfig(remove_unused_columns=False)`` keeps
    the token columns. Rows without logged log-probs get old log-probs from the policy
    (TRL's own ``per_token_logps.detach()`` path, ratio 1 on the first iteration).
    """

    def _get_train_sampler(self, dataset=None):
        return SequentialSampler(dataset if dataset is not None else self.train_dataset)

    def _generate_and_score_completions(self, inputs):
        pad = self.processing_class.pad_token_id
        if pad is None:
            pad = self.processing_class.eos_token_id
        return grpo_batch(list(inputs), pad, self.accelerator.device)
