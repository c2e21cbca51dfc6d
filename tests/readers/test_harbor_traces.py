"""Harbor trace exports (``traces.json``): one row per call, grouped into trial rollouts."""

import json

from pipeline.readers.detect import detect_format
from schemas.replay import replay
from tests.readers.util import accounted, fixture, nonblank_lines, read, shape

PATH = fixture("harbor_traces", "traces.json")


def by_id():
    rollouts, rejected, _ = read("harbor-traces", PATH)
    assert not rejected
    return {r.rollout_id: r for r in rollouts}


def seen(rollout):
    """Each call's context and reply, as text."""
    return [([(m.role, m.content) for m in v.context], v.message.content) for v in replay(rollout)]


def test_rows_of_a_trial_are_one_rollout_whose_calls_are_the_rows_replies():
    assert detect_format(PATH) == "harbor-traces"
    rows = json.loads(PATH.read_text())
    rollout = by_id()["hello-world__aB3"]
    mains = [
        r for r in rows if r["trial_name"] == "hello-world__aB3" and r["trace_source"] == "main"
    ]
    # Every call is its row's reply, sampled from exactly that row's conversation.
    views = replay(rollout)
    assert len(views) == len(mains) == 3
    for view, row in zip(views, mains):
        assert view.message.content == row["conversations"][-1]["content"]
        assert [(m.role, m.content) for m in view.context] == [
            (m["role"], m["content"]) for m in row["conversations"][:-1]
        ]
    assert (rollout.task_id, rollout.reward, rollout.model) == (
        "hello-world",
        1.0,
        "hosted_vllm/Qwen3-8B",
    )
    # The summarization continuation rebuilt the context: a rewrite, not an append.
    assert [e[:3] for e in shape(rollout) if e[0] == "rewrite"] == [
        ("rewrite", "compaction", "budget")
    ]


def test_an_exception_result_is_no_reward_and_a_sub_agent_links_its_trial():
    rollouts = by_id()
    failed = rollouts["hello-world__Zz9"]
    assert failed.reward is None and failed.meta["outcome"] == {"exception": "AgentTimeoutError"}
    summary = rollouts["hello-world__aB3/summarization-1-summary"]
    assert summary.parent_rollout_id == "hello-world__aB3"
    assert summary.task_id == "hello-world"


def test_jsonl_rows_read_the_same_and_every_line_is_accounted_for(tmp_path):
    rows = json.loads(PATH.read_text())
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    assert detect_format(path) == "harbor-traces"
    assert accounted(path, "harbor-traces") == nonblank_lines(path)
    rollouts, rejected, _ = read("harbor-traces", path)
    assert not rejected
    # Row order does not matter (ids name rows by position, so compare what the model saw).
    assert {r.rollout_id: seen(r) for r in rollouts} == {k: seen(v) for k, v in by_id().items()}
