"""One PPO step with a critic on seam's segments (CompactionRL).

Per step, on the segments of a few whole rollouts:

1. pack the segments into micro-batches by token budget (``batching.pack``);
2. without gradients: old log-probs of the trainable tokens — the shard's ``logprobs``
   when the segment logged them, else the policy before the update — and critic values;
3. cross-trajectory GAE per segment (``gae.cross_trajectory_gae``): advantages Â and
   critic targets G;
4. ``critic_updates`` critic updates (default 2), each one optimizer step over all
   micro-batches with the clipped value loss;
5. one policy update with the clipped surrogate, or only its diagnostics during the
   first ``critic_warmup_steps`` steps (the critic learns before it steers the policy).
   Steps 4-5 repeat ``policy_updates`` times (PPO epochs; default 1), the advantages
   staying those of step 3, so from the second pass on the ratio ρ moves off 1.

Both losses are normalised per token over the whole step (``losses.token_level``):
each micro-batch adds ``Σ ℓ / |M|`` to the accumulated gradient. Gradients are clipped
by global norm; AdamW keeps separate learning rates (2e-6 policy, 3e-6 critic). With
``bf16`` the forward and backward run under bf16 autocast over fp32 master weights; when
sharded, FSDP2 also keeps bf16 copies of the parameters for compute and reduces gradients
in fp32 (``distributed.shard``). ``activation_checkpointing`` recomputes each decoder
layer's activations in the backward instead of keeping them.

Each step's time is split into forward, backward and optimizer (clip + AdamW) seconds,
measured around those calls (after a CUDA synchronize on GPU); the rest (packing, GAE,
metrics) is the step's seconds minus the three.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainer import distributed
from trainer.batching import MicroBatch, TrainingSegment, pack, pack_row
from trainer.flops import ModelShape
from trainer.gae import cross_trajectory_gae, segment_lambda
from trainer.losses import approx_kl, clipped_surrogate, clipped_value_loss, token_level
from trainer.models import (
    CausalLM,
    Critic,
    PolicyLogprobs,
    copy_tokenizer,
    enable_activation_checkpointing,
)
from trainer.ppo_config import PPOConfig  # the hyperparameters, with their flags


@dataclass
class PreparedBatch:
    """A packed micro-batch on the device, restricted to its trainable positions ``[M_mb]``."""

    batch: MicroBatch
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    positions: torch.Tensor
    targets: torch.Tensor
    old_logprobs: torch.Tensor
    old_values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    recomputed: int = (
        0  # trainable positions whose old log-prob came from the policy, not the shard
    )


@dataclass(frozen=True)
class StepMetrics:
    step: int
    policy_updated: bool
    policy_loss: float
    value_loss: float
    clip_fraction: float
    approx_kl: float
    entropy: float
    advantage_mean: float
    advantage_std: float
    advantage_min: float
    advantage_max: float
    rollouts: int
    segments: int
    tokens: int
    trainable_tokens: int
    seconds: float  # the step's wall time, the slowest rank's
    model_flops: float  # over all ranks
    shard_logprob_tokens: int  # old log-probs taken from the shard rather than recomputed
    world_size: int = 1
    policy_grad_norm: float = float("nan")  # before clipping; nan in a critic warm-up step
    critic_grad_norm: float = float("nan")  # of the last critic update
    forward_seconds: float = 0.0  # rank 0's split of ``seconds``
    backward_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    data_seconds: float = 0.0  # reading the step's rows (set by the run loop; not in ``seconds``)

    @property
    def tokens_per_s(self) -> float:
        """Global tokens per second of the step's compute (all ranks' tokens)."""
        return self.tokens / self.seconds

    def mfu(self, peak_flops: float) -> float:
        """Model FLOPs utilisation: ``F / (seconds · world · peak)``, peak per device."""
        return self.model_flops / (self.seconds * self.world_size * peak_flops)

    def record(self, peak_flops: float | None) -> dict:
        """Every field, plus ``tokens_per_s``, ``mfu`` (null without a peak) and
        ``other_seconds`` (the step's seconds outside forward, backward and optimizer)."""
        fields = {  # JSON has no NaN: a metric that does not apply is null
            k: None if isinstance(v, float) and v != v else v
            for k, v in dataclasses.asdict(self).items()
        }
        return dict(
            fields,
            tokens_per_s=self.tokens_per_s,
            mfu=self.mfu(peak_flops) if peak_flops else None,
            other_seconds=self.seconds
            - self.forward_seconds
            - self.backward_seconds
            - self.optimizer_seconds,
        )


@contextlib.contextmanager
def evaluating(*modules: torch.nn.Module):
    """The modules in eval mode (no dropout) inside the block, their own mode restored after."""
    modes = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)


EMPTY_ROW = MicroBatch(
    np.zeros(1, np.int64),
    np.zeros(1, np.int64),
    np.zeros(1, np.int64),
    np.zeros(1, bool),
    np.full(1, np.nan, np.float32),
    (),
)  # a padding micro-batch: one token, nothing to train; it still runs forward and backward


def _clip(model: torch.nn.Module, max_norm: float) -> float:
    """Clip by the global gradient norm (over all ranks' shards when sharded); the norm before."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


TIMED = ("forward", "backward", "optimizer")


class PPOTrainer:
    """The PPO step; with ``sharded`` (under torchrun) policy and critic are FSDP2-sharded and
    each rank trains its share of the step (``trainer/distributed.py``)."""

    def __init__(
        self,
        policy: CausalLM,
        critic: Critic,
        config: PPOConfig,
        device: torch.device,
        sharded: bool = False,
    ):
        self.policy, self.critic, self.config, self.device = policy, critic, config, device
        self.policy_shape = ModelShape.of(policy)
        self.critic_shape = ModelShape.of(critic.backbone)
        self.policy_lp = PolicyLogprobs(policy)
        self.loss_scale = 1.0
        self.world_size = 1
        if (
            config.activation_checkpointing
        ):  # before sharding: FSDP then wraps the checkpointed layers
            enable_activation_checkpointing(policy)
            enable_activation_checkpointing(critic.backbone)
        if sharded:
            bf16 = config.bf16
            distributed.shard(self.policy_lp, distributed.decoder_layers(policy), bf16)
            distributed.shard(critic, distributed.decoder_layers(critic.backbone), bf16)
            self.world_size = torch.distributed.get_world_size()
            self.loss_scale = float(self.world_size)
        fused = device.type == "cuda"  # one kernel for the whole update instead of one per tensor
        self.policy_opt = torch.optim.AdamW(
            policy.parameters(), lr=config.policy_lr, weight_decay=config.weight_decay, fused=fused
        )
        self.critic_opt = torch.optim.AdamW(
            critic.parameters(), lr=config.critic_lr, weight_decay=config.weight_decay, fused=fused
        )
        self.steps_done = 0
        self.times: dict[str, float] = dict.fromkeys(TIMED, 0.0)
        self.policy_grad_norm = self.critic_grad_norm = float("nan")

    @contextlib.contextmanager
    def timed(self, part: str):
        """Add the block's wall time to ``times[part]`` (CUDA work finished on both ends)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.times[part] += time.perf_counter() - started

    def autocast(self):
        if self.config.bf16:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- 1-3: pack, old log-probs, values, advantages ------------------------------------

    def prepare(
        self, segments: list[TrainingSegment], bins: list[tuple[int, ...]] | None = None
    ) -> list[PreparedBatch]:
        """Micro-batches of the step with old log-probs, old values, Â and G filled in.

        ``bins``: the micro-batches as indices into ``segments`` (``streaming.split_step``;
        ``()`` is padding); default ``pack``'s.
        """
        if bins is None:
            batches = pack(segments, self.config.micro_batch_tokens)
        else:
            batches = [pack_row([(i, segments[i]) for i in b]) if b else EMPTY_ROW for b in bins]
        prepared = [self._to_device(b) for b in batches]
        # Without dropout: the old log-probs stand for the sampling policy, which did not drop
        # units; in train mode a model with dropout would start its first update off ratio 1.
        # Every rank runs the policy on every micro-batch (FSDP's collectives must pair up).
        sharded = self.loss_scale != 1.0
        with (
            torch.no_grad(),
            self.autocast(),
            evaluating(self.policy_lp, self.critic),
            self.timed("forward"),
        ):
            for p in prepared:
                missing = torch.isnan(p.old_logprobs) | self.config.recompute_old_logprobs
                p.recomputed = int(missing.sum())
                if p.recomputed or sharded:
                    logp, _ = self.policy_lp(p.input_ids, p.position_ids, p.positions, p.targets)
                    p.old_logprobs = torch.where(missing, logp, p.old_logprobs)
                p.old_values = self.critic(p.input_ids, p.position_ids, p.positions)
        for p in prepared:
            self._fill_advantages(p, segments)
        return prepared

    def _to_device(self, batch: MicroBatch) -> PreparedBatch:
        positions = np.flatnonzero(batch.trainable)

        def as_long(array: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(array, dtype=torch.long, device=self.device)

        return PreparedBatch(
            batch,
            as_long(batch.input_ids),
            as_long(batch.position_ids),
            as_long(positions),
            as_long(batch.targets[positions]),
            torch.as_tensor(batch.old_logprobs[positions], device=self.device),
        )

    def _fill_advantages(self, p: PreparedBatch, segments: list[TrainingSegment]) -> None:
        positions = p.positions.cpu().numpy()
        assert p.old_values is not None  # filled by the critic pass (step 2)
        values = p.old_values.float().cpu().numpy()
        advantages = np.zeros_like(values, dtype=np.float64)
        returns = np.zeros_like(values, dtype=np.float64)
        for index, start, end in p.batch.spans:
            lo, hi = np.searchsorted(positions, [start, end])
            seg = segments[index]
            if hi == lo:
                continue
            lam = self.config.lam
            if lam is None:
                lam = segment_lambda(
                    self.config.lambda_rule,
                    seg.num_trainable_tokens,
                    seg.rollout_trainable_tokens,
                    self.config.alpha,
                )
            advantages[lo:hi], returns[lo:hi] = cross_trajectory_gae(
                values[lo:hi], seg.reward, seg.trainable_tokens_after, self.config.gamma, lam
            )
        p.advantages = torch.as_tensor(advantages, dtype=torch.float32, device=self.device)
        p.returns = torch.as_tensor(returns, dtype=torch.float32, device=self.device)

    # -- 4: critic -------------------------------------------------------------------------

    def critic_update(self, prepared: list[PreparedBatch], total_trainable: int) -> float:
        """One optimizer step of the critic; returns the token-level clipped value loss."""
        self.critic_opt.zero_grad(set_to_none=True)
        total = 0.0
        for p in prepared:
            with self.timed("forward"), self.autocast():
                values = self.critic(p.input_ids, p.position_ids, p.positions)
                assert p.old_values is not None and p.returns is not None  # steps 2-3
                loss = token_level(
                    clipped_value_loss(values, p.old_values, p.returns, self.config.value_clip),
                    total_trainable,
                )
            with self.timed("backward"):
                (loss * self.loss_scale).backward()
            total += loss.item()
        with self.timed("optimizer"):
            self.critic_grad_norm = _clip(self.critic, self.config.max_grad_norm)
            self.critic_opt.step()
        return distributed.global_sum([total], self.device)[0]

    # -- 5: policy -------------------------------------------------------------------------

    def policy_pass(
        self, prepared: list[PreparedBatch], total_trainable: int, update: bool
    ) -> dict[str, float]:
        """Token-level surrogate and its diagnostics; with ``update``, also one optimizer step."""
        sums = dict(policy_loss=0.0, clipped=0.0, approx_kl=0.0, entropy=0.0)
        if update:
            self.policy_opt.zero_grad(set_to_none=True)
        with contextlib.nullcontext() if update else torch.no_grad():
            for p in prepared:
                with self.timed("forward"), self.autocast():
                    logp, entropy = self.policy_lp(
                        p.input_ids, p.position_ids, p.positions, p.targets, with_entropy=True
                    )
                    assert p.advantages is not None  # step 3
                    per_token, clipped = clipped_surrogate(
                        logp, p.old_logprobs, p.advantages, self.config.clip_eps
                    )
                    loss = token_level(per_token, total_trainable)
                if update:
                    with self.timed("backward"):
                        (loss * self.loss_scale).backward()
                sums["policy_loss"] += loss.item()
                sums["clipped"] += clipped.sum().item()
                sums["approx_kl"] += approx_kl(logp.detach(), p.old_logprobs).sum().item()
                assert entropy is not None  # asked for with_entropy=True
                sums["entropy"] += entropy.sum().item()
        if update:
            with self.timed("optimizer"):
                self.policy_grad_norm = _clip(self.policy, self.config.max_grad_norm)
                self.policy_opt.step()
        keys = list(sums)
        sums = dict(zip(keys, distributed.global_sum([sums[k] for k in keys], self.device)))
        return dict(
            policy_loss=sums["policy_loss"],
            clip_fraction=sums["clipped"] / total_trainable,
            approx_kl=sums["approx_kl"] / total_trainable,
            entropy=sums["entropy"] / total_trainable,
        )

    # -- the step --------------------------------------------------------------------------

    def step(
        self, segments: list[TrainingSegment], bins: list[tuple[int, ...]] | None = None
    ) -> StepMetrics:
        """One PPO step on ``segments`` (this rank's share when sharded; ``bins`` as in ``prepare``)."""
        started = time.perf_counter()
        self.times = dict.fromkeys(TIMED, 0.0)
        self.policy_grad_norm = self.critic_grad_norm = float("nan")
        prepared = self.prepare(segments, bins)
        local = sum(int(p.positions.numel()) for p in prepared)
        total_trainable = int(distributed.global_sum([local], self.device)[0])  # |M| of the step
        if total_trainable == 0:
            raise ValueError("the step's segments have no trainable tokens")
        update_policy = self.steps_done >= self.config.critic_warmup_steps
        value_losses, passes = [], []
        for _ in range(self.config.policy_updates):
            value_losses += [
                self.critic_update(prepared, total_trainable)
                for _ in range(self.config.critic_updates)
            ]
            passes.append(self.policy_pass(prepared, total_trainable, update=update_policy))
        policy = {key: float(np.mean([p[key] for p in passes])) for key in passes[0]}
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        self.steps_done += 1

        advantages = torch.cat(
            [p.advantages for p in prepared if p.advantages is not None]
        ).double()
        count, total, squares, segs, tokens, flops, recomputed = distributed.global_sum(
            [
                advantages.numel(),
                advantages.sum().item(),
                (advantages**2).sum().item(),
                len(segments),
                sum(p.batch.num_tokens for p in prepared if p.batch.spans),
                self._step_flops(prepared, update_policy),
                sum(p.recomputed for p in prepared),
            ],
            self.device,
        )
        top, neg_bottom, seconds = distributed.global_max(
            [
                advantages.max().item() if advantages.numel() else -np.inf,
                -advantages.min().item() if advantages.numel() else -np.inf,
                seconds,
            ],
            self.device,
        )
        mean = total / count
        return StepMetrics(
            step=self.steps_done,
            policy_updated=update_policy,
            policy_loss=policy["policy_loss"],
            value_loss=float(np.mean(value_losses)) if value_losses else float("nan"),
            clip_fraction=policy["clip_fraction"],
            approx_kl=policy["approx_kl"],
            entropy=policy["entropy"],
            advantage_mean=mean,
            advantage_std=max(squares / count - mean * mean, 0.0) ** 0.5,
            advantage_min=-neg_bottom,
            advantage_max=top,
            rollouts=len(
                {s.rollout_id for s in segments}
            ),  # this rank's; the command sets the step's
            segments=int(segs),
            tokens=int(tokens),
            trainable_tokens=total_trainable,
            seconds=seconds,
            model_flops=flops,
            shard_logprob_tokens=total_trainable - int(recomputed),
            world_size=self.world_size,
            policy_grad_norm=self.policy_grad_norm,
            critic_grad_norm=self.critic_grad_norm,
            forward_seconds=self.times["forward"],
            backward_seconds=self.times["backward"],
            optimizer_seconds=self.times["optimizer"],
        )

    def _step_flops(self, prepared: list[PreparedBatch], updated: bool) -> float:
        """Model FLOPs of this rank's share of the step (``trainer/flops.py``)."""
        lengths = [end - start for p in prepared for _, start, end in p.batch.spans]
        trainable = sum(int(p.positions.numel()) for p in prepared if p.batch.spans)
        critic_fwd = self.critic_shape.forward_flops(lengths, 0)
        policy_fwd = self.policy_shape.forward_flops(lengths, trainable)
        updates = self.config.policy_updates
        flops = critic_fwd * (
            1 + 3 * self.config.critic_updates * updates
        )  # values, then fwd+bwd per update
        flops += (
            policy_fwd * (3 if updated else 1) * updates
        )  # update passes (forward only in warm-up)
        for p in prepared:  # old log-probs the shard did not log
            if p.recomputed:
                flops += self.policy_shape.forward_flops(
                    [e - s for _, s, e in p.batch.spans], int(p.positions.numel())
                )
        return flops

    def save(self, out_dir: str | Path, model_dir: str | Path) -> None:
        """``out_dir/policy`` and ``out_dir/critic``, each a loadable directory with the tokenizer."""
        for name, model in (("policy", self.policy), ("critic", self.critic)):
            target = Path(out_dir) / name
            target.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(target)
            copy_tokenizer(model_dir, target)
