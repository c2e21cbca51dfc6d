"""Calibrating an LLM judge with ``seam judge --eval LABELS --llm URL --model M`` (issue 23,
item 4), end to end against a stand-in OpenAI-compatible server on 127.0.0.1 that
answers per step from a script: the semantic verdicts carry quotes, the quotes are
verified against the history, an unverified one voids its finding (not a flag), and
the findings are scored against the labels like the rule judge's."""

from __future__ import annotations

import json
import re

import pytest

from judge.llm import PROMPT_FILE, SYSTEM_PROMPT, build_messages, candidates, recorded_state
from pipeline.cli import main
from tests.judge.test_calibration import SESSION, label
from tests.judge.test_llm import ScriptedServer, ok
from tests.judge.test_llm_summaries import renamed_settings

NO_VERDICT = json.dumps({"verdicts": []})


def verdict(kind: str, *evidence: tuple[str, str]) -> str:
    return json.dumps(
        {
            "verdicts": [
                {
                    "type": "state",
                    "verdict": kind,
                    "rationale": "the history says otherwise",
                    "evidence": [{"message_id": m, "quote": q} for m, q in evidence],
                }
            ]
        }
    )


# s2 (after the /compact) claims what the recorded push result shows: a quote that is
# there. s1 is judged on a push that never happened: its quote is in no message.
ANSWERS = {
    "s2": verdict(
        "contradiction",
        ("r9:toolu_a9", "[fix-hooks 4f2a9c1] Fix RunHook"),
        ("r8:toolu_a8", "ok github.com/acme/app/cmd/app   0.010s"),  # whitespace re-flowed
    ),
    "s1": verdict(
        "wrong_state", ("r7:toolu_a7", "To github.com:acme/app.git fix-hooks -> fix-hooks")
    ),
}


def by_step(body: bytes) -> tuple:
    """The stand-in's answer: by the id of the step under review."""
    prompt = json.loads(body)["messages"][1]["content"]
    step = re.search(r"=== STEP UNDER REVIEW ===\s+\[([^\]]+)\]", prompt)
    return ok(ANSWERS.get(step.group(1) if step else "", NO_VERDICT))


@pytest.fixture
def stand_in():
    server = ScriptedServer([by_step] * 32)
    yield server
    server.close()


def test_the_llm_judge_is_scored_on_labels_with_verified_quotes_only(stand_in, tmp_path, capsys):
    session_file = tmp_path / "judge_compactions.jsonl"
    from tests.judge.test_calibration import FIXTURE

    session_file.write_text(
        FIXTURE.read_text().replace(
            "/work/app/.claude/settings.json", "/work/app/.claude/hooks_config.json", 1
        )
    )
    labels = tmp_path / "labels.jsonl"
    labels.write_text(
        label("s1", session=SESSION, wrong_state=True).model_dump_json()
        + "\n"
        + label("s2", session=SESSION, contradiction=True).model_dump_json()
        + "\n"
    )
    code = main(
        ["judge", "--eval", str(labels), str(session_file), "--llm", stand_in.url]
        + ["--model", "stand-in", "--no-cache", "--concurrency", "1", "--retries", "0", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["judge"].startswith("LLM judge stand-in (prompt ")
    assert out["labelled"] == 2 and out["labels_not_found"] == []
    assert (out["voided"], out["unjudged"]) == (1, 0)
    contradiction = out["checks"]["state/contradiction"]
    assert (contradiction["tp"], contradiction["fp"], contradiction["fn"]) == (1, 0, 0)
    wrong = out["checks"]["state/wrong_state"]  # its only finding was voided: a miss
    assert (wrong["flags"], wrong["fn"]) == (0, 1)
    # Every state question got the shipped prompt and the recorded-state slice.
    prompts = [r["body"]["messages"] for r in stand_in.requests]
    state_prompts = [p for p in prompts if p[1]["content"].endswith("Questions: state.")]
    assert len(state_prompts) == 2
    assert all(p[0]["content"] == SYSTEM_PROMPT for p in state_prompts)
    assert any("=== RECORDED STATE" in p[1]["content"] for p in state_prompts)


def test_the_shipped_prompt_asks_for_semantic_checks_with_quotes():
    text = PROMPT_FILE.read_text()
    for needed in (
        "pushed",
        "merged",
        "compiles",
        "tests or lint pass",
        "open requests",
        "verbatim",
    ):
        assert needed in text, needed
    assert text.rstrip("\n") == SYSTEM_PROMPT


def test_the_recorded_state_quotes_commands_results_and_user_requests_verbatim():
    rollout = renamed_settings()
    cand = next(c for c in candidates(rollout) if c.step.id == "s2")
    section = recorded_state(cand.context)
    assert section[0].startswith("=== RECORDED STATE")
    lines = section[1].splitlines()
    assert lines == [
        "[r8:toolu_a8] `mise run test` succeeded: ok github.com/acme/app/cmd/app 0.010s",
        "[r9:toolu_a9] `gh pr create --fill` succeeded: [fix-hooks 4f2a9c1] Fix RunHook "
        "https://github.com/acme/app/pull/12",
    ]
    first = next(c for c in candidates(rollout) if c.step.id == "s1")
    user_lines = [
        line for line in recorded_state(first.context)[1].splitlines() if "user wrote" in line
    ]
    assert user_lines and user_lines[0].startswith("[u1] user wrote: ")
    # Continuation questions do not get it.
    cont = next(c for c in candidates(rollout) if c.types == ("continuation",))
    assert "=== RECORDED STATE" not in build_messages(rollout, cont, 60_000)[1]["content"]
