"""slime / verl / SkyRL token dumps: masked runs become calls, siblings reassembled."""

import pytest

from tests.readers.util import fixture, read, shape


def test_slime_multi_turn_sample_splits_at_masked_out_tool_tokens():
    rollouts, rejected, _ = read("slime", fixture("slime", "samples.jsonl"))
    assert not rejected
    sample = rollouts[0]
    first, second = sample.calls()
    assert (first.prompt_ids, first.output_ids, first.logprobs) == (
        [1, 2, 3],
        [10, 11],
        [-0.1, -0.2],
    )
    assert (second.prompt_ids, second.output_ids) == ([1, 2, 3, 10, 11, 50, 51, 52], [12, 13])
    assert sample.events[2].meta["token_ids"] == [50, 51, 52]
    assert (sample.reward, sample.task_id) == (1.0, "count-files")


def test_slime_siblings_sharing_a_rollout_id_are_one_rollout_with_a_compaction_between():
    rollouts, _, _ = read("slime", fixture("slime", "samples.jsonl"))
    traj = rollouts[1]
    assert (traj.rollout_id, traj.reward, traj.meta["samples"]) == ("traj-9", 1.0, 2)
    assert [e[0] for e in shape(traj)] == ["user", "assistant", "rewrite", "assistant"]
    assert traj.events[2].reason == "compaction"
    assert (
        traj.calls()[1].prompt_ids == [1, 2, 90, 91] and traj.calls()[1].finish_reason == "length"
    )


def test_verl_agent_loop_output_masks_and_reward():
    rollouts, _, _ = read("verl", fixture("verl", "agent_loop_outputs.jsonl"))
    calls = rollouts[0].calls()
    assert [c.output_ids for c in calls] == [[30, 31], [32]]
    assert calls[1].prompt_ids == [1, 2, 3, 30, 31, 40, 41]
    assert (rollouts[0].rollout_id, rollouts[0].task_id, rollouts[0].reward) == (
        "req-1",
        "task-7",
        0.5,
    )


def test_skyrl_batch_rows_of_one_trajectory_are_reassembled_step_by_step():
    rollouts, _, _ = read("skyrl", fixture("skyrl", "generator_output.jsonl"))
    (traj,) = rollouts
    assert (traj.rollout_id, traj.task_id, traj.reward) == ("inst-3:0", "inst-3", 1.0)
    assert [c.output_ids for c in traj.calls()] == [[5, 6], [8, 9]]
    assert [e[0] for e in shape(traj)] == ["user", "assistant", "user", "assistant"]


def test_mask_that_does_not_fit_the_response_is_rejected(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_ids": [1], "response_ids": [2, 3], "response_mask": [1]}\n')
    rollouts, rejected, _ = read("verl", path)
    assert not rollouts and rejected[0].reason == "mask has 1 entries for 2 response tokens"


def test_slime_pt_dump_is_loaded_without_running_code(tmp_path):
    torch = pytest.importorskip("torch")
    import json

    samples = [
        json.loads(line) for line in fixture("slime", "samples.jsonl").read_text().splitlines()
    ]
    for s in samples:
        s["tokens"] = torch.tensor(s["tokens"])
    path = tmp_path / "rollout_0.pt"
    torch.save({"rollout_id": 0, "samples": samples}, path)
    rollouts, rejected, _ = read("slime", path)
    assert not rejected and [r.rollout_id for r in rollouts] == ["g0-i0", "traj-9"]


class Arbitrary:
    """An object only a full unpickler (running this module's code) could rebuild."""


def test_pt_dump_that_needs_code_to_load_is_rejected(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "unsafe.pt"
    torch.save({"samples": [Arbitrary()]}, path)
    rollouts, rejected, _ = read("slime", path)
    assert not rollouts and "weights_only" in rejected[0].reason
