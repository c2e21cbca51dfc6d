"""--rewards FILE: outcomes joined to rollouts by rollout id or session id."""

import pytest

from pipeline.readers.rewards import RewardsError, apply_rewards, load_rewards
from tests.readers.util import fixture, read


def test_csv_rows_join_by_session_id_and_set_reward_task_and_resolved(tmp_path):
    path = tmp_path / "rewards.csv"
    path.write_text(
        "session_id,reward,task_id,resolved\n5b1d6c2e-0000-4000-8000-00000000c0de,1,login-bug,true\n"
    )
    table = load_rewards(path)
    rollouts, _, _ = read("claude-code", fixture("claude_code", "sidechain.jsonl"))
    joined = [apply_rewards(r, table) for r in rollouts]
    assert [(r.reward, r.task_id, r.resolved, key) for r, key in joined] == [
        (1.0, "login-bug", True, "5b1d6c2e-0000-4000-8000-00000000c0de")
    ] * 2


def test_jsonl_rows_join_by_rollout_id_first(tmp_path):
    path = tmp_path / "rewards.jsonl"
    path.write_text('{"rollout_id": "019c8a70-0000-7000-8000-00000000f0f0", "reward": 0.25}\n')
    rollouts, _, _ = read("codex", fixture("codex", "two_sessions.jsonl"))
    joined = [apply_rewards(r, load_rewards(path)) for r in rollouts]
    assert [(r.reward, key) for r, key in joined] == [
        (None, None),
        (0.25, "019c8a70-0000-7000-8000-00000000f0f0"),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("rollout_id,reward\nr1,high\n", r"rewards.csv:2: reward 'high' is not a number"),
        ("name,reward\nr1,1\n", r"rewards.csv:2: no rollout_id / session_id / id column"),
        (
            "rollout_id,reward,resolved\nr1,1,maybe\n",
            r"rewards.csv:2: resolved 'maybe' is not true/false",
        ),
        (
            "rollout_id,reward\nr1,1\nr2,0\nr1,0\n",
            r"rewards.csv: lines 2 and 4 give 'r1' different outcomes \(reward=1.0 vs reward=0.0\)",
        ),
    ],
)
def test_a_malformed_rewards_file_fails_naming_the_line(tmp_path, text, message):
    path = tmp_path / "rewards.csv"
    path.write_text(text)
    with pytest.raises(RewardsError, match=message):
        load_rewards(path)


def test_identical_repeated_rows_are_one_outcome(tmp_path):
    path = tmp_path / "rewards.csv"
    path.write_text("rollout_id,reward\nr1,1\nr1,1.0\n")
    assert load_rewards(path)["r1"].reward == 1.0


def test_a_sub_agent_gets_its_parents_outcome_by_parent_rollout_id(tmp_path):
    """ATIF embeds a summarization sub-agent whose id is not in the rewards file."""
    path = tmp_path / "rewards.csv"
    path.write_text("rollout_id,reward,task_id\nrun-7,1,task-a\n")
    rollouts, _, _ = read("atif", fixture("atif", "embedded_subagent.json"))
    joined = [apply_rewards(r, load_rewards(path)) for r in rollouts]
    assert [(r.rollout_id, r.reward, r.task_id, key) for r, key in joined] == [
        ("run-7", 1.0, "task-a", "run-7"),
        ("run-7/compact-001", 1.0, "task-a", "run-7"),
    ]
