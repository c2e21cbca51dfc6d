"""Every input path runs the same steps (issue 24, ``pipeline/build/steps.py``): on one mixed bad
input, ``seam ingest``, ``seam judge``, ``seam audit``, ``seam build-rl``, ``seam verify``
and ``seam.read`` quarantine the same records with the same reasons, and let the same
good rollouts through. The build and audit lists add the damaged-log filter (and the
build its RL rows, which need an outcome): those records differ, by name, and only those.

The input (written here, in the real formats):

- ``in/rollouts.jsonl`` (canonical): a good rollout; a line that is not JSON; a record
  failing the schema (no task_id, an unknown role); a second good rollout; the first
  one again (a duplicate id); a rollout with no model call; a damaged log (a lost record);
  a rollout without an outcome, then the same id with one (the build's RL rows refuse the
  first, so the second is no duplicate there: verify must agree, the readers that do not
  build rows see a duplicate);
- ``in/calls.jsonl`` (chat-completions log, one call per line): two sessions, and a line
  that is no call at all (an unknown record of the format);
- ``in/notes.jsonl``: JSON lines no reader recognises, found by walking ``in/``;
- ``rewards.jsonl``: the outcome of one chat session (the other one misses the join).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import seam
from pipeline.cli import main
from pipeline.core.fidelity import FIDELITY_KEY
from pipeline.inspect.verify import verify_build
from tests.judge.rollouts import Story

CANONICAL = "in/rollouts.jsonl"
CALLS = "in/calls.jsonl"


def _call(session: str, answer: str) -> str:
    """One chat-completions call of ``session`` (request, response), as a gateway logs it."""
    return json.dumps(
        {
            "session_id": session,
            "request": {
                "model": "m",
                "messages": [
                    {"role": "system", "content": "You are an agent."},
                    {"role": "user", "content": f"Task of {session}."},
                ],
            },
            "response": {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": answer},
                    }
                ]
            },
        }
    )


def write_input(root: Path) -> None:
    (root / "in").mkdir()
    good = Story("good").act(("bash", {"command": "ls"}, "a b")).say("done").build(reward=1.0)
    good2 = Story("good2").act(("bash", {"command": "ls"}, "x")).say("ok").build(reward=0.0)
    damaged = Story("damaged").say("hi").build(reward=1.0)
    lost = {"reason": "lost_records", "event_id": None, "detail": "1 record could not be decoded"}
    damaged.meta[FIDELITY_KEY] = [lost]  # as a reader records a lost record
    late = Story("late").say("done").build(reward=1.0)
    no_call = {
        "rollout_id": "no-call",
        "task_id": "t",
        "source": "test",
        "reward": 1.0,
        "events": [{"type": "message", "id": "u", "role": "user", "content": "hi"}],
    }
    bad_schema = {
        "rollout_id": "bad-schema",
        "events": [{"type": "message", "id": "m", "role": "wizard"}],
    }
    lines = [
        good.model_dump_json(exclude_none=True),  # 1
        '{"rollout_id": "broken", "events": [',  # 2: not JSON
        json.dumps(bad_schema),  # 3
        good2.model_dump_json(exclude_none=True),  # 4
        good.model_dump_json(exclude_none=True),  # 5: duplicate of line 1
        json.dumps(no_call),  # 6
        damaged.model_dump_json(exclude_none=True),  # 7
        late.model_copy(update={"reward": None}).model_dump_json(exclude_none=True),  # 8
        late.model_dump_json(exclude_none=True),  # 9: the same id, with its outcome
    ]
    (root / CANONICAL).write_text("\n".join(lines) + "\n")
    calls = [_call("chat-a", "Done with a."), '{"heartbeat": 1}', _call("chat-b", "Done with b.")]
    (root / CALLS).write_text("\n".join(calls) + "\n")
    (root / "in" / "notes.jsonl").write_text('{"note": "not a rollout"}\n')
    (root / "rewards.jsonl").write_text(json.dumps({"rollout_id": "chat-a", "reward": 1.0}) + "\n")


def _entries(path: Path) -> list[tuple]:
    return sorted(_key(json.loads(line)) for line in path.read_text().splitlines())


def _key(entry: dict) -> tuple:
    return (entry["file"], entry["line"] or 0, entry["format"], entry["reason"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every path run once on the mixed input: their quarantines and what they let through."""
    root = tmp_path_factory.mktemp("mixed")
    write_input(root)
    got: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert (
            main(["ingest", "in", "--out", "ing", "--rewards", "rewards.jsonl", "--no-progress"])
            == 0
        )
        got["ingest"] = _entries(root / "ing" / "quarantine.jsonl")
        got["ingest_rewards"] = json.loads((root / "ing" / "ingest.json").read_text())["rewards"]
        assert main(["judge", "in", "--out", "findings.jsonl", "--quarantine", "judge.q"]) == 0
        got["judge"] = _entries(root / "judge.q")
        assert main(["audit", "in", "--json", "--quarantine", "audit.q"]) == 0
        got["audit"] = _entries(root / "audit.q")
        build = ["build-rl", "in", "--out", "rl", "--rewards", "rewards.jsonl"]
        assert main([*build, "--workers", "1", "--verify", "none", "--no-progress"]) == 0
        got["build"] = _entries(root / "rl" / "quarantine.jsonl")
        manifest = json.loads((root / "rl" / "manifest.json").read_text())
        got["build_counts"] = manifest["counts"]
        result = verify_build("rl", "all")
        got["verify"] = sorted(_key(e) for e in result.quarantined)
        got["verify_mismatches"] = [m.line() for m in result.mismatches]
        quarantine: list[dict] = []
        got["read_ids"] = [r.rollout_id for r in seam.read("in", quarantine=quarantine)]
        got["read"] = sorted(_key(e) for e in quarantine)
    return got


def test_the_read_steps_quarantine_each_bad_record_once_with_its_reason(runs):
    """Hand-checked: what reading and the duplicate rule leave out of the mixed input."""
    unknown_line = [e for e in runs["ingest"] if e[0] == CALLS]
    assert [(e[1], e[2]) for e in unknown_line] == [(2, "chat-completions")]
    assert {(f, line, r[:30]) for f, line, _, r in runs["ingest"] if f != CALLS} == {
        ("in/notes.jsonl", 0, "in/notes.jsonl: format not rec"),
        (CANONICAL, 2, "invalid JSON: unexpected end o"),
        (CANONICAL, 3, "schema: task_id: Field require"),
        (CANONICAL, 5, "duplicate rollout_id 'good': f"),
        (CANONICAL, 6, "schema: rollout: rollout has n"),
        (CANONICAL, 9, "duplicate rollout_id 'late': f"),
    }
    (duplicate,) = [e for e in runs["ingest"] if e[1] == 5]
    assert duplicate[3] == (
        f"duplicate rollout_id 'good': first at {CANONICAL}:1, again at {CANONICAL}:5 "
        "(the first is kept)"
    )


def test_ingest_judge_verify_build_and_read_quarantine_the_same_records(runs):
    common = runs["ingest"]
    assert runs["judge"] == common
    assert runs["read"] == common
    damaged = [e for e in runs["build"] if e[1] == 7]
    assert [e[3] for e in damaged] == [
        "rollout damaged: damaged log (lost_records: 1 record could not be decoded); "
        "--keep-damaged keeps it, flagged"
    ]
    assert runs["audit"] == sorted(common + damaged)
    # The build adds its RL rows' rule: chat-b missed the rewards join and line 8 has no
    # outcome either; so line 9 is the first 'late' the build accepts, no duplicate.
    late_duplicate = [e for e in common if e[1] == 9]
    no_outcome = sorted(set(runs["build"]) - set(common) - set(damaged))
    assert [(e[0], e[1], e[3][:50]) for e in no_outcome] == [
        (CALLS, 3, "rollout chat-b: no reward and no resolved outcome:"),
        (CANONICAL, 8, "rollout late: no reward and no resolved outcome: R"),
    ]
    assert runs["build"] == sorted(set(common) - set(late_duplicate) | set(damaged + no_outcome))
    # Verify replays every build step but the rows; the rows' refusals are the build's.
    assert runs["verify"] == sorted(set(common) - set(late_duplicate) | set(damaged))
    assert runs["verify_mismatches"] == []


def test_the_good_rollouts_pass_every_path(runs):
    # files in sorted order; line 9's 'late' is a duplicate for seam.read
    assert runs["read_ids"] == ["chat-a", "chat-b", "good", "good2", "damaged", "late"]
    counts = runs["build_counts"]
    assert counts["accepted"] == 4  # good, good2, chat-a, late (line 9)
    assert counts["read"] == 13  # 9 canonical lines, 3 log lines, 1 stray file
    assert counts["quarantined"] == len(runs["build"]) == 9  # the 4 others have rows
    # The rewards join counts the same in ingest and in the build.
    assert runs["ingest_rewards"] == {"matched": 1, "unmatched": 7}
    assert (counts["rewards_matched"], counts["rewards_unmatched"]) == (1, 7)


def test_verify_agrees_with_a_build_whose_stage_filtered_a_damaged_rollout(tmp_path, capsys):
    """The build's stage filters before its damage check, so a damaged rollout the SFT
    stage filters is in quarantine.jsonl under the stage's reason; verify must not call
    that a missing damage entry (the Claude Code fixtures hold one: off_task and damaged)."""
    fixtures = Path(__file__).parent / "fixtures" / "raw" / "claude_code"
    out = tmp_path / "sft"
    argv = ["build-sft", str(fixtures), "--out", str(out), "--workers", "1", "--no-progress"]
    assert main([*argv, "--verify", "all"]) == 0, capsys.readouterr().out[-2000:]
    lines = (out / "quarantine.jsonl").read_text().splitlines()
    reasons = [json.loads(line)["reason"] for line in lines]
    assert any(r.startswith("filtered (off_task)") for r in reasons)  # the case is there
