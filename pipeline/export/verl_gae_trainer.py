"""seam's cross-trajectory GAE inside verl's own PPO trainer (verl 0.9.1, ``main_ppo``'s v1
trainer), and a critic that loads without flash-attn.

verl 0.9.1's advantage step (``PPOTrainer._compute_advantage``) fetches the critic's
``values`` from its TransferQueue but hands a registered estimator only
``token_level_rewards``, ``response_mask``, ``config`` and ``index``, and never fetches the
rows' ``extra_info``; seam's estimators (``pipeline/export/verl_gae.py``) need both. Two of
verl's own extension points close the gap:

- **Trainer** (``verl.trainer.ppo.v1.register_trainer``, chosen with
  ``trainer.v1.trainer_mode=seam_gae``): ``SeamGAETrainer`` is verl's synchronous trainer
  (``PPOTrainerSync``) whose advantage step, for ``algorithm.adv_estimator`` one of seam's,
  also fetches each row's ``extra_info`` (the export's ``trainable_tokens_after`` and
  ``rollout_trainable_tokens``, stored by verl's agent loop next to its output) and calls
  the estimator with ``values=`` and ``non_tensor_batch=`` (``seam_advantage``); every
  other estimator runs verl's own step unchanged. The rest of the step -- the KL penalty in
  the reward, rollout correction, the nested write-back -- is verl's, called as verl's step
  calls it.
- **Critic** (``verl.workers.engine.EngineRegistry``, keyed by device and vendor; a
  vendor key wins over verl's device-only one): verl's ``load_valuehead_model`` passes
  ``attn_implementation="flash_attention_2"`` to ``from_pretrained`` whatever the config
  says, so without flash-attn the value model cannot be built. ``SeamValueEngine`` is
  verl's ``FSDPEngineWithValueHead`` whose module is built by verl's own ``_build_module``
  with that one loader replaced for the call by ``load_value_model``, which loads the same
  ``AutoModelForTokenClassification`` (one label: the value head) with the attention of
  verl's model config -- ``critic.model.override_config.attn_implementation`` (``sdpa`` or
  ``eager``; verl's default stays ``flash_attention_2``).

``pipeline/export/verl_gae.py`` imports this module when verl is installed, so
``VERL_USE_EXTERNAL_MODULES=pipeline.export.verl_gae`` registers the estimators, the
trainer and the critic engine in every verl process (docs/training.md has the command).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import verl.utils.model as verl_model
from omegaconf import open_dict
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead
from verl.workers.utils.padding import response_to_nested

from pipeline.export.verl_gae import ESTIMATORS, seam_advantage

TRAINER_MODE = "seam_gae"
# What verl's v1 advantage step fetches from its TransferQueue, plus the rows' extra_info.
FIELDS = [
    "uid",
    "response_mask",
    "rm_scores",
    "rollout_log_probs",
    "old_log_probs",
    "ref_log_prob",
    "values",
    "extra_info",
]


def _rows(column: Any) -> list:
    """A stored non-tensor column (tensordict's ``NonTensorStack``, or a list) as a list."""
    return column.tolist() if hasattr(column, "tolist") else list(column)


def advantage_step(
    stored: TensorDict, algorithm: Any, kl_ctrl: Any = None, metrics: dict | None = None
) -> TensorDict:
    """seam's advantage step on the fields ``FIELDS`` as verl's TransferQueue returns them
    (nested, response-length tensors; ``uid`` and ``extra_info`` one entry per row):
    ``advantages`` and ``returns`` (plus what verl's step also writes back), nested again.

    As verl 0.9.1's ``PPOTrainer._compute_advantage``: scores become rewards (with the KL
    penalty when ``algorithm.use_kl_in_reward``), rollout correction when configured, then
    the estimator -- here ``seam_advantage``, which passes ``values`` and the rows'
    ``extra_info``. ``kl_ctrl`` is the trainer's ``kl_ctrl_in_reward``."""
    metrics = {} if metrics is None else metrics
    response_mask = stored["response_mask"]
    extra_info = _rows(stored.pop("extra_info"))
    data = DataProto(batch=stored.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    data.non_tensor_batch["extra_info"] = np.array(extra_info, dtype=object)
    if algorithm.use_kl_in_reward:
        data, kl_metrics = apply_kl_penalty(data, kl_ctrl=kl_ctrl, kl_penalty=algorithm.kl_penalty)
        metrics.update(kl_metrics)
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    correction = algorithm.get("rollout_correction", None)
    rollout_correction = (
        correction is not None
        and "rollout_log_probs" in data.batch
        and not correction.get("bypass_mode", False)
    )
    if rollout_correction:
        data, is_metrics = compute_rollout_correction_and_add_to_batch(data, correction)
        metrics.update(is_metrics)
    data = seam_advantage(data, algorithm)
    fields = ["advantages", "returns"]
    if algorithm.use_kl_in_reward:
        fields.append("token_level_rewards")
    if rollout_correction:
        fields.append("response_mask")
        if "rollout_is_weights" in data.batch:
            fields.append("rollout_is_weights")
    return TensorDict(
        {f: response_to_nested(data.batch[f], response_mask) for f in fields},
        batch_size=len(extra_info),
    )


@register_trainer(TRAINER_MODE)
class SeamGAETrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer with seam's advantage step for seam's estimators."""

    def __init__(self, config: Any) -> None:
        if config.algorithm.adv_estimator in ESTIMATORS and not config.critic.get("enable"):
            raise ValueError(
                f"algorithm.adv_estimator={config.algorithm.adv_estimator} needs the critic's "
                "values: set critic.enable=True"
            )
        # verl keys its synchronous behaviour (replay buffer, refills, checkpoints) on
        # trainer_mode == "sync"; once main_ppo has chosen this class, it runs as "sync".
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        if self.config.algorithm.adv_estimator not in ESTIMATORS:
            return super()._compute_advantage(batch, metrics)
        import transfer_queue as tq

        stored = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=FIELDS
        )
        output = advantage_step(
            stored, self.config.algorithm, getattr(self, "kl_ctrl_in_reward", None), metrics
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)


def load_value_model(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool):
    """The value model as verl's ``load_valuehead_model`` loads it
    (``AutoModelForTokenClassification``, the config verl set to one label), with the
    attention of ``model_config`` instead of a hard-coded flash-attn; a model without a
    token-classification class goes to verl's loader (trl's value head)."""
    from transformers import AutoModelForTokenClassification

    try:
        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path,
            torch_dtype=torch_dtype,
            config=model_config,
            attn_implementation=getattr(model_config, "_attn_implementation", None) or "sdpa",
            trust_remote_code=trust_remote_code,
        )
    except ValueError as error:
        if "Unrecognized configuration class" not in str(error):
            raise
        return VERL_LOAD_VALUEHEAD_MODEL(local_path, torch_dtype, model_config, trust_remote_code)


VERL_LOAD_VALUEHEAD_MODEL = verl_model.load_valuehead_model


@contextmanager
def _seam_value_loader() -> Iterator[None]:
    """verl's ``_build_module`` imports ``load_valuehead_model`` from ``verl.utils.model``
    when it runs: for the call, that name is ``load_value_model``."""
    verl_model.load_valuehead_model = load_value_model
    try:
        yield
    finally:
        verl_model.load_valuehead_model = VERL_LOAD_VALUEHEAD_MODEL


class SeamValueEngine(FSDPEngineWithValueHead):
    """verl's FSDP value-model engine, its module loaded with the configured attention."""

    def _build_module(self) -> Any:
        with _seam_value_loader():
            return super()._build_module()


def register_value_engine(device: str = "cuda", vendor: str = "nvidia") -> None:
    """``SeamValueEngine`` for verl's critic (``value_model``, FSDP and FSDP2) on ``device``
    of ``vendor``: verl looks up the (device, vendor) key before its device-only one.
    Idempotent (verl's registry refuses a second registration of a key)."""
    engines = EngineRegistry._engines.get("value_model", {})
    if engines.get("fsdp", {}).get((device, vendor)) is SeamValueEngine:
        return
    EngineRegistry.register(
        model_type="value_model", backend=["fsdp", "fsdp2"], device=device, vendor=vendor
    )(SeamValueEngine)


register_value_engine()
