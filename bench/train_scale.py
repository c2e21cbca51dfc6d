"""seam train-step at 1x and 10x data: global tokens/s and per-rank peak memory.

Issue 25 asks that memory per rank be bounded by the step, not the dataset. This runs the
real command, ``torchrun --nproc_per_node=RANKS -m bench.train_rank DIR ...`` (seam's
``train-step`` under FSDP2, gloo on CPU), on a synthetic RL shard (``trainer/synthetic``:
real shard schema, ids below a 512-token vocabulary) and on the same rows copied ten times
under new rollout ids, with the same number of steps. Tokens/s is the mean of the steps'
``tokens_per_s`` from ``--metrics`` (the first step, warm-up, left out); each rank's peak is
its process's ``VmHWM`` (peak resident set, Arrow's buffers and torch's included) written
by ``bench/train_rank.py`` when the command returns. The tiny model keeps the run to about
a minute on two cores; it measures the data path and the trainer's overhead, not a GPU's
arithmetic (``bench/gpu_ppo.py`` does that on a device).

    .venv/bin/python -m bench.train_scale            # 2 ranks, 4 steps at 1x and 10x
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

VOCAB = 512
# 24 rollouts of two segments (context, generated): 3,600 tokens each, 86k tokens per copy
ROLLOUTS = [[(900, 300), (1_600, 800)] for _ in range(24)]


def tiny_model(out: Path) -> Path:
    """The tests' small-vocabulary tiny Qwen2 (tests/trainer/conftest.py's shape)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from trainer.models import qwen2_config

    torch.manual_seed(0)
    Qwen2ForCausalLM(qwen2_config("tiny", VOCAB)).save_pretrained(out)
    (out / "tokenizer_config.json").write_text('{"model_max_length": 32768}\n')
    return out


def replicate(src: Path, dst: Path, copies: int) -> Path:
    """One shard holding ``copies`` renamed copies of a build's rows (cheap 10x data)."""
    from trainer.synthetic import write_synthetic_shard

    if not (src / "train-00000-of-00001.parquet").exists():
        write_synthetic_shard(src, ROLLOUTS, VOCAB, seed=5, with_logprobs=True)
    table = pq.read_table(src / "train-00000-of-00001.parquet")
    copied = [
        table.set_column(
            0, "rollout_id", pc.binary_join_element_wise(table["rollout_id"], f"-x{c}", "")
        )
        for c in range(copies)
    ]
    dst.mkdir()
    pq.write_table(pa.concat_tables(copied), dst / "train-00000-of-00001.parquet", row_group_size=8)
    return dst


def run_scale(shards: Path, model: Path, ranks: int, steps: int, work: Path) -> dict:
    metrics = work / f"{shards.name}-metrics.jsonl"
    peaks = work / f"{shards.name}-peaks"
    peaks.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
        "--standalone", "-m", "bench.train_rank", str(shards), "--model", str(model),
        "--steps", str(steps), "--device", "cpu", "--rollouts-per-step", "8",
        "--micro-batch-tokens", "4096", "--metrics", str(metrics),
    ]  # fmt: skip
    env = {**os.environ, "SEAM_PEAK_DIR": str(peaks), "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    timed = rows[1:] or rows
    rank_peaks = sorted(int(p.read_text()) for p in peaks.iterdir())
    return {
        "rows": pq.ParquetFile(shards / "train-00000-of-00001.parquet").metadata.num_rows,
        "tokens_per_s": sum(r["tokens_per_s"] for r in timed) / len(timed),
        "peak_rss_mb_per_rank": [round(kb / 1024, 1) for kb in rank_peaks],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="torchrun processes (default 2).")
    parser.add_argument("--steps", type=int, default=4, help="Steps per run (default 4).")
    parser.add_argument("--json", type=Path, help="Also write the numbers to this file.")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = tiny_model(work / "model")
        result = {}
        for name, copies in (("1x", 1), ("10x", 10)):
            shards = replicate(work / "base", work / name, copies)
            result[name] = run_scale(shards, model, args.ranks, args.steps, work)
    ratio = max(result["10x"]["peak_rss_mb_per_rank"]) / max(result["1x"]["peak_rss_mb_per_rank"])
    result["peak_ratio_10x_over_1x"] = round(ratio, 3)
    print(f"{'data':>5} {'rows':>6} {'tokens/s':>10}  peak RSS per rank (MB)")
    for name in ("1x", "10x"):
        r = result[name]
        print(f"{name:>5} {r['rows']:>6} {r['tokens_per_s']:>10,.0f}  {r['peak_rss_mb_per_rank']}")
    print(f"peak per rank, 10x / 1x: {ratio:.2f} (issue 25 bound: 1.2)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
