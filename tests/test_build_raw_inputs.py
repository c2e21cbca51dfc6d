"""From a harness's own session files to shards in one command (raw format + --rewards)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pipeline.build.run import BuildConfig, BuildError, run_build

FIXTURES = Path(__file__).parent / "fixtures" / "raw"
SESSION = "5b1d6c2e-0000-4000-8000-00000000c0de"


def test_claude_code_session_with_rewards_file_builds_in_one_step(tmp_path):
    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text(
        json.dumps({"session_id": SESSION, "reward": 1.0, "task_id": "fix-test"}) + "\n"
    )
    out = tmp_path / "rl"
    result = run_build(
        BuildConfig(
            inputs=[str(FIXTURES / "claude_code" / "compact_auto.jsonl")],
            out=str(out),
            rewards=str(rewards),
            progress=False,
            workers=1,
        )
    )
    assert result.counts["accepted"] == 1 and result.counts["rewards_matched"] == 1
    rows = duckdb.sql(
        f"SELECT task_id, reward, seam_kind, seam_trigger FROM '{out}/train-*.parquet' "
        "ORDER BY segment_index"
    ).fetchall()
    assert [r[:2] for r in rows] == [("fix-test", 1.0)] * len(rows)
    assert [r[2] for r in rows] == ["none", "compaction"] and rows[1][3] == "budget"


def test_without_rewards_the_build_is_refused_with_the_fix_named(tmp_path):
    """Claude Code logs never record an outcome: the build says so before any work (it
    used to read every input, then quarantine every session for the same reason)."""
    out = tmp_path / "rl"
    with pytest.raises(BuildError, match=r"claude-code logs record no outcome.*--rewards FILE"):
        run_build(
            BuildConfig(
                inputs=[str(FIXTURES / "claude_code" / "compact_auto.jsonl")],
                out=str(out),
                progress=False,
                workers=1,
            )
        )
    assert not out.exists()


def test_a_malformed_rewards_file_fails_before_any_work(tmp_path):
    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text('{"session_id": "x", "reward": "lots"}\n')
    with pytest.raises(BuildError, match="is not a number"):
        run_build(
            BuildConfig(
                inputs=[str(FIXTURES / "claude_code" / "compact_auto.jsonl")],
                out=str(tmp_path / "rl"),
                rewards=str(rewards),
                progress=False,
            )
        )
    assert not (tmp_path / "rl").exists()
