"""Throughput of seam's PPO step: tokens/s, peak memory and MFU.

On CUDA: a randomly initialised Qwen2-style model of Qwen2.5-0.5B's shape (24 layers,
hidden 896, seam's 151,665-token vocabulary, ~0.5B parameters) as policy and critic, in
bf16 autocast over fp32 master weights (``--dtype bf16``'s path; attention through torch's
sdpa, transformers' default), on synthetic rollouts written as a real RL shard and read
back. Tokens/s, MFU and the time split are ``StepMetrics``' own (what ``seam train-step
--metrics`` writes): MFU = model FLOPs of the step (``trainer/flops.py``) / (seconds ·
world · peak), the peak being the device's known dense bf16 peak (``flops.device_peak_flops``;
989 TFLOP/s on an H100/H200) or ``--peak-tflops``. ``--activation-checkpointing`` runs the
trainer's option. The first step warms up kernels and allocator and is left out of the summary.

    .venv/bin/python bench/gpu_ppo.py                                  # CUDA, 0.5b
    .venv/bin/python bench/gpu_ppo.py --device cpu --preset tiny \\
        --context 48 --generated 16 --steps 2                          # slow path, tested
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch

from pipeline.core.tokenizer import QWEN25_FIRST_SPECIAL_ID, QWEN25_SPECIAL_TOKENS
from trainer.batching import read_segments
from trainer.flops import H200_BF16_DENSE_PEAK, device_peak_flops
from trainer.models import Critic, qwen2_config
from trainer.ppo import PPOConfig, PPOTrainer
from trainer.synthetic import write_synthetic_shard

VOCAB_SIZE = QWEN25_FIRST_SPECIAL_ID + len(QWEN25_SPECIAL_TOKENS)


def build_models(preset: str, device: torch.device):
    """Policy and critic from one random initialisation (the critic shares the policy's body)."""
    from transformers import Qwen2ForCausalLM, Qwen2Model

    config = qwen2_config(preset, VOCAB_SIZE)
    torch.manual_seed(0)
    with device:  # initialise in place: a 0.5B model's random init is slow on the host
        policy = Qwen2ForCausalLM(config)
        critic = Critic(Qwen2Model(config))
    critic.backbone.load_state_dict(policy.model.state_dict())
    return policy.train(), critic.train()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument(
        "--preset", choices=["tiny", "0.5b"], help="Default: 0.5b on cuda, tiny on cpu."
    )
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--segments-per-rollout", type=int, default=2)
    parser.add_argument("--context", type=int, default=3072, help="Context tokens per segment.")
    parser.add_argument("--generated", type=int, default=1024, help="Trainable tokens per segment.")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--peak-tflops", type=float, help="Default: the device's known bf16 peak, else 989."
    )
    parser.add_argument("--activation-checkpointing", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    preset = args.preset or ("0.5b" if device.type == "cuda" else "tiny")

    policy, critic = build_models(preset, device)
    params = sum(p.numel() for p in policy.parameters())
    shapes = [[(args.context, args.generated)] * args.segments_per_rollout] * args.rollouts
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_shard(tmp, shapes, VOCAB_SIZE, seed=0)
        segments = read_segments(tmp)
    trainer = PPOTrainer(
        policy,
        critic,
        PPOConfig(
            bf16=device.type == "cuda",
            micro_batch_tokens=args.micro_batch_tokens,
            activation_checkpointing=args.activation_checkpointing,
        ),
        device,
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    print(
        f"PPO step bench: {preset} ({params / 1e6:.0f}M parameters), {device}, "
        f"{len(segments)} segments x {args.context + args.generated} tokens, micro-batch {args.micro_batch_tokens} tokens"
    )
    name = torch.cuda.get_device_name() if device.type == "cuda" else None
    peak = (
        args.peak_tflops * 1e12
        if args.peak_tflops
        else device_peak_flops(name) or H200_BF16_DENSE_PEAK
    )
    steps = []
    for _ in range(args.steps):
        m = trainer.step(segments)
        steps.append(m)
        print(
            f"step {m.step}: {m.seconds:7.2f} s  {m.tokens_per_s:10,.0f} tokens/s  "
            f"{m.model_flops / m.seconds / 1e12:8.2f} TFLOP/s  MFU {m.mfu(peak):6.1%}  "
            f"policy loss {m.policy_loss:+.4f}  value loss {m.value_loss:.4f}  "
            f"fwd/bwd/opt {m.forward_seconds:.2f}/{m.backward_seconds:.2f}/{m.optimizer_seconds:.2f} s"
        )
    timed = steps[1:] or steps
    seconds = sum(m.seconds for m in timed)
    summary = dict(
        device=str(device),
        gpu=name,
        preset=preset,
        parameters=params,
        tokens_per_step=timed[0].tokens,
        trainable_tokens_per_step=timed[0].trainable_tokens,
        tokens_per_s=sum(m.tokens for m in timed) / seconds,
        mfu=sum(m.model_flops for m in timed) / (seconds * peak),
        peak_tflops=peak / 1e12,
        activation_checkpointing=args.activation_checkpointing,
        seconds_split={
            part: sum(getattr(m, f"{part}_seconds") for m in timed)
            for part in ("forward", "backward", "optimizer")
        },
        peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30
        if device.type == "cuda"
        else None,
    )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
