"""The DuckDB views and the standard queries, on real builds of hand-written rollouts."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from pipeline.build.stats import HEADLINE_COUNTS
from pipeline.cli import main
from pipeline.inspect.duckdb_views import BuildDirError, connect, view_names
from pipeline.inspect.standard_queries import EXAMPLES, STANDARD
from tests.sample_builds import BROKEN_LINES, ROLLOUTS, shard_rows

DOCS = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def test_each_view_has_one_row_per_thing_it_names(rl_build):
    con = connect(rl_build)
    rows = shard_rows(rl_build)
    assert con.execute("SELECT count(*) FROM segments").fetchone()[0] == len(rows)
    assert con.execute("SELECT count(*) FROM calls").fetchone()[0] == sum(
        r["num_calls"] for r in rows
    )
    assert con.execute("SELECT count(*) FROM rollouts").fetchone()[0] == len(ROLLOUTS)
    assert con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == len(BROKEN_LINES)
    assert view_names(con) == ["calls", "fidelity", "quarantine", "rollouts", "segments", "witness"]
    assert con.execute("SELECT count(*) FROM fidelity").fetchone()[0] == len(rows)


def test_calls_view_counts_the_tool_calls_each_output_made(rl_build):
    con = connect(rl_build)
    per_call = con.execute("""SELECT call_index, kind, tool_calls FROM calls WHERE rollout_id = 'a0'
                              ORDER BY call_index""").fetchall()
    assert per_call == [(0, "action", 2), (1, "action", 0)]
    summaries = con.execute(
        "SELECT DISTINCT tool_calls FROM calls WHERE kind = 'summary'"
    ).fetchall()
    assert summaries == [(0,)]


def test_calls_view_tokens_are_the_trained_spans_of_the_loss_mask(rl_build):
    con = connect(rl_build)
    trained = con.execute("SELECT sum(tokens) FROM calls WHERE trained").fetchone()[0]
    assert trained == sum(sum(r["loss_mask"]) for r in shard_rows(rl_build))


def test_rollouts_view_aggregates_segments_and_calls_per_rollout(rl_build):
    con = connect(rl_build)
    got = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT rollout_id, num_compactions, num_segments, summary_calls, passed, reward FROM rollouts"
        ).fetchall()
    }
    compactions = {"no_compaction": 0, "one_compaction": 1, "two_compactions": 2}
    for rollout_id, _, story, reward in ROLLOUTS:
        n = compactions[story.__name__]
        assert got[rollout_id] == (n, n + 1, n, reward > 0, reward)


def test_pass_rate_by_compactions_matches_a_count_by_hand(rl_build):
    by_hand: dict[int, list[float]] = {}
    compactions = {"no_compaction": 0, "one_compaction": 1, "two_compactions": 2}
    for _, _, story, reward in ROLLOUTS:
        by_hand.setdefault(compactions[story.__name__], []).append(reward)
    rows = connect(rl_build).execute(EXAMPLES[0].sql).fetchall()
    assert rows == [
        (n, len(r), round(sum(x > 0 for x in r) / len(r), 3), round(sum(r) / len(r), 3))
        for n, r in sorted(by_hand.items())
    ]


def test_quarantine_reasons_group_records_of_the_same_kind(rl_build):
    rows = (
        connect(rl_build)
        .execute("SELECT reason_kind, count(*) FROM quarantine GROUP BY 1")
        .fetchall()
    )
    kinds = dict(rows)
    assert sum(kinds.values()) == len(BROKEN_LINES)
    assert any(k.startswith("invalid JSON") and n == 2 for k, n in kinds.items())
    assert not any(re.search(r"\d", k) for k in kinds)


@pytest.mark.parametrize("query", EXAMPLES, ids=lambda q: q.title)
def test_readme_example_query_runs_on_a_real_build(rl_build, query):
    cursor = connect(rl_build).execute(query.sql)
    assert cursor.fetchall(), f"{query.title} returned no rows"


def test_docs_show_exactly_the_five_example_queries():
    blocks = re.findall(r"```sql\n(.*?)\n```", DOCS.read_text(), re.S)
    assert blocks == [q.sql for q in EXAMPLES]


def test_the_readme_names_every_documented_view_and_copies_no_query():
    """docs/data.md is the one place for the views' columns and the queries: the README
    only names the views and links there (a copy would go stale unseen)."""
    readme = (DOCS.parents[1] / "README.md").read_text()
    views = DOCS.read_text().split("## Views", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `(\w+)`", views, re.M)
    assert {"segments", "calls", "rollouts", "quarantine", "corrections", "audit"} <= set(
        documented
    )
    section = readme.split("## Looking at the data", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{view}`" in section for view in documented)
    assert "(docs/data.md)" in section
    assert not any(q.sql in readme for q in STANDARD)
    assert "```sql" not in readme


def test_sft_builds_add_corrections_and_audit_views(sft_build):
    con = connect(sft_build)
    assert {"corrections", "audit"} <= set(view_names(con))
    assert con.execute("SELECT rollout_id, type, verdict FROM corrections").fetchall() == [
        ("good", "state", "omission")
    ]
    summaries = sum(len(r["summary_audit"]) for r in shard_rows(sft_build))
    assert summaries > 0
    assert con.execute("SELECT count(*) FROM audit").fetchone()[0] == summaries
    for query in STANDARD:
        assert con.execute(query.sql).fetchall(), query.title


def test_rl_builds_have_no_judge_views(rl_build):
    assert not {"corrections", "audit"} & set(view_names(connect(rl_build)))


def test_a_directory_without_shards_is_refused_with_a_clear_message(tmp_path):
    with pytest.raises(BuildDirError, match="no train-"):
        connect(tmp_path)


def test_seam_sql_writes_csv_and_json(rl_build, capsys):
    query = "SELECT rollout_id, num_compactions FROM rollouts ORDER BY rollout_id"
    assert main(["sql", str(rl_build), query, "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["rollout_id", "num_compactions"] and len(rows) == 1 + len(ROLLOUTS)
    assert main(["sql", str(rl_build), query, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["rollout_id"] for r in records] == sorted(r[0] for r in ROLLOUTS)


def test_seam_sql_reports_a_bad_query_in_one_line(rl_build, capsys):
    assert main(["sql", str(rl_build), "SELECT * FROM nowhere"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nowhere" in err and "rollouts" in err


def test_seam_stats_prints_every_standard_table(sft_build, capsys):
    assert main(["stats", str(sft_build)]) == 0
    out = capsys.readouterr().out
    for query in STANDARD:
        assert query.title in out
    assert "read = accepted + quarantined" in out


def test_stats_counts_agree_with_the_manifest(rl_build):
    from pipeline.inspect.standard_queries import build_counts

    counts, seams, _ = build_counts(connect(rl_build), rl_build)
    manifest = json.loads((rl_build / "manifest.json").read_text())
    for key in HEADLINE_COUNTS:
        assert counts[key] == manifest["counts"][key], key
    assert Counter(manifest["seams"]) == seams


def test_reasons_that_differ_only_by_a_session_id_are_one_kind(tmp_path):
    """Session ids mix letters and digits: blanking only the digit runs left each id's
    letters behind (``Nbdc…``), so one reason made as many kinds as sessions."""
    import duckdb

    from pipeline.inspect.duckdb_views import _quarantine_sql

    path = tmp_path / "quarantine.jsonl"
    reasons = [
        "session 5b1d6c2e-0000-4000-8000-00000000c0de: duplicate rollout_id at line 12",
        "session a7f09e31-1111-4abc-9def-0123456789ab: duplicate rollout_id at line 3",
    ]
    path.write_text(
        "".join(json.dumps({"file": "x", "line": 1, "reason": r}) + "\n" for r in reasons)
    )
    con = duckdb.connect()
    con.execute(_quarantine_sql(path))
    kinds = con.execute("SELECT DISTINCT reason_kind FROM quarantine").fetchall()
    assert kinds == [("session N: duplicate rollout_id at line N",)]


def test_the_tool_call_id_is_reread_when_the_tokenizer_file_changes(tmp_path):
    """connect() caches the <tool_call> id per tokenizer.json version (path, mtime, size):
    a tokenizer rewritten in place gives its new id, not the cached one."""
    import os

    from pipeline.inspect.duckdb_views import TOOL_CALL_TOKEN, _tool_call_token_id

    manifest = {"tokenizer": {"name_or_path": str(tmp_path)}}
    file = tmp_path / "tokenizer.json"
    file.write_text(json.dumps({"added_tokens": [{"id": 7, "content": TOOL_CALL_TOKEN}]}))
    assert _tool_call_token_id(manifest) == 7
    file.write_text(json.dumps({"added_tokens": [{"id": 12, "content": TOOL_CALL_TOKEN}]}))
    os.utime(file, ns=(1, 1))  # a different mtime even where the clock is coarse
    assert _tool_call_token_id(manifest) == 12
    assert _tool_call_token_id({"tokenizer": {"name_or_path": str(tmp_path / "none")}}) is None
