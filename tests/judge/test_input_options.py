"""`seam judge` and `seam audit` read their inputs as the builds do: `--group-by` and the
per-record limits (`--max-line-mb`, ...) mean the same there as in `seam build-rl`/`ingest`."""

from __future__ import annotations

import json

from pipeline.cli import main
from tests.readers.util import fixture

GATEWAY_LOG = fixture("chat_completions", "gateway_log.jsonl")


def _finding_rollouts(tmp_path, *options: str) -> set[str]:
    out = tmp_path / "findings.jsonl"
    assert main(["judge", str(GATEWAY_LOG), "--out", str(out), "--checks", "all", *options]) == 0
    return {json.loads(line)["rollout_id"] for line in out.read_text().splitlines()}


def test_judge_groups_chat_completion_calls_by_the_group_by_field(tmp_path):
    assert _finding_rollouts(tmp_path) == {"sess-1"}  # the log's session_id
    assert _finding_rollouts(tmp_path, "--group-by", "request.model") == {"qwen3-8b"}


def test_audit_skips_a_line_over_the_line_limit_naming_it_and_reads_its_neighbours(
    tmp_path, capsys
):
    log = tmp_path / "log.jsonl"
    too_long = json.dumps({"pad": "x" * (1 << 20)}) + "\n"  # over 1 MiB
    first, *rest = GATEWAY_LOG.read_text().splitlines(keepends=True)
    log.write_text("".join([first, too_long, *rest]))
    assert main(["audit", str(log), "--json", "--max-line-mb", "1"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["summaries"] == 1  # the log's summary is still audited
    assert (
        f"skipped 1 rollout(s) or record(s): {log}: line of {len(too_long):,} bytes exceeds "
        "the max_line_bytes limit (1 MiB; raise it with --max-line-mb)"
    ) in captured.err
