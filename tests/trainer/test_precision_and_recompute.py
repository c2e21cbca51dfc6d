"""``--activation-checkpointing`` and ``--dtype bf16`` on CPU, one process (the sharded bf16
path, ``MixedPrecisionPolicy``, is in ``test_fsdp.py``'s launch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.trainer.conftest import SMALL_VOCAB  # noqa: E402
from trainer.loop import PlanOptions, run  # noqa: E402
from trainer.models import Critic, activation_checkpointing_on, load_policy  # noqa: E402
from trainer.ppo import PPOConfig, PPOTrainer  # noqa: E402
from trainer.streaming import build_index  # noqa: E402
from trainer.synthetic import write_synthetic_shard  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    shards = tmp_path_factory.mktemp("shards")
    write_synthetic_shard(shards, [[(12, 6), (10, 5)], [(20, 10)]], SMALL_VOCAB, seed=2)
    return build_index(shards)


def train(model_dir, index, **config):
    torch.manual_seed(0)
    trainer = PPOTrainer(
        load_policy(model_dir, CPU),
        Critic.from_pretrained(model_dir, CPU),
        PPOConfig(micro_batch_tokens=40, policy_lr=1e-3, critic_lr=1e-3, **config),
        CPU,
    )
    history = run(trainer, index, PlanOptions(rollouts_per_step=2, steps=2))
    losses = [
        (m.policy_loss, m.value_loss, m.policy_grad_norm, m.critic_grad_norm) for m in history
    ]
    return losses, [p.detach().clone() for p in trainer.policy.parameters()], trainer


@pytest.fixture(scope="module")
def plain(small_vocab_model_dir, index):
    return train(small_vocab_model_dir, index)


def test_activation_checkpointing_gives_the_same_losses_and_update(
    plain, small_vocab_model_dir, index
):
    losses, params, trainer = train(small_vocab_model_dir, index, activation_checkpointing=True)
    assert activation_checkpointing_on(trainer.policy)
    assert activation_checkpointing_on(trainer.critic.backbone)
    for got, want in zip(losses, plain[0], strict=True):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-8)
    for a, b in zip(params, plain[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bf16_on_cpu_trains_within_bf16_precision_of_fp32(plain, small_vocab_model_dir, index):
    losses, _, _ = train(small_vocab_model_dir, index, bf16=True)
    assert losses[0] == pytest.approx(plain[0][0], rel=3e-2, abs=1e-3)
    assert losses[0] != plain[0][0]  # bf16 really ran
