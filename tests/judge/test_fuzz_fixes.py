"""Regressions for bugs found by the robustness work in the judge and the SFT stage.

- The judge client redacts the API key from whatever the server sent back (error
  bodies, malformed responses, answers), also when it is echoed across the cut where
  an error body is shortened.
- A rollout the SFT stage rejects while accepting it (``TaskStage.accept`` raising
  ``RejectedRollout``) is quarantined and leaves no row in the part file.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from judge.llm import judge_rollouts
from pipeline.build.run import BuildConfig, run_build
from pipeline.core.rows import RejectedRollout
from pipeline.sft.filters import FilterOptions
from pipeline.sft.stage import SftStage, TaskStage
from tests.judge.rollouts import Story
from tests.judge.test_llm import KEY, VERDICT, client, completion, ok, rollout, serve  # noqa: F401 (fixture)


def test_the_key_echoed_by_the_server_is_redacted_everywhere(serve, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SEAM_TEST_KEY", KEY)
    across_the_cut = {
        "error": "x" * (300 - len('{"error": "') - 10) + KEY
    }  # the key straddles byte 300
    server = serve(
        ok({"error": f"bad key Bearer {KEY}"}, status=401),
        ok(across_the_cut, status=403),
        ok({"error": f"upstream saw {KEY}"}, status=500),
        ok({"error": f"upstream saw {KEY}"}, status=503),
        (200, f"<html>{KEY}</html>".encode(), 0.0, {}),
        ok("your key is " + KEY + " " + json.dumps(VERDICT)),
    )
    reasons = []
    for _ in range(5):
        _, failures = judge_rollouts(
            [rollout()], client(server, tmp_path, max_retries=1 if _ == 2 else 0)
        )
        if _ == 2:
            continue  # the 500 and the 503 of one request
        reasons += [f.reason for f in failures]
    findings, failures = judge_rollouts([rollout()], client(server, tmp_path, max_retries=0))
    assert len(reasons) == 4 and failures == [] and findings
    assert all("***" in r and KEY not in r for r in reasons), reasons
    assert not any(
        KEY[:8] in r for r in reasons
    )  # nor half a key, cut where the error body is shortened
    cached = "".join(p.read_text() for p in (tmp_path / "cache").rglob("*.json"))
    assert "***" in cached and KEY not in cached
    assert KEY not in json.dumps([f.model_dump(mode="json") for f in findings])


def test_a_rollout_rejected_while_the_sft_stage_accepts_it_leaves_no_rows(tmp_path, monkeypatch):
    stories = [
        Story(name).act(("bash", {"command": "ls"}, "a.py")).act(("submit", {}, "done"))
        for name in ("first", "broken", "last")
    ]
    (tmp_path / "in.jsonl").write_text(
        "".join(s.build(reward=1.0).model_dump_json() + "\n" for s in stories)
    )
    accept = TaskStage.accept

    def failing_accept(self, rollout, segments):
        if rollout.rollout_id == "broken":
            raise RejectedRollout("cannot make its SFT columns")
        return accept(self, rollout, segments)

    monkeypatch.setattr(TaskStage, "accept", failing_accept)
    result = run_build(
        BuildConfig(
            inputs=[str(tmp_path / "in.jsonl")],
            out=str(tmp_path / "out"),
            kind="sft",
            workers=1,
            progress=False,
            stage=SftStage(None, FilterOptions()),
        )
    )
    assert (result.counts["accepted"], result.counts["quarantined"]) == (2, 1)
    (entry,) = [
        json.loads(x) for x in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()
    ]
    assert entry["line"] == 2 and "cannot make its SFT columns" in entry["reason"]
    rows = [r for shard in result.shards for r in pq.read_table(result.out / shard).to_pylist()]
    assert {r["rollout_id"] for r in rows} == {"first", "last"}
    assert all(
        r["messages"] and json.loads(r["messages"]) for r in rows
    )  # extras line up with their rows
