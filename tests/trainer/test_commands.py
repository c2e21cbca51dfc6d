"""``seam make-tiny-model``, ``seam train-step`` and the GPU bench's CPU path, end to end."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pipeline.cli import main
from trainer.synthetic import write_synthetic_shard

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 151665


@pytest.mark.slow
def test_make_tiny_model_then_two_train_steps_print_a_metrics_row_each(tmp_path, capsys):
    assert main(["make-tiny-model", "--out", str(tmp_path / "model")]) == 0
    write_synthetic_shard(
        tmp_path / "rl", [[(20, 10), (15, 8)], [(25, 12)], [(18, 6)]], VOCAB, with_logprobs=True
    )
    argv = [
        "train-step",
        str(tmp_path / "rl"),
        "--model",
        str(tmp_path / "model"),
        "--steps",
        "2",
        "--device",
        "cpu",
        "--rollouts-per-step",
        "2",
        "--save",
        str(tmp_path / "saved"),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "policy loss" in line)
    for column in (
        "value loss",
        "clip frac",
        "approx KL",
        "entropy",
        "adv mean±std",
        "trainable/tokens",
        "old lp logged",
        "tok/s",
        "|g| policy",
    ):
        assert column in header
    rows = [
        line.split() for line in out.splitlines() if line.split() and line.split()[0] in ("1", "2")
    ]
    assert [row[0] for row in rows] == ["1", "2"]
    assert rows[0][-4:-2] == [
        "30/90",
        "30",
    ]  # step 1: rollout r0000 (2 segments) and r0001, all logged
    assert (tmp_path / "saved" / "critic" / "value_head.safetensors").exists()


def test_train_step_reports_a_missing_shard_directory_in_one_line(tmp_path, tiny_model_dir, capsys):
    assert (
        main(
            [
                "train-step",
                str(tmp_path),
                "--model",
                str(tiny_model_dir),
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no train-*.parquet shards" in err[0]


def test_train_step_refuses_shards_tokenized_for_a_larger_vocabulary(
    tmp_path, tiny_model_dir, capsys
):
    write_synthetic_shard(tmp_path, [[(8, 4)]], vocab_size=10 * VOCAB)
    assert (
        main(
            [
                "train-step",
                str(tmp_path),
                "--model",
                str(tiny_model_dir),
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    assert "build the shards with the model's tokenizer" in capsys.readouterr().err


def test_seam_help_works_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from pipeline.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as exc:\n    sys.exit(exc.code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "train-step" in result.stdout and "make-tiny-model" in result.stdout


@pytest.mark.slow
def test_gpu_bench_runs_on_cpu_with_the_tiny_config(capsys):
    spec = importlib.util.spec_from_file_location("gpu_ppo", ROOT / "bench" / "gpu_ppo.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    summary = bench.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--rollouts",
            "2",
            "--context",
            "24",
            "--generated",
            "8",
            "--steps",
            "2",
        ]
    )
    assert (
        summary["tokens_per_step"] == 2 * 2 * 32
        and summary["trainable_tokens_per_step"] == 2 * 2 * 8
    )
    assert summary["tokens_per_s"] > 0 and 0 < summary["mfu"] < 1
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary


def test_train_step_writes_metrics_checkpoints_resumes_and_exports(
    tmp_path, small_vocab_model_dir, capsys
):
    from transformers import AutoModelForCausalLM

    from tests.trainer.conftest import SMALL_VOCAB

    write_synthetic_shard(
        tmp_path / "rl",
        [[(20, 10), (15, 8)], [(25, 12)], [(18, 6)]],
        SMALL_VOCAB,
        with_logprobs=True,
    )
    argv = [
        "train-step",
        str(tmp_path / "rl"),
        "--model",
        str(small_vocab_model_dir),
        "--device",
        "cpu",
        "--rollouts-per-step",
        "1",
        "--metrics",
        str(tmp_path / "metrics.jsonl"),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--peak-tflops",
        "1",
    ]
    assert main([*argv, "--steps", "1"]) == 0
    assert main([*argv, "--steps", "2", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "MFU" in out and "checkpoint: " in out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
        assert r["mfu"] == pytest.approx(r["model_flops"] / (r["seconds"] * 1e12))
        parts = [r[f"{k}_seconds"] for k in ("forward", "backward", "optimizer", "other")]
        assert min(parts) >= 0 and sum(parts) == pytest.approx(r["seconds"])
        assert r["policy_grad_norm"] > 0 and r["critic_grad_norm"] > 0 and r["data_seconds"] > 0
        assert {"policy_loss", "value_loss", "clip_fraction", "approx_kl"} <= r.keys()
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step-00000002"
    export = ["train-step", "--export-hf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]
    assert main(export) == 0
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "policy", local_files_only=True)
    assert policy.config.vocab_size == SMALL_VOCAB


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint-dir"),
        (["--out", "x"], "--out goes with --export-hf"),
    ],
)
def test_train_step_refuses_inconsistent_checkpoint_options_in_one_line(
    tmp_path, small_vocab_model_dir, capsys, extra, message
):
    argv = ["train-step", str(tmp_path), "--model", str(small_vocab_model_dir), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_export_hf_of_a_directory_without_checkpoints_fails_in_one_line(tmp_path, capsys):
    assert main(["train-step", "--export-hf", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no checkpoint here" in err[0]
