"""`seam ingest`: raw files → canonical Parquet + quarantine, counts reconciled per file."""

import json
import shutil

import pytest

from pipeline.cli import main
from pipeline.sources.canonical_io import iter_canonical_records
from tests.readers.util import FIXTURES, fixture


def ingest(*args) -> int:
    return main(["ingest", "--no-progress", *map(str, args)])


def rollouts_in(out):
    return [parsed for _, parsed in iter_canonical_records(out / "rollouts.parquet")]


def test_a_directory_of_mixed_formats_ingests_with_every_line_accounted_for(tmp_path):
    out = tmp_path / "out"
    assert ingest(FIXTURES, "--out", out) == 0
    summary = json.loads((out / "ingest.json").read_text())
    rollouts = rollouts_in(out)
    assert all(not isinstance(r, str) for r in rollouts)
    assert len(rollouts) == summary["total"]["accepted"]
    for name, counts in summary["files"].items():
        if "lines" in counts:
            assert counts["lines"] == counts["records"], name
    quarantine = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert len(quarantine) == summary["total"]["rejected"]
    assert {q["format"] for q in quarantine} <= {"openai-messages", "unrecognised", "claude-code"}
    assert all({"file", "line", "format", "reason"} <= set(q) for q in quarantine)
    # compacted_local, _legacy, _remote (1 each), _remote_twice (2), _drops_reasoning (1)
    assert summary["formats"]["codex"]["rewrite:compaction"] == 6


def test_rewards_file_is_joined_and_reported(tmp_path):
    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text(
        '{"session_id": "019c8a70-0000-7000-8000-00000000c0de", "reward": 1, "task_id": "tests"}\n'
    )
    out = tmp_path / "out"
    assert ingest(fixture("codex", "rollback.jsonl"), "--out", out, "--rewards", rewards) == 0
    (rollout,) = rollouts_in(out)
    assert (rollout.reward, rollout.task_id) == (1.0, "tests")
    assert json.loads((out / "ingest.json").read_text())["rewards"] == {"matched": 1}


def test_explicit_format_and_compressed_inputs(tmp_path):
    import gzip

    src = tmp_path / "session.jsonl.gz"
    src.write_bytes(gzip.compress(fixture("claude_code", "compact_auto.jsonl").read_bytes()))
    out = tmp_path / "out"
    assert ingest(src, "--out", out, "--format", "claude-code") == 0
    (rollout,) = rollouts_in(out)
    assert [e.reason for e in rollout.events if e.type == "rewrite"] == ["compaction"]


def test_glob_inputs_and_group_by_option(tmp_path):
    shutil.copy(fixture("chat_completions", "gateway_log.jsonl"), tmp_path / "a.jsonl")
    out = tmp_path / "out"
    assert ingest(str(tmp_path / "*.jsonl"), "--out", out, "--group-by", "request.model") == 0
    assert [r.rollout_id for r in rollouts_in(out)] == ["qwen3-8b"]


def test_an_unrecognised_file_named_explicitly_fails_before_any_work(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text('{"lr": 1}')
    assert ingest(bad, "--out", tmp_path / "out") == 2
    assert "format not recognised" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_unrecognised_file_found_in_a_directory_is_quarantined(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "config.json").write_text('{"lr": 1}')
    shutil.copy(fixture("gemini_cli", "legacy_session.json"), src)
    out = tmp_path / "out"
    assert ingest(src, "--out", out) == 0
    (entry,) = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert entry["format"] == "unrecognised" and entry["file"].endswith("config.json")
    assert len(rollouts_in(out)) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "nope"], "unknown --format 'nope'"),
        (["--rewards", "/does/not/exist.csv"], "rewards file"),
    ],
)
def test_bad_options_fail_with_one_line(tmp_path, capsys, args, message):
    assert ingest(fixture("codex", "rollback.jsonl"), "--out", tmp_path / "out", *args) == 2
    assert message in capsys.readouterr().err


def test_existing_output_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    assert ingest(fixture("codex", "rollback.jsonl"), "--out", out) == 0
    assert ingest(fixture("codex", "rollback.jsonl"), "--out", out) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert ingest(fixture("codex", "rollback.jsonl"), "--out", out, "--overwrite") == 0


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    text = capsys.readouterr().out
    for option in ("--out", "--format", "--rewards", "--group-by", "--overwrite", "--no-progress"):
        assert option in text
    assert "claude-code" in text and "chat-completions" in text


def test_build_rl_cuts_ingested_rollouts_at_the_rewrites_the_readers_found(tmp_path):
    import pyarrow.parquet as pq

    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text(
        '{"session_id": "5b1d6c2e-0000-4000-8000-00000000c0de", "reward": 1}\n'
        '{"session_id": "019c8a70-0000-7000-8000-00000000c0de", "reward": 0}\n'
    )
    ingested, built = tmp_path / "ingested", tmp_path / "built"
    assert (
        ingest(
            fixture("claude_code", "compact_auto.jsonl"),
            fixture("codex", "rollback.jsonl"),
            "--out",
            ingested,
            "--rewards",
            rewards,
        )
        == 0
    )
    assert (
        main(
            [
                "build-rl",
                str(ingested / "rollouts.parquet"),
                "--out",
                str(built),
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    rows = pq.read_table(
        sorted(built.glob("*.parquet"))[0],
        columns=["source", "segment_index", "seam_kind", "num_calls"],
    ).to_pylist()
    assert [(r["source"], r["segment_index"], r["seam_kind"], r["num_calls"]) for r in rows] == [
        ("claude-code", 0, "none", 2),
        ("claude-code", 1, "compaction", 1),
        ("codex", 0, "none", 2),
        ("codex", 1, "edit", 1),
    ]
