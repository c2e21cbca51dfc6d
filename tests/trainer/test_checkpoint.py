"""DCP checkpoints in one process: resume bit-for-bit, export to Hugging Face, refusals.

The distributed cases (1 → 2 ranks, 2 → 2, 2 → 1) are in ``test_fsdp.py``'s one launch.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tests.trainer.conftest import SMALL_VOCAB  # noqa: E402
from trainer import checkpoint  # noqa: E402
from trainer.loop import Checkpointing, PlanOptions, RunError, run  # noqa: E402
from trainer.models import Critic, load_policy  # noqa: E402
from trainer.ppo import PPOConfig, PPOTrainer  # noqa: E402
from trainer.streaming import build_index  # noqa: E402
from trainer.synthetic import write_synthetic_shard  # noqa: E402

CPU = torch.device("cpu")
ROLLOUTS = [[(12, 6), (10, 5)], [(20, 10)], [(9, 7), (11, 3), (8, 4)], [(14, 8)], [(6, 3)]]
PLAN = dict(rollouts_per_step=2, max_step_tokens=None, shuffle_seed=3)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    shards = tmp_path_factory.mktemp("shards")
    write_synthetic_shard(shards, ROLLOUTS, SMALL_VOCAB, seed=4, with_logprobs=True)
    return build_index(shards)


def make_trainer(model_dir, **overrides):
    torch.manual_seed(0)
    config = PPOConfig(
        **{"micro_batch_tokens": 40, "policy_lr": 1e-3, "critic_lr": 1e-3, **overrides}
    )
    return PPOTrainer(
        load_policy(model_dir, CPU), Critic.from_pretrained(model_dir, CPU), config, CPU
    )


def params(trainer):
    return {
        **{f"policy.{n}": p.detach().clone() for n, p in trainer.policy.named_parameters()},
        **{f"critic.{n}": p.detach().clone() for n, p in trainer.critic.named_parameters()},
    }


def losses(history):
    return [(m.policy_loss, m.value_loss, m.policy_grad_norm, m.critic_grad_norm) for m in history]


@pytest.fixture(scope="module")
def uninterrupted(small_vocab_model_dir, index):
    trainer = make_trainer(small_vocab_model_dir)
    history = run(trainer, index, PlanOptions(steps=2, **PLAN))
    return history, params(trainer), torch.rand(4)


@pytest.fixture(scope="module")
def interrupted(small_vocab_model_dir, index, tmp_path_factory):
    """Step 1 with a checkpoint, then a new trainer (another torch seed) resumes for step 2."""
    directory = tmp_path_factory.mktemp("ckpt")
    dirs = {"policy": small_vocab_model_dir, "critic": small_vocab_model_dir}
    first = make_trainer(small_vocab_model_dir)
    before = run(
        first,
        index,
        PlanOptions(steps=1, **PLAN),
        checkpoints=Checkpointing(directory, 1),
        model_dirs=dirs,
    )
    resumed = make_trainer(small_vocab_model_dir)
    torch.manual_seed(123)  # the checkpoint's RNG state must win over the process's
    after = run(
        resumed,
        index,
        PlanOptions(steps=2, **PLAN),
        checkpoints=Checkpointing(directory, resume=True),
        model_dirs=dirs,
    )
    return directory, before, after, resumed, first, torch.rand(4)


def test_resume_in_one_process_equals_the_uninterrupted_run_bit_for_bit(uninterrupted, interrupted):
    history, expected, draws = uninterrupted
    directory, before, after, resumed, _, resumed_draws = interrupted
    assert torch.equal(resumed_draws, draws)  # the RNG continues where the checkpoint left it
    assert [m.step for m in after] == [2]
    assert losses(before + after) == losses(history)  # exact, not approximate
    got = params(resumed)
    assert got.keys() == expected.keys()
    for name, p in expected.items():
        assert torch.equal(got[name], p), name
    assert resumed.steps_done == 2
    assert (directory / "latest").read_text().strip() == "step-00000002"


def test_a_checkpoint_holds_the_step_cursor_plan_and_rng(interrupted, index):
    directory, before, *_ = interrupted
    meta = json.loads((directory / "step-00000001" / "meta.json").read_text())
    step_segments = [m.segments for m in before]
    assert (meta["step"], meta["world_size"], meta["cursor"]) == (1, 1, sum(step_segments))
    assert meta["plan"] == {**PLAN, "index": checkpoint.index_fingerprint(index.segments)}
    rng = torch.load(directory / "step-00000001" / "rng-rank0.pt", weights_only=False)
    assert set(rng) >= {"torch", "numpy", "python"}
    assert {p.name for p in (directory / "step-00000001" / "hf-policy").iterdir()} >= {
        "config.json",
        "tokenizer_config.json",
    }


def test_export_hf_writes_models_that_load_with_transformers(interrupted, tmp_path):
    from transformers import AutoModelForCausalLM

    directory, _, _, _, first, _ = interrupted
    out = checkpoint.export_hf(directory / "step-00000001", tmp_path / "hf")
    policy = AutoModelForCausalLM.from_pretrained(out["policy"], local_files_only=True)
    for (name, got), (_, want) in zip(
        policy.named_parameters(), first.policy.named_parameters(), strict=True
    ):
        assert torch.equal(got, want), name
    critic = Critic.from_pretrained(out["critic"], CPU)
    assert torch.equal(critic.value_head.weight, first.critic.value_head.weight)
    assert (out["policy"] / "tokenizer_config.json").is_file()


def test_a_fresh_run_into_a_checkpoint_directory_is_refused(
    interrupted, small_vocab_model_dir, index
):
    directory = interrupted[0]
    with pytest.raises(RunError, match="already holds checkpoints: pass --resume"):
        run(
            make_trainer(small_vocab_model_dir),
            index,
            PlanOptions(steps=1, **PLAN),
            checkpoints=Checkpointing(directory),
        )


def test_resuming_with_another_plan_or_without_a_checkpoint_is_refused(
    interrupted, small_vocab_model_dir, index, tmp_path
):
    directory = interrupted[0]
    other = dict(PLAN, shuffle_seed=4)
    with pytest.raises(RunError, match="plan differs in shuffle_seed"):
        run(
            make_trainer(small_vocab_model_dir),
            index,
            PlanOptions(steps=4, **other),
            checkpoints=Checkpointing(directory, resume=True),
        )
    with pytest.raises(RunError, match="holds no checkpoint"):
        run(
            make_trainer(small_vocab_model_dir),
            index,
            PlanOptions(steps=1, **PLAN),
            checkpoints=Checkpointing(tmp_path, resume=True),
        )


def test_a_save_killed_midway_leaves_latest_on_the_previous_checkpoint(
    interrupted, small_vocab_model_dir, monkeypatch, tmp_path
):
    import shutil

    import torch.distributed.checkpoint as dcp

    directory = tmp_path / "ckpt"
    shutil.copytree(interrupted[0], directory)
    trainer = make_trainer(small_vocab_model_dir)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dcp, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(directory, trainer, 3, {}, 0, {})
    assert (directory / "latest").read_text().strip() == "step-00000002"
    assert checkpoint.resolve(directory).name == "step-00000002"
