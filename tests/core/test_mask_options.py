"""Hand-checked masks of the training options and of truncated outputs, through the
mask itself and through ``seam build-rl`` (so a flag the command ignores is caught)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from pipeline.core.mask import MaskOptions, mask_segment
from pipeline.core.segment import Segmenter
from pipeline.sources.canonical_io import rollout_to_json
from tests.core.test_segments_hand_checked import (
    CALL_1,
    CALL_3,
    IM_END,
    SUMMARY,
    three_call_rollout,
)

DONE = "Done."


def truncated_rollout(rollout_id: str = "r1", task_id: str = "t1"):
    """The three-call rollout whose last call (alone in segment 2) hit the length limit."""
    rollout = three_call_rollout()
    rollout.calls()[2].finish_reason = "length"
    return rollout.model_copy(update={"rollout_id": rollout_id, "task_id": task_id})


def n_tokens(renderer, text: str) -> int:
    return len(renderer.encode(text))


# -- the mask itself ----------------------------------------------------------------------


def test_a_rendered_truncated_output_does_not_train_the_end_of_turn_token_the_template_added(
    renderer,
):
    seg = Segmenter(renderer).segments(truncated_rollout())[1]
    span = seg.spans[0]
    assert span.truncated
    # The rendered output is "Done." + <|im_end|>: the policy never sampled that <|im_end|>.
    assert seg.tokens[span.start :].tolist() == renderer.encode(DONE).tolist() + [IM_END]
    masked = mask_segment(seg, MaskOptions(), renderer.eos_id, [False])
    expected = [0] * span.start + [1] * n_tokens(renderer, DONE) + [0]
    assert masked.loss_mask.tolist() == expected


def test_a_logged_truncated_output_is_trained_as_sampled_end_of_turn_token_included(renderer):
    rollout = truncated_rollout()
    sampled = renderer.encode(DONE).tolist() + [IM_END]
    rollout.calls()[2].output_ids = sampled
    seg = Segmenter(renderer).segments(rollout)[1]
    masked = mask_segment(seg, MaskOptions(), renderer.eos_id, [True])
    start = seg.spans[0].start
    assert masked.loss_mask.tolist() == [0] * start + [1] * len(sampled)


def test_a_truncated_output_that_ends_without_end_of_turn_is_trained_whole(renderer):
    rollout = truncated_rollout()
    rollout.calls()[2].output_ids = renderer.encode(DONE).tolist()  # cut before any eos
    seg = Segmenter(renderer).segments(rollout)[1]
    masked = mask_segment(seg, MaskOptions(), renderer.eos_id, [False])
    start = seg.spans[0].start
    assert masked.loss_mask.tolist() == [0] * start + [1] * n_tokens(renderer, DONE)


def test_last_call_only_trains_the_last_call_of_each_segment_and_nothing_else(renderer):
    first, second = Segmenter(renderer).segments(three_call_rollout())
    masked = mask_segment(first, MaskOptions(last_call_only=True), renderer.eos_id, [False] * 2)
    assert masked.trained == [False, True]
    summary = first.spans[1]
    assert masked.loss_mask.tolist() == ([0] * summary.start + [1] * n_tokens(renderer, SUMMARY))
    assert len(first.tokens) == summary.start + summary.length
    # A segment of one call: that call is its last one.
    alone = mask_segment(second, MaskOptions(last_call_only=True), renderer.eos_id, [False])
    assert alone.trained == [True] and alone.num_trainable_tokens == n_tokens(renderer, CALL_3)


def test_mask_summaries_trains_the_action_before_the_summary_exactly(renderer):
    first = Segmenter(renderer).segments(three_call_rollout())[0]
    masked = mask_segment(first, MaskOptions(mask_summaries=True), renderer.eos_id, [False] * 2)
    action = first.spans[0]
    # Hand-checked positions: the action output starts right after the first
    # "<|im_start|>assistant\n" and is CALL_1's tokens; the summary after it is context.
    header = (
        "<|im_start|>system\nYou fix bugs.<|im_end|>\n<|im_start|>user\nFix a.py<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert action.start == n_tokens(renderer, header)
    assert action.length == n_tokens(renderer, CALL_1)
    assert masked.loss_mask.tolist() == (
        [0] * action.start
        + [1] * action.length
        + [0] * (len(first.tokens) - action.start - action.length)
    )
    # Both options: the summary is the last call but it is masked, so nothing trains.
    both = mask_segment(
        first, MaskOptions(mask_summaries=True, last_call_only=True), renderer.eos_id, [False] * 2
    )
    assert both.trained == [False, False] and both.num_trainable_tokens == 0
    assert both.logprobs is None


# -- the options through seam build-rl ----------------------------------------------------


@pytest.fixture(scope="module")
def rollouts_file(tmp_path_factory) -> Path:
    """Two rollouts of one task: one plain, one whose last segment is truncated."""
    path = tmp_path_factory.mktemp("in") / "rollouts.jsonl"
    items = [
        three_call_rollout().model_copy(update={"rollout_id": "plain"}),
        truncated_rollout("cut"),
    ]
    items[1].reward = 0.0
    path.write_bytes(b"\n".join(rollout_to_json(r) for r in items) + b"\n")
    return path


def build_rl(rollouts_file: Path, out: Path, *flags: str) -> list[dict]:
    common = ["--workers", "1", "--no-progress", "--overwrite"]
    assert main(["build-rl", str(rollouts_file), "--out", str(out), *common, *flags]) == 0
    rows = pq.read_table(sorted(out.glob("train-*.parquet"))).to_pylist()
    return sorted(rows, key=lambda r: (r["rollout_id"], r["segment_index"]))


def trained_flags(rows: list[dict]) -> list[tuple[str, list[bool]]]:
    return [(r["rollout_id"], [s["trained"] for s in r["call_spans"]]) for r in rows]


def test_build_rl_flags_reach_the_shards(renderer, rollouts_file, tmp_path):
    plain = build_rl(rollouts_file, tmp_path / "plain")
    assert trained_flags(plain) == [
        ("cut", [True, True]),
        ("cut", [True]),
        ("plain", [True, True]),
        ("plain", [True]),
    ]
    # The truncated rendered output trains "Done." without the added <|im_end|>.
    assert [r["truncated"] for r in plain] == [False, True, False, False]
    assert sum(plain[1]["loss_mask"]) == n_tokens(renderer, DONE)
    assert sum(plain[3]["loss_mask"]) == n_tokens(renderer, CALL_3)

    last = build_rl(rollouts_file, tmp_path / "last", "--last-call-only")
    assert trained_flags(last) == [
        ("cut", [False, True]),
        ("cut", [True]),
        ("plain", [False, True]),
        ("plain", [True]),
    ]
    assert sum(last[2]["loss_mask"]) == n_tokens(renderer, SUMMARY)

    summaries = build_rl(rollouts_file, tmp_path / "summaries", "--mask-summaries")
    assert trained_flags(summaries)[2] == ("plain", [True, False])
    assert sum(summaries[2]["loss_mask"]) == n_tokens(renderer, CALL_1)

    dropped = build_rl(rollouts_file, tmp_path / "dropped", "--drop-truncated")
    assert [(r["rollout_id"], r["segment_index"], r["num_segments"]) for r in dropped] == [
        ("cut", 0, 1),
        ("plain", 0, 2),
        ("plain", 1, 2),
    ]
    counts = json.loads((tmp_path / "dropped" / "manifest.json").read_text())["counts"]
    assert counts["dropped_truncated_segments"] == 1 and counts["segments"] == 3


def test_logprobs_are_given_only_when_every_trained_call_logged_them(renderer):
    rollout = three_call_rollout()
    summary = rollout.calls()[1]
    summary.output_ids = renderer.encode(SUMMARY).tolist()
    summary.logprobs = [-0.5] * len(summary.output_ids)
    first = Segmenter(renderer).segments(rollout)[0]
    # The action before the summary logged none: the segment has no logprobs column...
    assert mask_segment(first, MaskOptions(), renderer.eos_id, [False, True]).logprobs is None
    # ...unless only the summary is trained, and then they sit exactly on its span.
    last = mask_segment(first, MaskOptions(last_call_only=True), renderer.eos_id, [False, True])
    span = first.spans[1]
    assert last.logprobs is not None
    assert last.logprobs.tolist() == [0.0] * span.start + [-0.5] * span.length
