"""Property tests over random rollouts: masks, prefixes, advantages, PPO metadata."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from pipeline.core.advantage import group_advantages, trainable_tokens_after
from pipeline.core.mask import MaskOptions, mask_segment
from pipeline.core.render import template_message
from pipeline.core.segment import Segmenter
from schemas.replay import replay
from schemas.rollout import RewriteEvent
from tests.strategies import TOOLS, log_token_ids, oracle_output, rollouts

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def masked_runs(tokens: np.ndarray, mask: np.ndarray) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate(mask.tolist() + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def trained_texts(renderer, segments) -> list[str]:
    texts = []
    for seg in segments:
        masked = mask_segment(seg, MaskOptions(), renderer.eos_id, [False] * len(seg.spans))
        assert len(masked.loss_mask) == len(seg.tokens)
        texts += [
            renderer.decode(seg.tokens[a:b]) for a, b in masked_runs(seg.tokens, masked.loss_mask)
        ]
    return texts


@SETTINGS
@given(rollouts())
def test_decoding_the_masked_spans_gives_every_generated_output_exactly_once(renderer, rollout):
    segments = Segmenter(renderer).segments(rollout)
    assert trained_texts(renderer, segments) == [oracle_output(c) for c in rollout.calls()]


@SETTINGS
@given(rollouts())
def test_every_call_input_is_a_prefix_of_its_segment_as_apply_chat_template_renders_it(
    renderer, tokenizer, rollout
):
    segments = Segmenter(renderer).segments(rollout)
    calls = {c.index: c for c in replay(rollout)}
    for seg in segments:
        for span in seg.spans:
            context = [template_message(m) for m in calls[span.call_index].context]
            text = tokenizer.apply_chat_template(
                context, tools=TOOLS, add_generation_prompt=True, tokenize=False
            )
            assert renderer.decode(seg.tokens[: span.start]) == text


def boundaries(tokenizer, rollout) -> list[tuple[RewriteEvent | None, bool]]:
    """For each call after the first: the first rewrite since the previous call, and
    whether the call's input (rendered by ``apply_chat_template``, the oracle) extends the
    previous call's input ⊕ output. Outputs end with a special token, so a text prefix
    there is a token prefix."""
    texts, result = [], []
    calls = replay(rollout)
    for call in calls:
        context = [template_message(m) for m in call.context]
        texts.append(
            tokenizer.apply_chat_template(
                context, tools=TOOLS, add_generation_prompt=True, tokenize=False
            )
        )
    for prev, call, before, now in zip(calls, calls[1:], texts, texts[1:]):
        result.append((call.rewrite, now.startswith(before + oracle_output(prev.message))))
    return result


@SETTINGS
@given(rollouts())
def test_seams_are_exactly_the_rewrites_that_change_the_token_prefix(renderer, tokenizer, rollout):
    segments = Segmenter(renderer).segments(rollout)
    cuts = [(rw, keeps) for rw, keeps in boundaries(tokenizer, rollout) if not keeps]
    # chatml-tools re-renders nothing: only a rewrite can change the prefix.
    assert all(rw is not None for rw, _ in cuts)
    assert len(segments) == 1 + len(cuts)
    assert [s.seam_kind for s in segments] == ["none"] + [rw.reason for rw, _ in cuts]
    assert sum(len(s.spans) for s in segments) == len(rollout.calls())


def test_the_strategy_generates_rewrites_that_keep_and_that_change_the_prefix(tokenizer):
    """Without both, the seam property above could not tell a segmenter that cuts at
    every rewrite (or at none) from a correct one."""
    quick = settings(database=None, max_examples=500, phases=[Phase.generate])
    for keeps in (True, False):
        find(
            rollouts(),
            lambda r, keeps=keeps: any(
                rw is not None and k == keeps for rw, k in boundaries(tokenizer, r)
            ),
            settings=quick,
        )


@SETTINGS
@given(rollouts(), st.sampled_from(["full", "output", "noncanonical"]), st.integers(1, 30))
def test_logged_ids_are_trained_verbatim_and_drift_is_realigned_not_split(
    renderer, rollout, mode, split_at
):
    logged = log_token_ids(rollout, renderer, mode, split_at)
    plain = Segmenter(renderer).segments(rollout)
    segments = Segmenter(renderer).segments(logged)
    assert [s.seam_kind for s in segments] == [s.seam_kind for s in plain]
    outputs = [
        seg.tokens[s.start : s.start + s.length].tolist() for seg in segments for s in seg.spans
    ]
    assert outputs == [c.output_ids for c in logged.calls()]
    # Whatever the ids, every segment spells the same text as the rendered one.
    assert [renderer.decode(s.tokens) for s in segments] == [
        renderer.decode(s.tokens) for s in plain
    ]


@SETTINGS
@given(rollouts())
def test_template_that_drops_reasoning_splits_at_every_call_after_reasoning(
    drop_reasoning_renderer, rollout
):
    segments = Segmenter(drop_reasoning_renderer).segments(rollout)
    assert trained_texts(drop_reasoning_renderer, segments) == [
        oracle_output(c) for c in rollout.calls()
    ]
    calls = rollout.calls()
    for prev_seg, seg in zip(segments, segments[1:]):
        if seg.seam_kind == "template":
            assert calls[prev_seg.spans[-1].call_index].reasoning


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.floats(-3, 3, allow_nan=False)), min_size=1, max_size=40
    ),
    st.booleans(),
)
def test_group_advantages_sum_to_zero_over_rollouts_of_each_task(items, use_std):
    groups = np.array([g for g, _ in items])
    rewards = np.array([r for _, r in items])
    adv, sizes = group_advantages(groups, rewards, use_std)
    for g in set(groups.tolist()):
        sel = groups == g
        assert abs(adv[sel].sum()) < 1e-6 * max(1, sel.sum())
        assert (sizes[sel] == sel.sum()).all()
        if sel.sum() == 1:
            assert adv[sel][0] == 0


def test_group_advantage_hand_computed():
    adv, _ = group_advantages(
        np.array(["a", "a", "a", "a", "b"]), np.array([1.0, 0.0, 0.0, 0.0, 1.0])
    )
    # mean 0.25, population std sqrt(0.1875) = 0.4330127
    assert np.allclose(
        adv,
        [
            0.75 / (0.4330127 + 1e-6),
            -0.25 / (0.4330127 + 1e-6),
            -0.25 / (0.4330127 + 1e-6),
            -0.25 / (0.4330127 + 1e-6),
            0.0,
        ],
        atol=1e-6,
    )
    adv, _ = group_advantages(np.array(["a", "a"]), np.array([1.0, 0.0]), use_std=False)
    assert adv.tolist() == [0.5, -0.5]


def test_group_advantage_with_the_sample_std_hand_computed():
    # mean 0.25, sample std sqrt(0.75 / 3) = 0.5 (verl and TRL: torch.std, unbiased).
    adv, _ = group_advantages(
        np.array(["a", "a", "a", "a"]), np.array([1.0, 0.0, 0.0, 0.0]), ddof=1
    )
    np.testing.assert_allclose(adv, [0.75 / (0.5 + 1e-6)] + [-0.25 / (0.5 + 1e-6)] * 3)
    # Two rollouts: sample variance (0.25 + 0.25) / 1, std √0.5, A = ±0.5 / √0.5 = ±√0.5.
    adv, _ = group_advantages(np.array(["a", "a"]), np.array([1.0, 0.0]), ddof=1)
    np.testing.assert_allclose(adv, [0.5 / (0.5**0.5 + 1e-6), -0.5 / (0.5**0.5 + 1e-6)])


def test_epsilon_bounds_the_advantage_of_a_group_whose_rewards_barely_differ():
    # Rewards 0 and 2e-6: centered ±1e-6, population std 1e-6, so A = ±1e-6 / (1e-6 + ε) = ±0.5.
    adv, _ = group_advantages(np.array(["a", "a"]), np.array([0.0, 2e-6]))
    np.testing.assert_allclose(adv, [-0.5, 0.5], rtol=1e-9)


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=10))
def test_trainable_tokens_after_counts_later_segments_only(n_s):
    after = trainable_tokens_after(n_s)
    assert after == [sum(n_s[i + 1 :]) for i in range(len(n_s))]


def test_rollouts_without_outcome_get_zero_and_do_not_move_their_group():
    groups = np.array(["a", "a", "a", "b"])
    adv, sizes = group_advantages(groups, np.array([1.0, 0.0, np.nan, np.nan]))
    ref, _ = group_advantages(groups[:2], np.array([1.0, 0.0]))
    assert np.allclose(adv[:2], ref) and adv[2] == 0 and adv[3] == 0
    assert sizes.tolist() == [2, 2, 1, 1]
