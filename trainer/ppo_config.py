"""The PPO step's hyperparameters (``PPOConfig``, ``trainer/ppo.py``) and the run's plan
(``PlanOptions``, ``trainer/loop.py``), each field with its ``seam train-step`` flag
(``pipeline/common/options.py``): the defaults written here are the ones the command
line shows and the trainer uses. A module of its own that imports no torch, so ``seam
--help`` lists the flags without the ``train`` extra."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.common.options import option
from trainer.gae import DEFAULT_ALPHA, LAMBDA_RULES


def _number(flag: str, kind: type, help: str) -> dict:
    return {"flag": flag, "type": kind, "help": help}


@dataclass(frozen=True)
class PPOConfig:
    policy_lr: float = option(
        2e-6,
        **_number("--policy-lr", float, "AdamW learning rate of the policy (default {default})."),
    )
    critic_lr: float = option(
        3e-6,
        **_number("--critic-lr", float, "AdamW learning rate of the critic (default {default})."),
    )
    weight_decay: float = 0.0
    clip_eps: float = option(
        0.2, **_number("--clip-eps", float, "PPO ratio clip ε (default {default}).")
    )
    value_clip: float = option(
        0.2,
        **_number("--value-clip", float, "Value clip around the old values (default {default})."),
    )
    policy_updates: int = option(  # passes over the step's batch (PPO epochs)
        1,
        **_number(
            "--policy-updates", int, "Policy updates (PPO epochs) per step (default {default})."
        ),
    )
    critic_updates: int = option(  # critic optimizer steps per policy update
        2,
        **_number("--critic-updates", int, "Critic updates per policy update (default {default})."),
    )
    critic_warmup_steps: int = option(
        0,
        **_number(
            "--critic-warmup-steps",
            int,
            "First steps that train only the critic (default {default}).",
        ),
    )
    gamma: float = option(1.0, **_number("--gamma", float, "Discount γ (default {default})."))
    # None: length-adaptive λ = 1 - 1/(α·l), l chosen by lambda_rule
    lam: float | None = option(
        None,
        flag="--lam",
        type=float,
        help="Fixed GAE λ (default: length-adaptive λ = 1 - 1/(α·l), l chosen by --lambda-rule).",
    )
    # l = the rollout's trainable tokens, or "segment": l = n_s
    lambda_rule: str = option(
        "rollout",
        flag="--lambda-rule",
        choices=LAMBDA_RULES,
        help="l of the adaptive λ: rollout (default) = the rollout's trainable tokens, one λ for "
        "all its segments (credit never decreases toward the outcome); segment = the segment's "
        "n_s (CompactionRL's per-segment rule, can starve early segments).",
    )
    alpha: float = option(
        DEFAULT_ALPHA,
        **_number("--alpha", float, "α of the length-adaptive λ (default {default})."),
    )
    max_grad_norm: float = option(
        1.0, **_number("--max-grad-norm", float, "Global gradient-norm clip (default {default}).")
    )
    micro_batch_tokens: int = option(
        4096,
        **_number(
            "--micro-batch-tokens",
            int,
            "Token budget of one packed micro-batch (default {default}).",
        ),
    )
    # ignore the shard's logprobs (e.g. a model that did not sample them)
    recompute_old_logprobs: bool = option(
        False,
        flag="--recompute-old-logprobs",
        switch=True,
        help="Take old log-probs from the policy even where the shard logged them.",
    )
    bf16: bool = False  # seam train-step: from --dtype (default: bf16 on cuda)
    activation_checkpointing: bool = option(
        False,
        flag="--activation-checkpointing",
        switch=True,
        help="Recompute each decoder layer's activations in the backward (less memory, ~1/3 "
        "more compute).",
    )

    def __post_init__(self):
        problems = [
            (self.policy_updates < 1, "policy_updates must be at least 1"),
            (self.critic_updates < 0, "critic_updates must be 0 or more"),
            (self.micro_batch_tokens < 1, "micro_batch_tokens must be positive"),
            (not 0 < self.clip_eps < 1, "clip_eps must lie in (0, 1)"),
            (self.lam is not None and not 0 <= self.lam <= 1, "lam must lie in [0, 1]"),
            (not 0 < self.gamma <= 1, "gamma must lie in (0, 1]"),
            (self.alpha <= 0, "alpha must be positive"),
            (
                self.lambda_rule not in LAMBDA_RULES,
                f"lambda_rule must be one of {', '.join(LAMBDA_RULES)}",
            ),
        ]
        for broken, message in problems:
            if broken:
                raise ValueError(message)


@dataclass(frozen=True)
class PlanOptions:
    """Which rows each step of a run trains on (``trainer.batching.plan_steps``)."""

    rollouts_per_step: int = option(
        8,
        **_number(
            "--rollouts-per-step",
            int,
            "Rollouts (all their segments) per step (default {default}).",
        ),
    )
    steps: int = option(  # total steps of the run, counted from its first step
        1, **_number("--steps", int, "PPO steps to run (default {default}).")
    )
    max_step_tokens: int | None = option(
        None,
        **_number(
            "--max-step-tokens",
            int,
            "Cap a step's tokens; the rest of a rollout moves to the next step (default: no cap).",
        ),
    )
    shuffle_seed: int | None = option(
        None,
        **_number(
            "--shuffle-seed",
            int,
            "Shuffle whole rollouts, a new permutation per pass over the data, from this seed "
            "(default: shard order).",
        ),
    )
