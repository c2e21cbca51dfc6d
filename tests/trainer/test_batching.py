"""Reading shards into segments, planning steps, packing micro-batches (no torch needed)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.shard_schema import SHARD_SCHEMA
from trainer.batching import pack, plan_steps, read_segments
from trainer.synthetic import rollout_rows, write_synthetic_shard

VOCAB = 151665
ROLLOUTS = [[(12, 6), (10, 5), (8, 4)], [(14, 8)], [(9, 7), (11, 3)]]


@pytest.fixture
def segments(tmp_path):
    write_synthetic_shard(tmp_path, ROLLOUTS, VOCAB, seed=1)
    return read_segments(tmp_path)


def test_segments_keep_the_shard_order_and_metadata(segments):
    assert [(s.rollout_id, s.segment_index) for s in segments] == [
        ("r0000", 0),
        ("r0000", 1),
        ("r0000", 2),
        ("r0001", 0),
        ("r0002", 0),
        ("r0002", 1),
    ]
    assert [s.num_trainable_tokens for s in segments] == [6, 5, 4, 8, 7, 3]
    assert [s.trainable_tokens_after for s in segments] == [9, 4, 0, 0, 3, 0]
    assert [s.reward for s in segments] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]


def test_steps_take_whole_rollouts_and_cycle(segments):
    steps = plan_steps(segments, rollouts_per_step=2, num_steps=3)
    ids = [[(s.rollout_id, s.segment_index) for s in step] for step in steps]
    assert ids[0] == [("r0000", 0), ("r0000", 1), ("r0000", 2), ("r0001", 0)]
    assert ids[1] == [("r0002", 0), ("r0002", 1), ("r0000", 0), ("r0000", 1), ("r0000", 2)]
    assert ids[2] == [("r0001", 0), ("r0002", 0), ("r0002", 1)]


def test_a_step_never_repeats_a_segment_when_asking_for_more_rollouts_than_exist(segments):
    (step,) = plan_steps(segments, rollouts_per_step=10, num_steps=1)
    assert len(step) == len(segments)


def test_a_token_cap_moves_the_rest_of_a_rollout_to_the_next_step(segments):
    steps = plan_steps(segments, rollouts_per_step=8, num_steps=2, max_step_tokens=40)
    assert [(s.rollout_id, s.segment_index) for s in steps[0]] == [
        ("r0000", 0),
        ("r0000", 1),
    ]  # 18 + 15 tokens
    assert [(s.rollout_id, s.segment_index) for s in steps[1]] == [
        ("r0000", 2),
        ("r0001", 0),
    ]  # 12 + 22 tokens


def test_packing_places_every_segment_once_within_the_budget(segments):
    batches = pack(segments, token_budget=40)
    placed = sorted(index for b in batches for index, _, _ in b.spans)
    assert placed == list(range(len(segments)))
    for b in batches:
        assert b.num_tokens <= 40
        for index, start, end in b.spans:
            seg = segments[index]
            np.testing.assert_array_equal(b.input_ids[start:end], seg.input_ids)
            np.testing.assert_array_equal(b.position_ids[start:end], np.arange(end - start))
            # Prediction coordinates: position p is trained iff token p+1 of the segment was generated.
            np.testing.assert_array_equal(
                b.trainable[start:end], np.append(seg.loss_mask[1:], False)
            )
            np.testing.assert_array_equal(b.targets[start : end - 1], seg.input_ids[1:])
    assert sum(int(b.trainable.sum()) for b in batches) == sum(
        s.num_trainable_tokens for s in segments
    )


def test_a_segment_longer_than_the_budget_gets_a_row_of_its_own(segments):
    batches = pack(segments, token_budget=5)
    assert len(batches) == len(segments)


def test_shard_logprobs_are_shifted_to_the_position_that_predicts_them(tmp_path):
    rows = rollout_rows("r", [(4, 3)], 1.0, np.random.default_rng(0), VOCAB, with_logprobs=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), tmp_path / "train-00000-of-00001.parquet"
    )
    (batch,) = pack(read_segments(tmp_path), token_budget=100)
    logged = np.array(rows[0]["logprobs"], dtype=np.float32)
    np.testing.assert_array_equal(batch.old_logprobs[3:6], logged[4:7])
    assert np.isnan(batch.old_logprobs[6])


def test_a_trainable_first_token_is_refused(tmp_path):
    rows = rollout_rows("r", [(0, 3)], 1.0, np.random.default_rng(0), VOCAB, with_logprobs=False)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), tmp_path / "train-00000-of-00001.parquet"
    )
    with pytest.raises(ValueError, match="first token is marked trainable"):
        read_segments(tmp_path)


def test_an_empty_directory_says_how_to_make_shards(tmp_path):
    with pytest.raises(FileNotFoundError, match="seam build-rl"):
        read_segments(tmp_path)
