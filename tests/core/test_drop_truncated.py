"""``--drop-truncated`` drops segments, never group members.

Decision (issue 13, item 7): a rollout whose segments are all dropped because a call was
cut by the length limit is still a sample of the policy on its task, so it stays in its
GRPO group: the baseline ``mean_g R`` (and std) is over every rollout sampled for the
task, as in DAPO's overlong filtering (truncated samples leave the loss, not the group).
Otherwise dropping them would shift the other rollouts' advantages — typically upward,
since cut rollouts mostly fail — and make the training signal depend on a filter.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from pipeline.build.run import BuildConfig, run_build
from schemas.rollout import MessageEvent
from tests.judge.rollouts import Story


def rollouts():
    cut = Story("cut").act(("bash", {"command": "pytest"}, "1 failed")).build(reward=0.0)
    # Its last call was cut by max tokens: every segment of "cut" contains a truncated call.
    events = list(cut.events)
    events.append(
        MessageEvent(id="a-cut", role="assistant", content="Let me", finish_reason="length")
    )
    cut = cut.model_copy(update={"events": events})
    good = Story("good").say("Fixed it.").build(reward=1.0)
    bad = Story("bad").say("Cannot fix it.").build(reward=0.0)
    return [good, bad, cut]


def build(tmp_path, name, **options):
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(r.model_dump_json(exclude_none=True) for r in rollouts()) + "\n")
    out = tmp_path / name
    result = run_build(
        BuildConfig(inputs=[str(source)], out=str(out), workers=1, progress=False, **options)
    )
    manifest = json.loads((out / "manifest.json").read_text())
    rows = [r for s in manifest["shards"] for r in pq.read_table(out / s).to_pylist()]
    return {r["rollout_id"]: (r["advantage"], r["group_size"]) for r in rows}, result


def test_dropped_rollouts_stay_in_their_group(tmp_path):
    kept, _ = build(tmp_path, "all")
    dropped, result = build(tmp_path, "dropped", drop_truncated=True)
    assert set(kept) == {"good", "bad", "cut"}
    assert set(dropped) == {"good", "bad"}
    assert result.counts["dropped_truncated_segments"] == 1
    assert result.counts["rollouts_without_segments"] == 1
    # Rewards [1, 0, 0]: mean 1/3, population std √2/3; the dropped rollout still counts.
    for rollout in ("good", "bad"):
        assert dropped[rollout] == kept[rollout]
        assert dropped[rollout][1] == 3
