"""Cross-trajectory GAE against hand computations and an independent reference.

The reference below is written from the formulas, not from ``trainer/gae.py``: GAE as
the explicit sum ``A_t = Σ_l (γλ)^l δ_{t+l}`` over one token sequence.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.examples import examples
from trainer.gae import adaptive_lambda, cross_trajectory_gae, local_gae, segment_lambda


def reference_gae(rewards, values, gamma, lam):
    """Plain GAE over one episode, terminal after the last step (V = 0 beyond it)."""
    n = len(rewards)
    next_values = list(values[1:]) + [0.0]
    deltas = [rewards[t] + gamma * next_values[t] - values[t] for t in range(n)]
    return np.array(
        [sum((gamma * lam) ** k * deltas[t + k] for k in range(n - t)) for t in range(n)]
    )


def test_two_segment_example_matches_hand_computation():
    # γ = 1, λ = 0.5, R = 1; segment 1 has 2 trainable tokens, segment 2 has 1 (N_{>1} = 1).
    # Segment 2: δ0 = 1 - 0.5 = 0.5 → A_loc = [0.5], factor (γλ)^0 = 1, G = A_loc + V = [1.0].
    adv2, ret2 = cross_trajectory_gae([0.5], 1.0, 0, gamma=1.0, lam=0.5)
    np.testing.assert_allclose(adv2, [0.5])
    np.testing.assert_allclose(ret2, [1.0])
    # Segment 1: δ1 = 1 + 0 - 0.25 = 0.75, δ0 = 0 + 0.25 - 0.5 = -0.25,
    # A_loc = [-0.25 + 0.5·0.75, 0.75] = [0.125, 0.75], factor (1·0.5)^1 → Â = [0.0625, 0.375].
    adv1, ret1 = cross_trajectory_gae([0.5, 0.25], 1.0, 1, gamma=1.0, lam=0.5)
    np.testing.assert_allclose(adv1, [0.0625, 0.375])
    np.testing.assert_allclose(ret1, [0.625, 1.0])


def test_a_sequence_without_trainable_tokens_has_no_lambda():
    with pytest.raises(ValueError, match="no time steps"):
        adaptive_lambda(0)


def test_length_adaptive_lambda_hand_example():
    # λ = 1 - 1/(1.5·l): l = 2 → 2/3, l = 1 → 1/3, l = 3 → 7/9.
    assert adaptive_lambda(2) == pytest.approx(2 / 3)
    assert adaptive_lambda(1) == pytest.approx(1 / 3)
    # Segments n = [2, 1]: the per-segment rule gives them λ = 2/3 and 1/3, the default
    # per-rollout rule λ = 7/9 to both (l = 3 trainable tokens in the rollout).
    assert segment_lambda("segment", 2, 3) == pytest.approx(2 / 3)
    assert (
        segment_lambda("rollout", 2, 3) == segment_lambda("rollout", 1, 3) == pytest.approx(7 / 9)
    )
    # V ≡ 0, R = 1, γ = 1. Segment 1 (n = 2, N_{>1} = 1): A_loc = [λ, 1], Â = λ·A_loc.
    lam = 7 / 9
    adv1, _ = cross_trajectory_gae([0.0, 0.0], 1.0, 1, gamma=1.0, lam=lam)
    np.testing.assert_allclose(adv1, [lam**2, lam])
    adv2, _ = cross_trajectory_gae([0.0], 1.0, 0, gamma=1.0, lam=lam)
    np.testing.assert_allclose(adv2, [1.0])
    with pytest.raises(ValueError, match="unknown λ rule"):
        segment_lambda("token", 2, 3)


def credit(lengths, rule, gamma=1.0):
    """Share of R that reaches each trainable token of a rollout (V ≡ 0), in order."""
    total = sum(lengths)
    return np.concatenate(
        [
            cross_trajectory_gae(
                np.zeros(n), 1.0, sum(lengths[s + 1 :]), gamma, segment_lambda(rule, n, total)
            )[0]
            for s, n in enumerate(lengths)
        ]
    )


@settings(max_examples=examples(100, 300), deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=8),
    gamma=st.floats(0.9, 1.0),
)
def test_default_lambda_credit_never_decreases_toward_the_outcome(lengths, gamma):
    c = credit(lengths, "rollout", gamma)
    assert np.all(np.diff(c) >= -1e-12)
    assert c[-1] == pytest.approx(1.0)


def test_per_segment_lambda_gives_an_earlier_segment_more_than_a_later_one():
    # The example: first tokens of n = [2000, 500, 3000] keep [0.16, 0.009, 0.51].
    lengths = [2000, 500, 3000]
    c = credit(lengths, "segment")
    firsts = c[np.cumsum([0, *lengths[:-1]])]
    np.testing.assert_allclose(firsts, [0.16, 0.009, 0.51], atol=0.006)
    assert np.any(np.diff(c) < 0)
    # One λ per rollout: first tokens keep (1 - 1/(1.5·5500))^{N-1-u}, monotone.
    assert np.all(np.diff(credit(lengths, "rollout")) >= 0)
    assert credit([300, 4000], "rollout")[0] == pytest.approx(0.51, abs=0.01)
    assert credit([300, 4000], "segment")[0] < 1e-3


segmentations = st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(
    lengths=segmentations,
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
    reward=st.floats(-2.0, 2.0),
)
def test_with_zero_values_cross_trajectory_gae_equals_plain_gae_over_the_concatenated_tokens(
    lengths, gamma, lam, reward
):
    total = sum(lengths)
    plain = reference_gae([0.0] * (total - 1) + [reward], [0.0] * total, gamma, lam)
    pieces = [
        cross_trajectory_gae(np.zeros(n), reward, sum(lengths[s + 1 :]), gamma=gamma, lam=lam)[0]
        for s, n in enumerate(lengths)
    ]
    np.testing.assert_allclose(np.concatenate(pieces), plain, rtol=1e-9, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    lengths=segmentations,
    gamma=st.floats(0.5, 1.0),
    lam=st.one_of(st.none(), st.floats(0.0, 1.0)),
    reward=st.floats(-2.0, 2.0),
    seed=st.integers(0, 2**16),
)
def test_each_segment_is_local_gae_discounted_by_the_tokens_after_it(
    lengths, gamma, lam, reward, seed
):
    values = np.random.default_rng(seed).normal(size=sum(lengths))
    start = 0
    for s, n in enumerate(lengths):
        v = values[start : start + n]
        after = sum(lengths[s + 1 :])
        lam_s = 1 - 1 / (1.5 * n) if lam is None else lam
        local = reference_gae([0.0] * (n - 1) + [reward], v, gamma, lam_s)
        adv, ret = cross_trajectory_gae(v, reward, after, gamma, lam_s)
        np.testing.assert_allclose(adv, (gamma * lam_s) ** after * local, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(ret, local + v, rtol=1e-9, atol=1e-12)
        start += n


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 20),
    gamma=st.floats(0.5, 1.0),
    reward=st.floats(-2.0, 2.0),
    seed=st.integers(0, 2**16),
)
def test_returns_with_lambda_one_are_the_monte_carlo_return_whatever_the_values(
    n, gamma, reward, seed
):
    values = np.random.default_rng(seed).normal(size=n)
    _, returns = local_gae(values, reward, gamma, 1.0)
    np.testing.assert_allclose(
        returns, gamma ** np.arange(n - 1, -1, -1) * reward, rtol=1e-9, atol=1e-12
    )


def test_returns_with_lambda_zero_are_td0_targets():
    values = np.array([0.3, -0.2, 0.7])
    _, returns = local_gae(values, reward=2.0, gamma=0.9, lam=0.0)
    np.testing.assert_allclose(returns, [0.9 * -0.2, 0.9 * 0.7, 2.0])


def test_a_segment_without_trainable_tokens_has_no_time_steps():
    adv, ret = cross_trajectory_gae(np.zeros(0), 1.0, 5, gamma=1.0, lam=0.9)
    assert adv.shape == ret.shape == (0,)
