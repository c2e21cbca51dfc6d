"""``seam train-step`` and ``seam make-tiny-model``.

torch is an optional extra (``pip install 'seam-rl[train]'``): nothing here imports it at
module level, so ``seam --help`` works without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.cli.aliases import deprecated_alias
from pipeline.common.errors import UsageError

COLUMNS = [  # (header, width, formatter of a StepMetrics)
    ("step", 4, lambda m: f"{m.step}" + ("" if m.policy_updated else "w")),
    ("policy loss", 11, lambda m: f"{m.policy_loss:+.4g}"),
    ("value loss", 10, lambda m: f"{m.value_loss:.4g}"),
    ("clip frac", 9, lambda m: f"{m.clip_fraction:.3f}"),
    ("approx KL", 9, lambda m: f"{m.approx_kl:.2e}"),
    ("entropy", 7, lambda m: f"{m.entropy:.3f}"),
    ("adv mean±std", 15, lambda m: f"{m.advantage_mean:+.3f}±{m.advantage_std:.3f}"),
    ("adv min/max", 15, lambda m: f"{m.advantage_min:+.2f}/{m.advantage_max:+.2f}"),
    ("seg/roll", 8, lambda m: f"{m.segments}/{m.rollouts}"),
    ("trainable/tokens", 16, lambda m: f"{m.trainable_tokens}/{m.tokens}"),
    ("old lp logged", 13, lambda m: f"{m.shard_logprob_tokens}"),
    ("tok/s", 8, lambda m: f"{m.tokens_per_s:,.0f}"),
]


def _require_torch(command: str):
    from pipeline.common import extras

    extras.require("train", command)
    import torch

    return torch


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def _check_model_dir(flag: str, path: str) -> None:
    if not (Path(path) / "config.json").is_file():
        raise UsageError(
            f"{flag} {path}: not a Hugging Face model directory (no config.json); "
            "make one with 'seam make-tiny-model --out DIR'"
        )


def _export_hf(args) -> int:
    if args.out is None:
        raise UsageError("--export-hf needs --out DIR (where the policy and critic are written)")
    if args.dir or args.shards or args.resume:
        raise UsageError(
            "--export-hf only converts a checkpoint: give no build directory or --resume"
        )
    _require_torch("train-step --export-hf")
    _quiet_transformers()
    from trainer.checkpoint import export_hf

    try:
        written = export_hf(args.export_hf, args.out)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    print(f"wrote {written['policy']} and {written['critic']} (Hugging Face format)")
    return 0


def _peak_flops(args, device) -> float | None:
    """--peak-tflops, else the device's known dense bf16 peak; None (no MFU) when unknown."""
    from trainer.flops import device_peak_flops

    if args.peak_tflops is not None:
        return args.peak_tflops * 1e12
    if device.type == "cuda":
        import torch

        return device_peak_flops(torch.cuda.get_device_name(device))
    return None


def _columns(peak: float | None):
    columns = COLUMNS + [("|g| policy", 10, lambda m: f"{m.policy_grad_norm:.3g}")]
    if peak:
        columns.append(("MFU", 6, lambda m: f"{m.mfu(peak):.1%}"))
    return columns


def _check_options(args) -> None:
    if args.shards is None:
        raise UsageError("seam train-step needs the build directory: seam train-step DIR")
    if args.model is None:
        raise UsageError("seam train-step needs --model DIR (a Hugging Face causal LM)")
    if args.out is not None:
        raise UsageError("--out goes with --export-hf; to keep the trained models use --save DIR")
    if args.resume and args.checkpoint_dir is None:
        raise UsageError("--resume needs --checkpoint-dir (the run's checkpoints)")
    if args.checkpoint_every is not None and args.checkpoint_dir is None:
        raise UsageError("--checkpoint-every needs --checkpoint-dir")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise UsageError("--checkpoint-every must be at least 1")
    _check_model_dir("--model", args.model)
    _check_model_dir("--critic", args.critic or args.model)


def run_train_step(args) -> int:
    if args.export_hf is not None:
        return _export_hf(args)
    args.shards = args.dir or args.shards
    torch = _require_torch("train-step")  # a missing extra is named before any option check
    _check_options(args)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
    from rich.table import Table

    from pipeline.common.options import config_from_args
    from trainer import distributed
    from trainer.loop import Checkpointing, PlanOptions, RunError, run
    from trainer.models import Critic, load_policy
    from trainer.ppo import PPOConfig, PPOTrainer
    from trainer.streaming import build_index

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible to torch")
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    try:
        # Every hyperparameter from its flag (trainer/ppo_config.py); bf16 from --dtype.
        config = config_from_args(PPOConfig, args, bf16=dtype == "bf16")
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    try:
        index = build_index(
            args.shards
        )  # sizes and places only; a step's rows are read when it runs
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    _quiet_transformers()
    rank, world = 0, 1
    if distributed.launched_by_torchrun():
        if args.save:
            raise UsageError(
                "--save under torchrun: use --checkpoint-dir DIR, then "
                "'seam train-step --export-hf DIR --out OUT'"
            )
        rank, world = distributed.init(device)
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    trainer = PPOTrainer(
        load_policy(args.model, device),
        Critic.from_pretrained(args.critic or args.model, device),
        config,
        device,
        sharded=world > 1,
    )
    vocab = trainer.policy.get_input_embeddings().num_embeddings

    console = Console(quiet=rank != 0)
    if (
        not console.is_terminal
    ):  # logs and make: rich would otherwise squeeze the table into 80 columns
        console = Console(width=200, quiet=rank != 0)
    peak = _peak_flops(args, device)
    columns = _columns(peak)
    console.print(
        f"[bold]seam train-step[/]: {len(index.segments)} segments from {args.shards}, model {args.model}, "
        f"device {device}, {dtype}, λ "
        f"{f'adaptive per {args.lambda_rule} (α={args.alpha:g})' if args.lam is None else args.lam}, "
        f"{config.critic_updates} critic updates per policy update"
        + (f", {world} ranks" if world > 1 else "")
    )
    metrics_file = open(args.metrics, "a") if args.metrics and rank == 0 else None  # noqa: SIM115
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=rank != 0 or not console.is_terminal,
    )
    task = progress.add_task("PPO steps", total=args.steps)
    printed = [False]

    def on_step(m) -> None:
        table = Table(show_header=not printed[0], box=None, pad_edge=False)
        for header, width, _ in columns:
            table.add_column(header, width=width, justify="right", no_wrap=True)
        table.add_row(*(fmt(m) for _, _, fmt in columns))
        progress.console.print(table)
        printed[0] = True
        progress.update(task, completed=m.step)
        if metrics_file is not None:
            metrics_file.write(json.dumps(m.record(peak)) + "\n")
            metrics_file.flush()

    checkpoints = None
    if args.checkpoint_dir is not None:
        checkpoints = Checkpointing(Path(args.checkpoint_dir), args.checkpoint_every, args.resume)
    try:
        with progress:
            history = run(
                trainer,
                index,
                config_from_args(PlanOptions, args),
                rank,
                world,
                checkpoints=checkpoints,
                model_dirs={"policy": args.model, "critic": args.critic or args.model},
                vocab_size=vocab,
                on_step=on_step,
            )
    except (RunError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    finally:
        if metrics_file is not None:
            metrics_file.close()
    if not history:
        console.print(
            f"nothing to do: the checkpoint is at step {trainer.steps_done} of {args.steps}"
        )
    if config.critic_warmup_steps:
        console.print("w = critic warm-up step: the policy was not updated")
    if checkpoints is not None and history:
        console.print(f"checkpoint: {args.checkpoint_dir}/latest (step {trainer.steps_done})")
    if args.save:
        trainer.save(args.save, args.model)
        console.print(f"saved {args.save}/policy and {args.save}/critic")
    return 0


def run_make_tiny_model(args) -> int:
    _require_torch("make-tiny-model")
    _quiet_transformers()
    from trainer.models import build_tiny_model

    out_dir = Path(args.out)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
        raise UsageError(
            f"--out {out_dir}: exists and is not a model directory; choose another path"
        )
    out = build_tiny_model(args.out, preset=args.preset, seed=args.seed)
    print(
        f"wrote a randomly initialised Qwen2-style model ({args.preset}) with seam's tokenizer to {out}"
    )
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "train-step",
        help="Run PPO steps (critic, cross-trajectory GAE, token-level loss) on RL shards.",
        description="Train a local causal LM with PPO on seam's RL shards: cross-trajectory GAE per segment, "
        "clipped surrogate normalised per token over the whole batch, clipped value loss. Prints metrics per step.",
    )
    p.add_argument(
        "dir",
        nargs="?",
        metavar="DIR",
        help="A build directory with train-*.parquet RL shards (seam build-rl).",
    )
    deprecated_alias(p, "--shards", "the build directory as the first argument", dest="shards")
    p.add_argument("--model", help="Local Hugging Face causal LM directory (the policy).")
    p.add_argument(
        "--critic",
        help="Critic directory: a saved critic, or a causal LM to start one from (default: --model).",
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="Default: cuda when available, else cpu. bf16 autocast on cuda.",
    )
    p.add_argument(
        "--save", help="Write the updated policy and critic to DIR/policy and DIR/critic."
    )
    from pipeline.common.options import add_options
    from trainer.ppo_config import PlanOptions, PPOConfig

    add_options(p, PlanOptions)  # the run's plan and the PPO hyperparameters: one
    add_options(p, PPOConfig)  # definition each, with the trainer's defaults
    p.add_argument(
        "--peak-tflops",
        type=float,
        help="Peak of one device for MFU, TFLOP/s (default: the GPU's known dense bf16 peak, "
        "e.g. 989 for an H100/H200; no MFU on CPU unless given).",
    )
    p.add_argument(
        "--dtype",
        choices=["fp32", "bf16"],
        help="Compute dtype (default: bf16 on cuda, fp32 on cpu). bf16: autocast over fp32 "
        "master weights; under torchrun also bf16 parameters with fp32 gradient reduction.",
    )
    p.add_argument(
        "--metrics", help="Append one JSON object per step to this file (JSONL; rank 0)."
    )
    p.add_argument(
        "--checkpoint-dir",
        help="Write DCP checkpoints here (models, optimizers, step, RNG, plan cursor) after "
        "the last step and every --checkpoint-every steps; DIR/latest names the newest.",
    )
    p.add_argument("--checkpoint-every", type=int, help="Checkpoint every N steps.")
    p.add_argument(
        "--resume",
        action="store_true",
        help="Continue the run in --checkpoint-dir from its latest checkpoint (any world size); "
        "--steps counts from the run's first step.",
    )
    p.add_argument(
        "--export-hf",
        metavar="CKPT",
        help="Instead of training: write the policy and critic of checkpoint CKPT (a "
        "--checkpoint-dir, or one step-N directory in it) to --out DIR/policy and DIR/critic "
        "in Hugging Face format.",
    )
    p.add_argument("--out", help="Output directory of --export-hf.")
    p.add_argument(
        "--seed", type=int, default=0, help="Seed of torch's random generators (default 0)."
    )
    p.set_defaults(func=run_train_step)

    t = sub.add_parser(
        "make-tiny-model",
        help="Write a tiny randomly initialised Qwen2-style model (no download).",
        description="Build a randomly initialised Qwen2-style causal LM with seam's tokenizer "
        "(Qwen2.5 vocabulary) locally, for train-step demos and tests.",
    )
    t.add_argument("--out", required=True, help="Output directory.")
    t.add_argument(
        "--preset",
        choices=["tiny", "0.5b"],
        default="tiny",
        help="Model shape (default tiny: 2 layers, hidden 64).",
    )
    t.add_argument(
        "--seed", type=int, default=0, help="Seed of the random initialisation (default 0)."
    )
    t.set_defaults(func=run_make_tiny_model)
