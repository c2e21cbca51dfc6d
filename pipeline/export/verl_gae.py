"""seam's cross-trajectory GAE as verl advantage estimators (``trainer/gae.py`` in verl).

verl's built-in ``algorithm.adv_estimator=gae`` runs GAE on each row alone, with one λ for
the batch, and whitens the result. For a rollout cut into segments (one verl row each)
seam's trainer computes, per segment s with ``n_s`` trainable tokens:

    A_loc(s, t) = δ_t + γλ·A_loc(s, t+1),  δ_t = r_t + γ·V(t+1) − V(t),  V(n_s) = 0
    Â(s, t) = (γλ)^{N_{>s}} · A_loc(s, t),  returns G = A_loc + V

with the rollout's reward R on the segment's last trainable token (where verl's reward
manager puts the score: the export ends each response there) and ``N_{>s}`` the trainable
tokens of the rollout's later segments. With one λ per rollout this is GAE over the
rollout's concatenated trainable tokens (derivation in ``trainer/gae.py``). The critic
regresses on the local λ-return G, not on Â, so returns are left undiscounted.

``A_loc`` is verl's own ``compute_gae_advantage_return``: its returns are the unwhitened
advantages plus V (its advantages are whitened over the batch, which would shift the
factor's scale and sign), taken here as ``returns − values`` on trainable tokens; it
skips tokens with ``response_mask`` 0, as seam's time steps do. λ is a per-row tensor.

Three estimators are registered with verl's ``register_adv_est``:

- ``seam_gae``: λ = 1 − 1/(α·T_r), α = 1.5, T_r the rollout's trainable tokens
  (``extra_info.rollout_trainable_tokens``): one λ per rollout, seam's default;
- ``seam_gae_segment``: λ_s = 1 − 1/(α·n_s), the per-segment rule (seam's
  ``--lambda-rule segment``), kept as an option: it does not keep the credit monotone;
- ``seam_gae_fixed``: ``algorithm.lam`` for every row.

γ is ``algorithm.gamma``. Each needs ``values`` (the critic's, ``[bs, response_length]``)
and ``non_tensor_batch["extra_info"]`` (the export's, with ``trainable_tokens_after`` and
``rollout_trainable_tokens``). verl 0.9.1's ``compute_advantage`` hands a registered
estimator only ``token_level_rewards``, ``response_mask``, ``config`` and ``index`` (values
reach only its hard-coded ``gae`` branch, the non-tensor batch only ``gdpo``);
``seam_advantage`` is the call that passes both, and ``verl_gae_trainer.py`` the trainer
(``trainer.v1.trainer_mode=seam_gae``) whose advantage step makes it. Called without them,
an estimator fails with a line that says so.

Loading: ``VERL_USE_EXTERNAL_MODULES=pipeline.export.verl_gae`` makes ``import verl``
import this module in every process, which registers the estimators and, where verl's v1
trainer can be imported (it needs ``transfer_queue``), the trainer and the flash-attn-free
critic of ``verl_gae_trainer.py``. This module imports verl only inside ``register``,
``seam_advantage`` and the estimators, so seam's core install imports it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from trainer.gae import DEFAULT_ALPHA, segment_lambda

ROLLOUT, SEGMENT, FIXED = "seam_gae", "seam_gae_segment", "seam_gae_fixed"
ESTIMATORS = (ROLLOUT, SEGMENT, FIXED)


def cross_trajectory_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    trainable_tokens_after: torch.Tensor,
    gamma: float,
    lam: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Â, G)``, both ``[bs, response_length]``: verl's GAE with row i's λ ``lam[i]``,
    unwhitened, times ``(γ·lam[i])^{trainable_tokens_after[i]}``; 0 off trainable tokens."""
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    mask = response_mask.to(values.dtype)
    lam = lam.to(torch.float64)
    _, returns = compute_gae_advantage_return(
        token_level_rewards, values, mask, gamma=torch.tensor(gamma), lam=lam.to(values.dtype)
    )
    local = (returns - values) * mask
    # In float64: N_{>s} runs to thousands of tokens.
    factor = (gamma * lam) ** trainable_tokens_after.to(torch.float64)
    return (local * factor.to(values.dtype)[:, None]), returns * mask


def rows_lambda(
    rule: str, response_mask: torch.Tensor, extra_info: Any, alpha: float = DEFAULT_ALPHA
) -> torch.Tensor:
    """Per row, the adaptive λ of seam's ``segment_lambda`` under ``rule``: ``n_s`` is the
    row's trainable tokens in ``response_mask``, ``T_r`` its ``rollout_trainable_tokens``."""
    segment_tokens = response_mask.sum(-1).tolist()
    return torch.tensor(
        [
            segment_lambda(rule, int(n), int(info["rollout_trainable_tokens"]), alpha)
            for n, info in zip(segment_tokens, extra_info)
        ],
        dtype=torch.float64,
    )


def _estimate(rule, token_level_rewards, response_mask, values, non_tensor_batch, config):
    if values is None or non_tensor_batch is None or "extra_info" not in non_tensor_batch:
        raise ValueError(
            "seam's GAE needs values= (the critic's) and non_tensor_batch= with the export's "
            "extra_info; verl 0.9.1's compute_advantage passes neither to registered "
            "estimators: run main_ppo with trainer.v1.trainer_mode=seam_gae (docs/training.md)"
        )
    extra_info = non_tensor_batch["extra_info"]
    missing = {"trainable_tokens_after", "rollout_trainable_tokens"} - set(extra_info[0])
    if missing:
        raise ValueError(
            f"extra_info lacks {', '.join(sorted(missing))}: re-export with `seam export --to verl`"
        )
    if rule == "fixed":
        lam = torch.full((len(extra_info),), float(config.lam), dtype=torch.float64)
    else:
        lam = rows_lambda(rule, response_mask, extra_info)
    after = torch.tensor([int(info["trainable_tokens_after"]) for info in extra_info])
    return cross_trajectory_advantage_return(
        token_level_rewards, values, response_mask, after, float(config.gamma), lam
    )


def seam_gae(
    token_level_rewards, response_mask, values=None, non_tensor_batch=None, config=None, **kwargs
):
    """``seam_gae``: one adaptive λ per rollout (seam's default)."""
    return _estimate(
        "rollout", token_level_rewards, response_mask, values, non_tensor_batch, config
    )


def seam_gae_segment(
    token_level_rewards, response_mask, values=None, non_tensor_batch=None, config=None, **kwargs
):
    """``seam_gae_segment``: one adaptive λ per segment (the option; not monotone)."""
    return _estimate(
        "segment", token_level_rewards, response_mask, values, non_tensor_batch, config
    )


def seam_gae_fixed(
    token_level_rewards, response_mask, values=None, non_tensor_batch=None, config=None, **kwargs
):
    """``seam_gae_fixed``: ``algorithm.lam`` for every row."""
    return _estimate("fixed", token_level_rewards, response_mask, values, non_tensor_batch, config)


def seam_advantage(data: Any, config: Any) -> Any:
    """verl's ``DataProto`` with ``advantages`` and ``returns`` from seam's estimator
    ``config.adv_estimator``, called as verl's ``compute_advantage`` calls a registered one
    plus ``values=data.batch["values"]`` and ``non_tensor_batch=data.non_tensor_batch``
    (which holds the rows' ``extra_info``)."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    if config.adv_estimator not in ESTIMATORS:
        raise ValueError(f"{config.adv_estimator!r} is not one of seam's {', '.join(ESTIMATORS)}")
    if "values" not in data.batch:
        raise ValueError("no critic values in the batch: set critic.enable=True")
    advantages, returns = get_adv_estimator_fn(config.adv_estimator)(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        values=data.batch["values"],
        non_tensor_batch=data.non_tensor_batch,
        config=config,
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


def register() -> None:
    """Register the three estimators with verl (idempotent: the same functions each time),
    and, where verl's v1 trainer imports, seam's trainer and critic engine."""
    from verl.trainer.ppo.core_algos import register_adv_est

    for name, fn in ((ROLLOUT, seam_gae), (SEGMENT, seam_gae_segment), (FIXED, seam_gae_fixed)):
        register_adv_est(name)(fn)
    if importlib.util.find_spec("transfer_queue") is not None:
        import pipeline.export.verl_gae_trainer  # noqa: F401  (registers on import)


# verl imports this module by name (VERL_USE_EXTERNAL_MODULES); without verl there is
# nothing to register with.
if importlib.util.find_spec("verl") is not None:
    register()
