"""The LLM judge on a Claude Code session (real HTTP server on 127.0.0.1): inserted
summaries are candidates, harness compactions get no trigger question, rule hits are
hints, and a finding whose quote is not in the history is voided."""

from __future__ import annotations

import json

from judge.llm import build_messages, candidates, judge_rollouts
from tests.judge.test_claude_code_judging import session
from tests.judge.test_llm import client, ok, serve  # noqa: F401  (serve: the server fixture)


def renamed_settings():
    """The second summary now omits a file the agent wrote and did not commit (a rule hit
    on call 11)."""
    return session(
        lambda t: t.replace(
            '"name": "Edit", "input": {"file_path": "/work/app/.claude/settings.json',
            '"name": "Edit", "input": {"file_path": "/work/app/.claude/hooks_config.json',
        ).replace("git commit -am 'Fix RunHook' && ", "")
    )


def test_every_summary_is_a_state_candidate_and_harness_compactions_get_no_trigger_question():
    found = [(c.call_index, c.step.id, c.types) for c in candidates(session(), every_call=True)]
    assert found == [
        (6, "s1", ("state",)),
        (6, "msg_06", ("continuation",)),
        (7, "msg_07", ("continuation",)),
        (8, "msg_08", ("continuation",)),
        (11, "s2", ("state",)),
        (11, "msg_11", ("continuation",)),
        (12, "msg_12", ("continuation",)),
    ]


def test_the_summary_prompt_shows_what_it_was_written_from_defines_key_state_and_hints():
    rollout = renamed_settings()
    cand = next(c for c in candidates(rollout) if c.step.id == "s2")
    assert cand.hints and cand.hints[0].startswith("state/omission: the summary drops key state")
    system, user = build_messages(rollout, cand, 60_000)
    assert "Key state is" in system["content"] and "branch / PR / commit ids" in system["content"]
    text = user["content"]
    assert "[msg_10] assistant:\nCommitted 4f2a9c1" in text  # the history before it
    assert "[s2] user [summary the harness inserted at compaction]" in text
    assert "=== HINTS (deterministic checks; verify) ===" in text
    assert "Now also document the hook" not in text  # nothing after the summary


def answer(quote: str, message_id: str = "r7:toolu_a7") -> str:
    return json.dumps(
        {
            "verdicts": [
                {
                    "type": "state",
                    "verdict": "omission",
                    "rationale": "drops the settings file",
                    "evidence": [{"message_id": message_id, "quote": quote}],
                }
            ]
        }
    )


def test_a_quote_found_in_the_history_makes_a_finding_and_one_not_found_voids_it(serve, tmp_path):  # noqa: F811
    rollout = renamed_settings()
    order = [c.step.id for c in candidates(rollout)]
    at = order.index("s2")
    empty = json.dumps({"verdicts": []})

    def script(content):
        return [ok(content if i == at else empty) for i in range(len(order))]

    real = "The file /work/app/.claude/settings.json  has been\nupdated successfully."
    server = serve(*script(answer(real)))
    findings, failures = judge_rollouts([rollout], client(server, tmp_path), concurrency=1)
    assert [(f.call_index, f.verdict) for f in findings] == [(11, "omission")]
    assert failures == []
    invented = "The file /work/app/.claudx/settings.json was deleted."
    server = serve(*script(answer(invented)))
    findings, failures = judge_rollouts(
        [rollout], client(server, tmp_path / "other-cache"), concurrency=1
    )
    assert findings == []
    assert [f.reason.split(":")[0] for f in failures] == ["voided state/omission"]


def test_a_summary_call_the_harness_forced_gets_no_trigger_question():
    from tests.judge.rollouts import Story

    def story(trigger):
        return (
            Story()
            .act(("read_file", {"path": "src/dates.py"}, "code"))
            .compact("# Auto Context Summary\nsrc/dates.py\n## Next step\nFix it.", trigger)
            .build()
        )

    assert [c.types for c in candidates(story("model"))] == [("trigger", "state")]
    assert [c.types for c in candidates(story("budget"))] == [("state",)]


def test_every_call_asks_the_trigger_question_at_each_action_where_the_policy_can_compact():
    from tests.judge.rollouts import Story

    def story(trigger):
        return (
            Story()
            .act(("read_file", {"path": "src/dates.py"}, "code"))
            .act(("grep", {"pattern": "tz"}, "src/dates.py:1"))
            .compact("# Auto Context Summary\nsrc/dates.py\n## Next step\nFix it.", trigger)
            .act(("edit_file", {"path": "src/dates.py"}, "edited"))
            .act(("bash", {"command": "pytest"}, "1 passed"))
            .act(("bash", {"command": "git diff"}, "diff"))
            .say("Fixed.")
            .build()
        )

    # The policy chose its compaction, so it could have compacted at any action: the
    # actions before it and the one past the 3-call continuation window get "trigger".
    chose = [(c.call_index, c.types) for c in candidates(story("model"), every_call=True)]
    assert chose == [
        (0, ("trigger",)),
        (1, ("trigger",)),
        (2, ("trigger", "state")),
        (3, ("continuation",)),
        (4, ("continuation",)),
        (5, ("continuation",)),
        (6, ("trigger",)),
    ]
    # Without --every-call, or where the harness compacts, no action is asked.
    assert ("trigger",) not in [c.types for c in candidates(story("model"))]
    # A harness compaction and no compact tool: the policy never had the choice.
    harness = story("budget")
    harness = harness.model_copy(
        update={"tools": [t for t in harness.tools if t["function"]["name"] != "compact"]}
    )
    assert [c.types for c in candidates(harness, every_call=True)] == [
        ("state",),
        ("continuation",),
        ("continuation",),
        ("continuation",),
    ]
