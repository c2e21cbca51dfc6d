"""The TRL exports run through TRL's own code (skipped where ``trl`` is not installed;
CI installs it in a virtualenv of its own, see ``.ci/run``).

GRPO: ``GRPOTrainer._get_per_token_logps_and_entropies`` on the exported batch gives the
same log-probs on every trainable token as seam's trainer on the segment alone (so tool
outputs stay visible to attention), ``GRPOTrainer._compute_loss`` gives each rollout a
share of the gradient equal to its share of trainable tokens with ``loss_type="dapo"``,
and ``ReplayGRPOTrainer`` trains two steps.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

import datasets  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from pipeline.export import export_build  # noqa: E402
from pipeline.export.trl_replay import ReplayGRPOTrainer, grpo_batch  # noqa: E402
from tests.sample_builds import shard_rows  # noqa: E402
from trainer.models import build_tiny_model, policy_hidden, token_logprobs  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def grpo_rows(rl_build, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo") / "export"
    export_build(rl_build, "trl", out, mode="grpo")
    ds = datasets.load_dataset("parquet", data_dir=str(out), split="train")
    return ds.add_column("prompt", [""] * len(ds))


def replay_trainer(model_dir, rows, tmp_path, **config):
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        use_cpu=True,
        report_to=[],
        bf16=False,
        remove_unused_columns=False,
        num_generations=2,
        logging_steps=1,
        save_strategy="no",
        **config,
    )
    return ReplayGRPOTrainer(
        model=str(model_dir),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=rows,
    )


def test_trl_log_probs_of_trainable_tokens_equal_seams_trainer(
    tiny_model, grpo_rows, rl_build, tmp_path
):
    trl = replay_trainer(tiny_model, grpo_rows, tmp_path, per_device_train_batch_size=2)
    rows, shard = list(grpo_rows), shard_rows(rl_build)
    batch = grpo_batch(rows, trl.processing_class.pad_token_id)
    model = trl.model.eval()
    with torch.no_grad():
        logps, _, _ = trl._get_per_token_logps_and_entropies(
            model,
            torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
            batch["completion_ids"].size(1),
        )
    checked = 0
    for i, segment in enumerate(shard):
        ids = torch.as_tensor(segment["input_ids"])
        loss_mask = torch.as_tensor(segment["loss_mask"], dtype=torch.bool)
        with torch.no_grad():
            hidden = policy_hidden(model, ids, torch.arange(ids.numel()))[:-1]
            seam, _ = token_logprobs(model, hidden[loss_mask[1:]], ids[1:][loss_mask[1:]])
        trained = batch["completion_mask"][i].bool() & batch["tool_mask"][i].bool()
        assert int(trained.sum()) == segment["num_trainable_tokens"] == seam.numel()
        torch.testing.assert_close(logps[i][trained], seam, atol=2e-4, rtol=1e-4)
        checked += seam.numel()
    assert checked == sum(r["num_trainable_tokens"] for r in shard)


def gradient_shares(trainer, rows):
    """Each rollout's share of the gradient in TRL's ``_compute_loss``, one row per
    micro-batch. With advantages 1 at ratio 1 a token's loss is -w_t with gradient
    w_t·∇log π, so a micro-batch's loss is minus the gradient weight of its tokens."""
    batch = grpo_batch(rows, trainer.processing_class.pad_token_id)
    batch["advantages"] = torch.ones_like(batch["advantages"])
    batch.pop("old_per_token_logps", None)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    weight = defaultdict(float)
    with torch.no_grad():
        for i, row in enumerate(rows):
            micro = {k: (v if v.ndim == 0 else v[i : i + 1]) for k, v in batch.items()}
            weight[row["rollout_id"]] += -float(trainer._compute_loss(trainer.model, micro))
    total = sum(weight.values())
    return {k: v / total for k, v in weight.items()}


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_dapo_gives_each_rollout_its_share_of_trainable_tokens(
    tiny_model, grpo_rows, tmp_path, loss_type
):
    # Rollouts with 1 and 3 segments (a0, a2), one segment per micro-batch, as TRL
    # splits a generation batch of 4 rows over 4 accumulation steps.
    rows = [r for r in grpo_rows if r["rollout_id"] in ("a0", "a2")]
    assert sorted(r["rollout_id"] for r in rows) == ["a0", "a2", "a2", "a2"]
    trainer = replay_trainer(
        tiny_model,
        grpo_rows,
        tmp_path,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=len(rows),
        loss_type=loss_type,
    )
    shares = gradient_shares(trainer, rows)
    tokens = defaultdict(int)
    for r in rows:
        tokens[r["rollout_id"]] += r["num_trainable_tokens"]
    token_shares = {k: v / sum(tokens.values()) for k, v in tokens.items()}
    if loss_type == "dapo":
        for rollout, share in token_shares.items():
            assert shares[rollout] == pytest.approx(share, rel=1e-5)
    else:  # bnpo normalizes per micro-batch: each segment weighs the same
        assert shares["a2"] == pytest.approx(3 / 4, rel=1e-5)
        assert shares["a2"] != pytest.approx(token_shares["a2"], rel=1e-2)


def test_replay_grpo_trainer_trains_two_steps(tiny_model, grpo_rows, tmp_path):
    rows = grpo_rows.select(range(4))
    trainer = replay_trainer(
        tiny_model, rows, tmp_path, per_device_train_batch_size=2, max_steps=2, learning_rate=1e-3
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.train()
    assert result.global_step == 2 and np.isfinite(result.training_loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def two_steps(config_class, tmp_path, **options):
    """TRL's SFT/DPO arguments for two CPU steps on the tiny model, with ``max_length=None``
    as the docs set it (TRL's default of 1,024 would cut most agent segments)."""
    return config_class(
        output_dir=str(tmp_path / "run"),
        max_length=None,
        max_steps=2,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        bf16=False,
        save_strategy="no",
        **options,
    )


def test_sft_trainer_trains_two_steps_on_the_exact_tokens(tiny_model, sft_build, tmp_path):
    """As docs/sft.md shows it: the exported rows as they are, ``max_length=None`` (TRL's
    default of 1,024 would cut long segments), TRL's own collator and trainer."""
    from trl import SFTConfig, SFTTrainer

    out = tmp_path / "sft"
    export_build(sft_build, "trl", out, mode="sft")
    ds = datasets.load_dataset("parquet", data_dir=str(out), split="train")
    ds = ds.select_columns(["input_ids", "completion_mask", "assistant_masks"])
    args = two_steps(SFTConfig, tmp_path, per_device_train_batch_size=2)
    trainer = SFTTrainer(model=str(tiny_model), train_dataset=ds, args=args)
    # TRL's collator trains exactly seam's trainable tokens, shifted by nothing.
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(ds))])
    expected = sum(sum(r) for r in ds["assistant_masks"])
    assert int((batch["labels"] != -100).sum()) == expected
    result = trainer.train()
    assert result.global_step == 2 and np.isfinite(result.training_loss)


def test_sft_trainer_trains_two_steps_on_the_build_as_docs_show_it(tiny_model, sft_build, tmp_path):
    """docs/sft.md's first snippet, literally: the SFT build directory itself (its card's
    default config), ``loss_mask`` renamed to ``assistant_masks``, ``max_length=None``."""
    from trl import SFTConfig, SFTTrainer

    ds = datasets.load_dataset(str(sft_build), split="train")
    ds = ds.rename_column("loss_mask", "assistant_masks").select_columns(
        ["input_ids", "assistant_masks"]
    )
    rows = shard_rows(sft_build)
    assert len(ds) == len(rows)
    args = two_steps(SFTConfig, tmp_path, per_device_train_batch_size=2)
    trainer = SFTTrainer(model=str(tiny_model), train_dataset=ds, args=args)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(ds))])
    assert int((batch["labels"] != -100).sum()) == sum(sum(r["loss_mask"]) for r in rows)
    result = trainer.train()
    assert result.global_step == 2 and np.isfinite(result.training_loss)


def test_dpo_trainer_trains_two_steps_on_the_pairs_config(tiny_model, sft_build, tmp_path):
    """As docs/sft.md shows it: ``load_dataset(DIR, "pairs")`` and ``max_length=None``
    (TRL's default of 1,024 tokens would cut most prompts of real pairs)."""
    from trl import DPOConfig, DPOTrainer

    full = datasets.load_dataset(str(sft_build), "pairs", split="train")
    pairs = full.select_columns(["prompt", "chosen", "rejected", "tools"])
    args = two_steps(DPOConfig, tmp_path, per_device_train_batch_size=1)
    trainer = DPOTrainer(model=str(tiny_model), train_dataset=pairs, args=args)
    # TRL renders the prompt with the row's tools (the JSON string column), as the policy saw it.
    prompt = trainer.processing_class.decode(trainer.train_dataset[0]["prompt_ids"])
    tools = json.loads(full[0]["tools"])
    assert tools and "<tools>" in prompt
    assert all(json.dumps(t, ensure_ascii=False) in prompt for t in tools)
    result = trainer.train()
    assert result.global_step == 2 and np.isfinite(result.training_loss)
