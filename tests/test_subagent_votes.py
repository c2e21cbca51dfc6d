"""A rollout and its sub-agents are one vote in their GRPO group (hand-checked and property)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.build.run import BuildConfig, run_build
from pipeline.build.worker import TaskResult
from pipeline.build.write import compute_group_stats
from pipeline.core.advantage import group_advantages
from pipeline.sources.canonical_io import rollout_to_json
from tests.core.test_segments_hand_checked import three_call_rollout


def test_a_session_with_two_sub_agents_in_a_group_of_two_gets_plus_and_minus_one(tmp_path):
    """Hand-checked: rewards 1 (with 2 sub-agents, reward 1 each) and 0. Counted as four
    rollouts the mean would be 0.75 and the std 0.433: +0.577 and −1.732. One vote per
    session: mean 0.5, std 0.5, so +1 and −1."""
    task = {"task_id": "t"}
    rollouts = [
        three_call_rollout(rollout_id="s1", reward=1.0, **task),
        three_call_rollout(rollout_id="s1/agent-a", reward=1.0, parent_rollout_id="s1", **task),
        three_call_rollout(rollout_id="s1/agent-b", reward=1.0, parent_rollout_id="s1", **task),
        three_call_rollout(rollout_id="s2", reward=0.0, **task),
    ]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(rollout_to_json(r) for r in rollouts) + b"\n")
    out = tmp_path / "out"
    result = run_build(BuildConfig(inputs=[str(src)], out=str(out), progress=False, workers=1))
    rows = pq.read_table(out / result.shards[0]).to_pylist()
    got = {(r["rollout_id"], r["advantage"], r["group_size"]) for r in rows}
    assert {(rid, round(a, 4), n) for rid, a, n in got} == {
        ("s1", 1.0, 2),
        ("s1/agent-a", 1.0, 2),
        ("s1/agent-b", 1.0, 2),
        ("s2", -1.0, 2),
    }
    assert {r["parent_rollout_id"] for r in rows if "/" in r["rollout_id"]} == {"s1"}
    assert result.group_of_one == 0


def _stats(tasks: list[dict]) -> tuple:
    results = [TaskResult(i, "f", "canonical", 0, {}, {}, {}, g, []) for i, g in enumerate(tasks)]
    return compute_group_stats(results, use_std=True)


@settings(max_examples=60, deadline=None)
@given(
    parents=st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from([0.0, 0.5, 1.0])),
        min_size=1,
        max_size=8,
    ),
    children=st.lists(
        st.tuples(st.integers(0, 7), st.sampled_from([0.0, 1.0]), st.sampled_from("abcd")),
        max_size=10,
    ),
    split=st.integers(0, 3),
)
def test_adding_sub_agents_changes_no_advantage_and_gives_them_their_parents(
    parents, children, split
):
    """Sub-agents (any reward, any task id, in any task of the build, nested or not)
    leave every top-level rollout's advantage as GRPO over the top-level rollouts alone
    gives it, and each sub-agent gets its top-level rollout's advantage and group size."""
    ids = [f"p{i}" for i in range(len(parents))]
    expected, sizes = group_advantages(
        np.array([k for k, _ in parents], dtype=object), np.array([r for _, r in parents])
    )
    rows = [(pid, None, k, r) for pid, (k, r) in zip(ids, parents)]
    top = {pid: pid for pid in ids}
    for j, (p, r, k) in enumerate(children):
        parent = rows[p % len(rows)][0]  # a parent or an earlier sub-agent (nesting)
        rows.append((f"c{j}", parent, k, r))
        top[f"c{j}"] = top[parent]
    cut = min(split, len(rows))
    parts = [rows[:cut], rows[cut:]]
    tasks = [
        {
            "task_id": [k for _, _, k, _ in part],
            "reward": [r for _, _, _, r in part],
            "ordinal": list(range(len(part))),
            "rollout_id": [rid for rid, _, _, _ in part],
            "parent_rollout_id": [p for _, p, _, _ in part],
        }
        for part in parts
    ]
    stats, _ = _stats(tasks)
    want = {pid: (a, n) for pid, a, n in zip(ids, expected, sizes)}
    for t, part in enumerate(parts):
        for o, (rid, _, _, _) in enumerate(part):
            adv, size = stats[t][0][o], stats[t][1][o]
            assert np.isclose(adv, want[top[rid]][0], atol=1e-5), rid
            assert size == want[top[rid]][1], rid


def test_parts_without_ids_still_vote_per_rollout():
    stats, _ = _stats([{"task_id": ["t", "t"], "reward": [1.0, 0.0], "ordinal": [0, 1]}])
    assert [round(float(a), 4) for a in stats[0][0]] == [1.0, -1.0]


def test_claude_code_sidechains_share_their_session_vote(tmp_path):
    """Real reader output: the sidechain fixture (a session and its sub-agent), a second
    session of the same task with reward 0 → ±1, not +0.707/−1.414."""
    from tests.readers.util import fixture

    session = "5b1d6c2e-0000-4000-8000-00000000c0de"
    other = tmp_path / "other.jsonl"
    lines = fixture("claude_code", "sidechain.jsonl").read_text().splitlines()
    main_only = [ln for ln in lines if '"isSidechain":false' in ln]
    other.write_text("\n".join(ln.replace(session, "0ther") for ln in main_only) + "\n")
    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text(
        json.dumps({"session_id": session, "reward": 1, "task_id": "t"})
        + "\n"
        + json.dumps({"session_id": "0ther", "reward": 0, "task_id": "t"})
        + "\n"
    )
    out = tmp_path / "out"
    config = BuildConfig(
        inputs=[str(fixture("claude_code", "sidechain.jsonl")), str(other)],
        out=str(out),
        rewards=str(rewards),
        progress=False,
        workers=1,
    )
    result = run_build(config)
    rows = pq.read_table(out / result.shards[0]).to_pylist()
    by_rollout = {r["rollout_id"]: (round(r["advantage"], 4), r["parent_rollout_id"]) for r in rows}
    assert len(by_rollout) == 3
    assert by_rollout[session] == (1.0, None)
    assert by_rollout["0ther"] == (-1.0, None)
    [sub] = [v for k, v in by_rollout.items() if k not in (session, "0ther")]
    assert sub == (1.0, session)
