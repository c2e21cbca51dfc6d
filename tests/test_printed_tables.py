"""What the commands print stays readable outside a terminal (pipes, logs, CI): file
names are not cut at 80 columns, and the build summary shows the skipped records as a
total and their largest reasons, not one row per record type."""

from __future__ import annotations

import shutil

from rich.console import Console

from pipeline.build.summary_table import SKIPPED_SHOWN, summary_table
from pipeline.cli import main
from tests.readers.util import fixture


def test_ingest_prints_long_file_names_whole_in_a_pipe(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    name = "session-" + "0123456789abcdef" * 6 + ".jsonl"  # 110 characters
    src = tmp_path / name
    shutil.copy(fixture("claude_code", "sidechain.jsonl"), src)
    assert main(["ingest", str(src), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert name in capsys.readouterr().out


def test_the_summary_shows_a_total_and_the_largest_skipped_reasons():
    skipped = {f"record type {i:02d}": i + 1 for i in range(50)}
    console = Console(width=200, record=True)
    console.print(summary_table("t", {"read": 1, "accepted": 1}, {}, skipped, 0))
    text = console.export_text()
    (total,) = [line for line in text.splitlines() if "skipped records" in line]
    assert total.split("│")[2].strip() == f"{sum(skipped.values()):,}"
    shown = [line for line in text.splitlines() if "record type" in line]
    assert len(shown) == SKIPPED_SHOWN
    assert "record type 49" in shown[0]  # the largest first
    assert "47 more reason(s)" in text
