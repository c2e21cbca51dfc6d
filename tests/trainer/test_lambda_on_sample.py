"""Credit under the default λ on every rollout of the embedded sample (issue 13, item 6).

With V ≡ 0 and R = 1, ``cross_trajectory_gae`` gives each trainable token the share of the
outcome that reaches it: ``(γλ)^{tokens after it in the rollout}``. With one λ per rollout
(the default) that share never decreases toward the outcome, on every rollout of
``data/sample`` built by ``make build-rl-shards`` (the session's shared build,
``tests/sample_outputs.py``). The per-segment rule
(``--lambda-rule segment``) is shown to break this on the same data, so the check can fail.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from trainer.batching import TrainingSegment, read_segments
from trainer.gae import cross_trajectory_gae, segment_lambda
from trainer.ppo import PPOConfig


@pytest.fixture(scope="module")
def sample_segments(sample_outputs) -> dict[str, list[TrainingSegment]]:
    """Each rollout's segments in ``make build-rl-shards``'s shards (the session's build)."""
    rollouts: dict[str, list[TrainingSegment]] = defaultdict(list)
    for seg in read_segments(sample_outputs.rl):
        rollouts[seg.rollout_id].append(seg)
    return {r: sorted(segs, key=lambda s: s.segment_index) for r, segs in rollouts.items()}


def credit(segments: list[TrainingSegment], config: PPOConfig) -> list[np.ndarray]:
    """Per segment, the share of R = 1 that reaches each trainable token (V ≡ 0)."""
    return [
        cross_trajectory_gae(
            np.zeros(seg.num_trainable_tokens),
            1.0,
            seg.trainable_tokens_after,
            config.gamma,
            segment_lambda(
                config.lambda_rule,
                seg.num_trainable_tokens,
                seg.rollout_trainable_tokens,
                config.alpha,
            ),
        )[0]
        for seg in segments
    ]


def test_the_segments_tile_each_rollouts_trainable_tokens(sample_segments):
    assert len(sample_segments) == 256  # every rollout of the sample
    for segments in sample_segments.values():
        counts = [s.num_trainable_tokens for s in segments]
        assert all(s.rollout_trainable_tokens == sum(counts) for s in segments)
        assert [s.trainable_tokens_after for s in segments] == [
            sum(counts[i + 1 :]) for i in range(len(counts))
        ]


def test_default_lambda_credit_is_monotone_on_every_sample_rollout(sample_segments):
    config = PPOConfig()
    assert config.lambda_rule == "rollout" and config.lam is None
    for rollout, segments in sample_segments.items():
        c = np.concatenate(credit(segments, config))
        assert np.all(np.diff(c) >= -1e-12), rollout
        assert c[-1] == pytest.approx(1.0), rollout
        # one λ for the rollout: the first token keeps λ^{l-1} ≥ e^{-1/α} ≈ 0.51
        assert c[0] >= np.exp(-1 / config.alpha) - 1e-9, rollout


def test_the_per_segment_rule_starves_early_segments_of_the_sample(sample_segments):
    config = PPOConfig(lambda_rule="segment")
    broken = starved = non_final = 0
    for segments in sample_segments.values():
        parts = credit(segments, config)
        c = np.concatenate(parts)
        broken += bool(np.any(np.diff(c) < -1e-12))
        for part in parts[:-1]:
            if len(part):
                non_final += 1
                starved += bool(part[0] < 0.05)
    multi = sum(len(s) > 1 for s in sample_segments.values())
    assert broken > 0 and multi > 0
    assert non_final > 0 and starved / non_final > 0.05
