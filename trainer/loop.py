"""The training run: plan the steps, read each step's rows, train, checkpoint, resume.

``seam train-step`` and the distributed test worker both run this loop. The plan is a
pure function of the build's index and the plan options (``batching.plan_steps``), and
step k of a longer plan equals step k of a shorter one, so the **plan cursor** is the
number of steps done: a resumed run recomputes the plan and starts at the checkpoint's
step. The checkpoint records the plan options and a fingerprint of the index; resuming
with other options or another build is refused, since the cursor would then point into
a different sequence of steps. ``steps`` counts from the start of the run, so resuming a
run of ``--steps 4`` from its step-2 checkpoint trains steps 3 and 4.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer import checkpoint, distributed
from trainer.batching import plan_steps
from trainer.ppo import PPOTrainer, StepMetrics
from trainer.ppo_config import PlanOptions  # the run's plan, with its flags
from trainer.streaming import ShardIndex, read_rows, split_step


@dataclass(frozen=True)
class Checkpointing:
    directory: Path
    every: int | None = None  # also after the run's last step
    resume: bool = False


class RunError(ValueError):
    """A run that cannot start or continue, in one line."""


def run(
    trainer: PPOTrainer,
    index: ShardIndex,
    plan: PlanOptions,
    rank: int = 0,
    world: int = 1,
    checkpoints: Checkpointing | None = None,
    model_dirs: dict[str, str | Path] | None = None,
    vocab_size: int | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
) -> list[StepMetrics]:
    """Train steps ``[start, plan.steps)``; start is 0, or the resumed checkpoint's step."""
    steps = plan_steps(
        index.segments,
        plan.rollouts_per_step,
        plan.steps,
        plan.max_step_tokens,
        plan.shuffle_seed,
    )
    options = dict(
        rollouts_per_step=plan.rollouts_per_step,
        max_step_tokens=plan.max_step_tokens,
        shuffle_seed=plan.shuffle_seed,
        index=checkpoint.index_fingerprint(index.segments),
    )
    start = 0
    if checkpoints is not None:
        start = _start(trainer, checkpoints, options, steps)
    history = []
    for number in range(start, plan.steps):
        began = time.perf_counter()
        share = split_step(steps[number], world, trainer.config.micro_batch_tokens)[rank]
        segments = read_rows(index, share.segments)
        top = max((int(s.input_ids.max()) for s in segments), default=0)
        if vocab_size is not None and top >= vocab_size:
            raise RunError(
                f"the shards hold token id {top} but the model has a vocabulary of {vocab_size}: "
                "build the shards with the model's tokenizer"
            )
        (data_seconds,) = distributed.global_max([time.perf_counter() - began], trainer.device)
        metrics = trainer.step(segments, list(share.micro_batches))
        metrics = dataclasses.replace(
            metrics,
            rollouts=len({s.rollout_id for s in steps[number]}),
            data_seconds=data_seconds,
        )
        history.append(metrics)
        if on_step is not None:
            on_step(metrics)
        done = number + 1
        if checkpoints is not None and (
            done == plan.steps or (checkpoints.every and done % checkpoints.every == 0)
        ):
            cursor = sum(len(s) for s in steps[:done])
            checkpoint.save(checkpoints.directory, trainer, done, options, cursor, model_dirs or {})
    return history


def _start(trainer: PPOTrainer, checkpoints: Checkpointing, options: dict, steps) -> int:
    has_latest = (checkpoints.directory / checkpoint.LATEST).is_file()
    if not checkpoints.resume:
        if has_latest:
            raise RunError(
                f"{checkpoints.directory} already holds checkpoints: pass --resume to continue "
                "that run, or choose another --checkpoint-dir"
            )
        return 0
    if not has_latest:
        raise RunError(
            f"--resume: {checkpoints.directory} holds no checkpoint ({checkpoint.LATEST})"
        )
    meta = checkpoint.read_meta(checkpoint.resolve(checkpoints.directory))
    if meta["plan"] != options:
        changed = sorted(k for k in options if meta["plan"].get(k) != options[k])
        raise RunError(
            f"--resume: the checkpoint's plan differs in {', '.join(changed)} "
            "(the same build and plan options are needed to continue its plan)"
        )
    checkpoint.load(checkpoints.directory, trainer)
    start = int(meta["step"])
    if start < len(steps) and meta["cursor"] != sum(len(s) for s in steps[:start]):
        raise RunError("--resume: the checkpoint's plan cursor does not match the plan")
    return start
