"""Token-level normalization, the segment-count bias, and the per-token PPO losses."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainer.losses import approx_kl, clipped_surrogate, clipped_value_loss, token_level  # noqa: E402


def split(tensor, sizes):
    return list(torch.split(tensor, sizes))


def accumulated_token_level(logp, old, adv, segment_sizes, segments_per_micro_batch):
    """Step loss and gradient with segments grouped into micro-batches and gradients accumulated."""
    leaf = logp.detach().clone().requires_grad_(True)
    pieces = list(
        zip(split(leaf, segment_sizes), split(old, segment_sizes), split(adv, segment_sizes))
    )
    total = 0.0
    for start in range(0, len(pieces), segments_per_micro_batch):
        group = pieces[start : start + segments_per_micro_batch]
        per_token = torch.cat([clipped_surrogate(lp, o, a, 0.2)[0] for lp, o, a in group])
        loss = token_level(per_token, logp.numel())
        loss.backward()
        total += loss.item()
    return total, leaf.grad


def per_sample_mean(logp, old, adv, segment_sizes):
    per_token = clipped_surrogate(logp, old, adv, 0.2)[0]
    return torch.stack([piece.mean() for piece in split(per_token, segment_sizes)]).mean().item()


@pytest.fixture
def tokens():
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(60, generator=gen, dtype=torch.float64) * 3
    logp = old + 0.3 * torch.randn(60, generator=gen, dtype=torch.float64)
    adv = torch.randn(60, generator=gen, dtype=torch.float64)
    return logp, old, adv


def test_token_level_loss_is_invariant_to_segmentation_and_micro_batching(tokens):
    logp, old, adv = tokens
    one_pass = accumulated_token_level(logp, old, adv, [60], 1)
    for sizes, per_micro_batch in (
        [[10, 20, 30], 1],
        [[5] * 12, 4],
        [[1, 59], 2],
        [[30, 7, 23], 2],
    ):
        loss, grad = accumulated_token_level(logp, old, adv, sizes, per_micro_batch)
        assert loss == pytest.approx(one_pass[0], rel=1e-12)
        torch.testing.assert_close(grad, one_pass[1])


def test_per_sample_averaging_changes_with_the_segmentation(tokens):
    logp, old, adv = tokens
    losses = {per_sample_mean(logp, old, adv, sizes) for sizes in ([60], [10, 20, 30], [1, 59])}
    assert len(losses) == 3


def test_per_sample_averaging_weighs_a_rollout_by_its_number_of_segments():
    # Two rollouts of 40 trainable tokens each: A compacted three times (4 segments of 10),
    # B never (1 segment of 40). The weight of each token in the step loss is d loss / d ℓ.
    sizes_a, sizes_b = [10, 10, 10, 10], [40]
    losses = torch.zeros(80, dtype=torch.float64, requires_grad=True)
    torch.stack([piece.mean() for piece in split(losses, sizes_a + sizes_b)]).mean().backward()
    per_sample = losses.grad
    assert per_sample[:40].sum().item() == pytest.approx(4 / 5)  # A counts four times as much as B
    assert per_sample[40:].sum().item() == pytest.approx(1 / 5)

    losses.grad = None
    token_level(losses, 80).backward()
    assert losses.grad[:40].sum().item() == pytest.approx(
        1 / 2
    )  # token-level: tokens count, not segments
    assert losses.grad[40:].sum().item() == pytest.approx(1 / 2)


def test_shard_weights_turn_a_per_sample_mean_into_the_token_level_or_per_rollout_loss():
    # The recipes of docs/training.md for trainers that only average per sample.
    gen = torch.Generator().manual_seed(1)
    sizes = [10, 10, 10, 10, 40]  # rollout A: 4 segments; rollout B: 1 segment
    num_segments = [4, 4, 4, 4, 1]
    per_token = torch.randn(80, generator=gen, dtype=torch.float64)
    sample_means = torch.stack([piece.mean() for piece in split(per_token, sizes)])
    batch = len(sizes)
    # Scale sample i by n_i · B / Σ n: the per-sample mean becomes the token-level mean.
    token_weights = torch.tensor(sizes, dtype=torch.float64) * batch / sum(sizes)
    assert (token_weights * sample_means).mean().item() == pytest.approx(
        token_level(per_token, 80).item()
    )
    # Scale sample i by loss_weight_per_rollout = 1/num_segments: each rollout counts once.
    rollout_weights = 1 / torch.tensor(num_segments, dtype=torch.float64)
    weighted = (rollout_weights * sample_means).sum() / rollout_weights.sum()
    assert weighted.item() == pytest.approx((sample_means[:4].mean() + sample_means[4]).item() / 2)


def test_clipped_surrogate_takes_the_pessimistic_side():
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.1])
    adv = torch.tensor([1.0, 1.0, -1.0, 2.0])
    loss, clipped = clipped_surrogate(torch.log(ratio), torch.zeros(4), adv, clip_eps=0.2)
    torch.testing.assert_close(loss, torch.tensor([-1.2, -0.5, 0.8, -2.2]))
    assert clipped.tolist() == [True, False, True, False]


def test_clipped_value_loss_keeps_the_larger_error():
    values = torch.tensor([1.0, 0.1])
    old = torch.tensor([0.0, 0.0])
    returns = torch.tensor([1.0, 1.0])
    # Token 0: V moved by 1 > 0.2, clipped V = 0.2 → max(0, 0.64)/2. Token 1: within the clip.
    torch.testing.assert_close(
        clipped_value_loss(values, old, returns, clip=0.2), torch.tensor([0.32, 0.405])
    )


def test_approx_kl_is_zero_on_policy_and_positive_off_it():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    assert approx_kl(logp, logp).abs().max().item() == 0.0
    assert (approx_kl(logp, logp + torch.tensor([0.3, -0.3, 1.0])) > 0).all()
