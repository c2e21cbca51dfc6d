"""build-rl and outcomes: an RL build that accepts nothing fails with what to pass; the
rewards join is counted in the printed summary."""

from __future__ import annotations

from pipeline.cli import main
from tests.readers.util import fixture

SESSION = "5b1d6c2e-0000-4000-8000-00000000c0de"


def test_claude_code_without_rewards_fails_with_one_line_naming_the_option(tmp_path, capsys):
    src = fixture("claude_code", "sidechain.jsonl")
    code = main(["build-rl", str(src), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        "seam build-rl: error: no rollout accepted: 2 of 2 rollout(s) record no outcome; pass "
        "--rewards FILE (CSV or JSONL: rollout_id or session_id, reward; docs/readers.md)"
    ]


def test_rewards_matched_and_unmatched_are_in_the_printed_summary(tmp_path, capsys):
    rewards = tmp_path / "rewards.csv"
    rewards.write_text(f"session_id,reward\n{SESSION},1\nsomething-else,0\n")
    src = fixture("claude_code", "sidechain.jsonl")
    out = tmp_path / "out"
    args = ["build-rl", str(src), "--out", str(out), "--rewards", str(rewards), "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "rewards matched (--rewards)" in printed and "rewards unmatched (--rewards)" in printed
    lines = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in printed.splitlines()
        if line.count("│") >= 3
    }
    assert lines["rewards matched (--rewards)"] == "2"
    assert lines["rewards unmatched (--rewards)"] == "0"
