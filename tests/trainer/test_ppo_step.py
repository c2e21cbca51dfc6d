"""The PPO step on a real tiny transformer and real Parquet shards."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from pipeline.core.shard_schema import SHARD_SCHEMA  # noqa: E402
from trainer.batching import pack, read_segments  # noqa: E402
from trainer.gae import adaptive_lambda  # noqa: E402
from trainer.losses import clipped_surrogate, token_level  # noqa: E402
from trainer.models import Critic, load_policy, policy_hidden, token_logprobs  # noqa: E402
from trainer.ppo import PPOConfig, PPOTrainer  # noqa: E402
from trainer.synthetic import rollout_rows, write_synthetic_shard  # noqa: E402

CPU = torch.device("cpu")
VOCAB = 151665
ROLLOUTS = [[(12, 6), (10, 5), (8, 4)], [(14, 8)], [(9, 7), (11, 3)]]


@pytest.fixture
def trainer(tiny_model_dir):
    def make(**overrides):
        torch.manual_seed(0)
        config = PPOConfig(**{"micro_batch_tokens": 48, **overrides})
        return PPOTrainer(
            load_policy(tiny_model_dir, CPU),
            Critic.from_pretrained(tiny_model_dir, CPU),
            config,
            CPU,
        )

    return make


@pytest.fixture
def segments(tmp_path):
    write_synthetic_shard(tmp_path, ROLLOUTS, VOCAB, seed=3)
    return read_segments(tmp_path)


def test_the_critic_starts_from_the_policy_checkpoint_with_a_zero_value_head(trainer):
    t = trainer()
    for name, weight in t.critic.backbone.state_dict().items():
        torch.testing.assert_close(weight, t.policy.base_model.state_dict()[name])
    assert not t.critic.value_head.weight.any() and not t.critic.value_head.bias.any()


def test_packed_rows_give_each_segment_the_log_probs_it_has_alone(trainer, segments):
    policy = trainer().policy
    (batch,) = pack(segments[:3], token_budget=10_000)
    assert len(batch.spans) == 3
    with torch.no_grad():
        packed = policy_hidden(
            policy, torch.as_tensor(batch.input_ids), torch.as_tensor(batch.position_ids)
        )
        for index, start, end in batch.spans:
            ids = torch.as_tensor(segments[index].input_ids)
            alone = policy_hidden(policy, ids, torch.arange(ids.numel()))
            torch.testing.assert_close(packed[start:end], alone, atol=1e-5, rtol=1e-4)


def test_chunked_log_probs_and_entropy_match_the_full_softmax(trainer, segments):
    policy = trainer().policy
    ids = torch.as_tensor(segments[0].input_ids)
    hidden = policy_hidden(policy, ids, torch.arange(ids.numel()))[:-1]
    logp, entropy = token_logprobs(policy, hidden, ids[1:], with_entropy=True, chunk=5)
    full = torch.log_softmax(policy.lm_head(hidden).float(), dim=-1)
    torch.testing.assert_close(logp, full.gather(-1, ids[1:, None]).squeeze(-1))
    torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1))


def test_old_log_probs_come_from_the_shard_when_logged_and_from_the_policy_otherwise(
    trainer, tmp_path
):
    rng = np.random.default_rng(0)
    logged = rollout_rows("logged", [(10, 5)], 1.0, rng, VOCAB, with_logprobs=True)
    unlogged = rollout_rows("unlogged", [(10, 5)], 1.0, rng, VOCAB, with_logprobs=False)
    pq.write_table(
        pa.Table.from_pylist(logged + unlogged, schema=SHARD_SCHEMA),
        tmp_path / "train-00000-of-00001.parquet",
    )
    segs = read_segments(tmp_path)
    t = trainer(micro_batch_tokens=10_000)
    (prepared,) = t.prepare(segs)
    old = prepared.old_logprobs
    # Segment "logged" comes first in the row: its 5 trainable tokens carry the shard's values.
    np.testing.assert_allclose(
        old[:5].numpy(), np.array(logged[0]["logprobs"][10:], dtype=np.float32)
    )
    with torch.no_grad():
        hidden = policy_hidden(t.policy, prepared.input_ids, prepared.position_ids)[
            prepared.positions
        ]
        policy_logp, _ = token_logprobs(t.policy, hidden, prepared.targets)
    torch.testing.assert_close(old[5:], policy_logp[5:])
    assert prepared.recomputed == 5
    assert not torch.allclose(old[:5], policy_logp[:5])


def test_first_step_advantages_are_the_discounted_reward_of_a_zero_critic(trainer, segments):
    # The value head starts at zero, so V ≡ 0 and Â(s,t) = λ^{n_s-1-t+N_{>s}}·R (γ = 1), with
    # the default λ = 1 - 1/(1.5·l), l = the rollout's trainable tokens.
    prepared = trainer().prepare(segments)
    by_segment = {}
    for p in prepared:
        positions = p.positions.numpy()
        for index, start, end in p.batch.spans:
            lo, hi = np.searchsorted(positions, [start, end])
            by_segment[index] = p.advantages[lo:hi].numpy()
    for index, seg in enumerate(segments):
        n, lam = seg.num_trainable_tokens, adaptive_lambda(seg.rollout_trainable_tokens)
        expected = seg.reward * lam ** (np.arange(n - 1, -1, -1) + seg.trainable_tokens_after)
        np.testing.assert_allclose(by_segment[index], expected, rtol=1e-6)


def test_one_policy_update_lowers_the_surrogate_loss_on_a_fixed_batch(trainer, segments):
    t = trainer(policy_lr=1e-3)
    prepared = t.prepare(segments)
    total = sum(int(p.positions.numel()) for p in prepared)
    before = t.policy_pass(prepared, total, update=False)["policy_loss"]
    t.policy_pass(prepared, total, update=True)
    after = t.policy_pass(prepared, total, update=False)["policy_loss"]
    assert after < before - 1e-3


def test_critic_updates_lower_the_value_loss_on_a_fixed_batch(trainer, segments):
    t = trainer(critic_lr=1e-3)
    prepared = t.prepare(segments)
    total = sum(int(p.positions.numel()) for p in prepared)
    losses = [t.critic_update(prepared, total) for _ in range(3)]
    assert losses[2] < losses[0]


def test_policy_gradient_is_zero_at_positions_that_predict_untrainable_tokens(trainer, segments):
    t = trainer(micro_batch_tokens=10_000)
    (p,) = t.prepare(segments[:2])
    hidden = policy_hidden(t.policy, p.input_ids, p.position_ids)
    hidden.retain_grad()
    logp, _ = token_logprobs(t.policy, hidden[p.positions], p.targets)
    per_token, _ = clipped_surrogate(logp, p.old_logprobs, p.advantages, 0.2)
    token_level(per_token, p.positions.numel()).backward()
    grad_norm = hidden.grad.norm(dim=-1)
    trainable = torch.as_tensor(p.batch.trainable)
    assert (grad_norm[~trainable] == 0).all()
    assert (grad_norm[trainable] > 0).all()


def test_a_step_counts_every_trainable_token_once_and_trains_both_models(trainer, segments):
    t = trainer()
    policy_before = [w.detach().clone() for w in t.policy.parameters()]
    head_before = t.critic.value_head.weight.detach().clone()
    metrics = t.step(segments)
    assert metrics.trainable_tokens == sum(s.num_trainable_tokens for s in segments) == 33
    assert metrics.tokens == sum(s.input_ids.shape[0] for s in segments)
    assert (metrics.segments, metrics.rollouts, metrics.policy_updated) == (6, 3, True)
    assert all(
        np.isfinite([metrics.policy_loss, metrics.value_loss, metrics.entropy, metrics.model_flops])
    )
    assert any(not torch.equal(a, b) for a, b in zip(policy_before, t.policy.parameters()))
    assert not torch.equal(head_before, t.critic.value_head.weight)


@pytest.mark.slow
def test_a_second_policy_update_measures_how_far_the_first_moved_the_policy(trainer, segments):
    metrics = trainer(policy_updates=2, policy_lr=1e-3).step(segments)
    assert metrics.approx_kl > 0


@pytest.mark.slow
def test_critic_warmup_steps_leave_the_policy_untouched(trainer, segments):
    t = trainer(critic_warmup_steps=1)
    before = [w.detach().clone() for w in t.policy.parameters()]
    metrics = t.step(segments)
    assert not metrics.policy_updated
    assert all(torch.equal(a, b) for a, b in zip(before, t.policy.parameters()))
    assert t.step(segments).policy_updated


def test_saved_policy_and_critic_reload_as_they_were(trainer, segments, tiny_model_dir, tmp_path):
    t = trainer(critic_lr=1e-3)
    t.step(segments)
    t.save(tmp_path / "out", tiny_model_dir)
    critic = Critic.from_pretrained(tmp_path / "out" / "critic", CPU)
    torch.testing.assert_close(critic.value_head.weight, t.critic.value_head.weight)
    policy = load_policy(tmp_path / "out" / "policy", CPU)
    torch.testing.assert_close(next(policy.parameters()), next(t.policy.parameters()))
    assert (tmp_path / "out" / "policy" / "tokenizer.json").exists()


def test_old_log_probs_are_computed_without_dropout(tiny_model_dir, segments, tmp_path):
    import json
    import shutil

    # The tiny model with dropout in attention: train mode drops, eval mode does not.
    model_dir = tmp_path / "dropout-model"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.5}))
    torch.manual_seed(0)
    t = PPOTrainer(
        load_policy(model_dir, CPU),
        Critic.from_pretrained(model_dir, CPU),
        PPOConfig(micro_batch_tokens=10_000, recompute_old_logprobs=True),
        CPU,
    )
    (prepared,) = t.prepare(segments[:2])
    assert t.policy.training and t.critic.training  # the update still runs in train mode

    def logprobs():
        hidden = policy_hidden(t.policy, prepared.input_ids, prepared.position_ids)
        return token_logprobs(t.policy, hidden[prepared.positions], prepared.targets)[0]

    with torch.no_grad():
        dropped = logprobs()
        t.policy.eval()
        clean = logprobs()
        t.policy.train()
    assert not torch.allclose(dropped, clean)  # dropout is really active in train mode
    torch.testing.assert_close(prepared.old_logprobs, clean)
