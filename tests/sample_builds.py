"""Small real builds for the views, report and export tests: hand-written rollouts
(``tests/judge/rollouts.py``) through the real build, one RL and one SFT directory."""

from __future__ import annotations

import json

import pytest

from pipeline.build.run import BuildConfig, run_build
from pipeline.sft.stage import SftStage
from schemas.correction import Correction, executed_output_text
from schemas.rollout import MessageEvent
from tests.built_once import built_once
from tests.judge.rollouts import Story
from tests.strategies import log_token_ids

FAIL = "FAILED tests/test_dates.py::test_parse_iso - KeyError: 'tz'"
SUMMARY = "# Auto Context Summary\nsrc/dates.py fails test_parse_iso.\n## Next step\nFix parse_date in src/dates.py."
SECOND_SUMMARY = (
    "# Auto Context Summary\nparse_date in src/dates.py edited to use s.get('tz'); tests not rerun yet.\n"
    "## Next step\nRun pytest tests/test_dates.py."
)
BROKEN_LINES = ['{"rollout_id": "cut", "task_id"', "[1, 2, 3]", '{"rollout_id": "bad", "task_id"']


def no_compaction(rollout_id: str):
    """2 calls: one with two tool calls, then a reply."""
    return (
        Story(rollout_id)
        .act(
            ("read_file", {"path": "src/dates.py"}, "def parse_date(s): ..."),
            ("grep", {"pattern": "tz"}, "src/dates.py:1"),
        )
        .say("The bug is in parse_date.")
    )


def one_compaction(rollout_id: str):
    """4 calls: tool call, summary, tool call, reply (2 segments)."""
    return (
        Story(rollout_id)
        .act(("bash", {"command": "pytest"}, FAIL))
        .compact(SUMMARY)
        .act(("edit_file", {"path": "src/dates.py"}, "edited"))
        .say("Fixed.")
    )


def two_compactions(rollout_id: str):
    """5 calls, 3 segments."""
    return (
        Story(rollout_id)
        .act(("bash", {"command": "pytest"}, FAIL))
        .compact(SUMMARY)
        .act(("read_file", {"path": "src/dates.py"}, "x"))
        .compact(SECOND_SUMMARY, trigger="budget")
        .say("Done.")
    )


# (rollout id, task, story, reward): task-a has rollouts with 0, 1 and 2 compactions.
ROLLOUTS = [
    ("a0", "task-a", no_compaction, 1.0),
    ("a1", "task-a", one_compaction, 1.0),
    ("a2", "task-a", two_compactions, 0.0),
    ("a3", "task-a", one_compaction, 0.0),
    ("b0", "task-b", two_compactions, 1.0),
    ("b1", "task-b", no_compaction, 0.0),
]


def rl_rollouts(renderer):
    items = []
    for rollout_id, task, story, reward in ROLLOUTS:
        r = story(rollout_id).build(reward=reward).model_copy(update={"task_id": task})
        # One rollout logged its ids and log-probs, as an inference engine would.
        items.append(log_token_ids(r, renderer, "full", 3) if rollout_id == "b0" else r)
    # One rollout's calls carry the provider's usage, as Claude Code and Codex logs do.
    a1 = next(i for i, r in enumerate(items) if r.rollout_id == "a1")
    events = [
        e.model_copy(update={"meta": {**e.meta, "reported_input_tokens": 1000 * (n + 1)}})
        if e.type == "message" and e.role == "assistant"
        else e
        for n, e in enumerate(items[a1].events)
    ]
    items[a1] = items[a1].model_copy(update={"events": events})
    return items


@pytest.fixture(scope="session")
def rl_build(tmp_path_factory, renderer):
    def build(tmp):
        lines = [r.model_dump_json(exclude_none=True) for r in rl_rollouts(renderer)]
        lines[2:2] = BROKEN_LINES
        (tmp / "in.jsonl").write_text("\n".join(lines) + "\n")
        run_build(
            BuildConfig(
                inputs=[str(tmp / "in.jsonl")],
                out=str(tmp / "out"),
                workers=1,
                progress=False,
                rows_per_shard=7,
            )
        )

    return built_once(tmp_path_factory, "rl", build) / "out"


def corrected(rollout_id: str):
    """``one_compaction`` with a Judge state correction at its summary call."""
    good = one_compaction(rollout_id).build(reward=1.0, resolved=True)
    summary_call = next(i for i, c in enumerate(good.calls()) if c.kind == "summary")
    correction = Correction(
        rollout_id=rollout_id,
        call_index=summary_call,
        type="state",
        verdict="omission",
        original="# Auto Context Summary\nWorking on dates.",
        replacement=executed_output_text(good.calls()[summary_call]),
        rationale="dropped the test",
    )
    return good.model_copy(update={"corrections": [correction]})


def cut_at_max_tokens(rollout, text: str = "Let me"):
    """``rollout`` with a last call the engine cut at its max tokens (``finish_reason``
    length: the template's end-of-turn after it is not the policy's, so not trained)."""
    cut = MessageEvent(id="a9", role="assistant", content=text, finish_reason="length")
    return rollout.model_copy(update={"events": [*rollout.events, cut]})


@pytest.fixture(scope="session")
def sft_build(tmp_path_factory):
    """A corrected rollout (a state correction at its summary call), a plain one, and one
    the summary-loop filter quarantines."""

    def build(tmp):
        good = corrected("good")
        plain = (
            two_compactions("plain")
            .build(reward=0.0, resolved=False)
            .model_copy(update={"task_id": "t2"})
        )
        loop = (
            Story("loop")
            .act(("bash", {"command": "pytest"}, FAIL))
            .compact(SUMMARY)
            .compact(SUMMARY)
            .build(reward=0.0)
        )
        (tmp / "in.jsonl").write_text(
            "\n".join(r.model_dump_json(exclude_none=True) for r in (good, plain, loop)) + "\n"
        )
        run_build(
            BuildConfig(
                inputs=[str(tmp / "in.jsonl")],
                out=str(tmp / "out"),
                kind="sft",
                workers=1,
                progress=False,
                stage=SftStage(),
            )
        )

    return built_once(tmp_path_factory, "sft", build) / "out"


def shard_rows(build_dir) -> list[dict]:
    import pyarrow.parquet as pq

    manifest = json.loads((build_dir / "manifest.json").read_text())
    return [
        row for name in manifest["shards"] for row in pq.read_table(build_dir / name).to_pylist()
    ]
