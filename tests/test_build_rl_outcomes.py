"""build-rl and outcomes: an RL build that accepts nothing fails with what to pass; the
rewards join is counted in the printed summary."""

from __future__ import annotations

from pipeline.cli import main
from tests.readers.util import fixture

SESSION = "5b1d6c2e-0000-4000-8000-00000000c0de"


def test_claude_code_without_rewards_is_refused_before_reading(tmp_path, capsys):
    """Claude Code logs never record an outcome: without --rewards the build says so at
    once, before any task runs (the output directory, made before the first task, is
    not even created)."""
    src = fixture("claude_code", "sidechain.jsonl")
    out = tmp_path / "out"
    code = main(["build-rl", str(src), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        "seam build-rl: error: claude-code logs record no outcome, so an RL build needs --rewards "
        "FILE (CSV or JSONL: rollout_id or session_id, reward; docs/readers.md) — or build SFT "
        "data with seam build-sft"
    ]
    assert not out.exists()


def test_a_format_that_can_record_outcomes_is_not_refused_up_front(tmp_path, capsys):
    """A canonical rollout without a reward is only found out by reading it: the build
    runs and then names the reason (the up-front refusal is for formats that never do)."""
    src = fixture("claude_code", "sidechain.jsonl")
    canonical = tmp_path / "in.jsonl"
    assert main(["ingest", str(src), "--out", str(canonical)]) == 0
    capsys.readouterr()
    code = main(["build-rl", str(canonical), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "no rollout accepted:" in err and "record no outcome; pass --rewards FILE" in err


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
