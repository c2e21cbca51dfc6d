"""``--synthesize-summary-calls``: a summary call built from the context at a harness
compaction, only where the history is complete, flagged and counted, verifiable."""

from __future__ import annotations

import json

from pipeline.sft.filters import FilterOptions
from pipeline.sft.stage import SftStage
from pipeline.sft.synthesize import DEFAULT_PROMPT, load_prompt, synthesize_summary_calls
from schemas.correction import Correction
from schemas.replay import replay
from tests.judge.test_claude_code_judging import FIXTURE, session
from tests.readers.util import only

PROMPT = load_prompt(None)


def test_a_summary_call_is_added_before_each_harness_summary_with_its_context():
    rollout = session()
    built, added = synthesize_summary_calls(rollout, PROMPT)
    assert added == 2
    views = replay(built)
    synth = [v for v in views if v.message.meta.get("synthesized_call")]
    assert [v.index for v in synth] == [6, 12]
    first, second = synth
    assert first.message.call_kind == "summary"
    # The context is the live context at the boundary (the last call and its result)
    # plus the prompt; the output is the summary without Claude Code's wrapper.
    assert [m.id for m in first.context[-3:]] == ["msg_05", "r5:toolu_a5", "cb1:summary-prompt"]
    assert first.context[-1].content == PROMPT
    assert first.message.content.startswith("Analysis:")
    assert "This session is being continued" not in first.message.content
    assert "Please continue the conversation" not in first.message.content
    # The /compact instructions (from the command's echo) are appended for the manual one.
    assert second.context[-1].content.endswith(
        "Additional instructions from the user:\nkeep the PR number"
    )
    # Every other call sees exactly what it saw.
    before = {v.message.id: [m.id for m in v.context] for v in replay(rollout)}
    assert all(before[v.message.id] == [m.id for m in v.context] for v in views if v not in synth)


def test_corrections_move_with_the_calls_they_name():
    rollout = session()
    late = Correction(
        rollout_id=rollout.rollout_id,
        call_index=7,
        type="continuation",
        verdict="redo",
        original="x",
        replacement="y",
    )
    built, _ = synthesize_summary_calls(rollout.model_copy(update={"corrections": [late]}), PROMPT)
    assert built.corrections[0].call_index == 8
    assert replay(built)[8].message.id == replay(rollout)[7].message.id


def test_no_call_is_synthesized_where_the_history_is_not_complete(tmp_path):
    pruned = tmp_path / "pruned.jsonl"
    pruned.write_text("".join(FIXTURE.read_text().splitlines(keepends=True)[8:]))
    rollout = only("claude-code", pruned)
    assert "slice_start" in [e["reason"] for e in rollout.meta["fidelity"]]
    assert synthesize_summary_calls(rollout, PROMPT) == (rollout, 0)


def test_the_build_flags_counts_and_verifies_synthesized_calls(tmp_path):
    import pyarrow.parquet as pq

    from pipeline.build.run import BuildConfig, run_build
    from pipeline.inspect.verify import verify_build

    def build(out, prompt):
        return run_build(
            BuildConfig(
                inputs=[str(FIXTURE)],
                out=str(tmp_path / out),
                kind="sft",
                workers=1,
                progress=False,
                stage=SftStage(None, FilterOptions(), prompt),
            )
        )

    result = build("synth", PROMPT)
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["counts"]["synthesized_summary_calls"] == 2
    assert manifest["config"]["stage"]["synthesize_summary_calls"] == {"prompt": PROMPT}
    rows = pq.read_table(result.out / result.shards[0]).to_pylist()
    flagged = [r for r in rows if "synthesized_summary_call" in r["context_fidelity"]]
    assert len(flagged) == 2
    assert all(any(s["kind"] == "summary" for s in r["call_spans"]) for r in flagged)
    assert verify_build(result.out, "all").ok
    plain = build("plain", None)
    assert (
        "synthesized_summary_calls"
        not in json.loads((plain.out / "manifest.json").read_text())["counts"]
    )


def test_the_default_prompt_is_shipped():
    assert DEFAULT_PROMPT.is_file() and "Optional next step" in PROMPT


def test_a_captured_compact_summary_is_the_target_and_the_2_1_wrapper_is_stripped():
    from judge.summary import summary_body
    from schemas.rollout import RewriteEvent

    wrapped = (
        "This session is being continued from a previous conversation that ran out of "
        "context. The summary below covers the earlier portion of the conversation.\n\n"
        "Summary:\n1. Primary Request: say hi.\n\nIf you need specific details from before "
        "compaction, read the full transcript at: /home/u/.claude/projects/p/s.jsonl\n"
        "Continue the conversation from where it left off without asking the user any "
        "further questions. Resume directly."
    )
    assert summary_body(wrapped).strip() == "Summary:\n1. Primary Request: say hi."
    rollout = session()
    raw = "<analysis>a</analysis>\n<summary>1. Primary Request: fix the hook.</summary>"
    events = [
        e.model_copy(update={"meta": {**e.meta, "capture": {"compact_summary": raw}}})
        if isinstance(e, RewriteEvent) and e.id == "cb1"
        else e
        for e in rollout.events
    ]
    built, _ = synthesize_summary_calls(rollout.model_copy(update={"events": events}), PROMPT)
    first = next(v for v in replay(built) if v.message.meta.get("synthesized_call"))
    assert first.message.content == raw


def test_the_option_before_the_inputs_does_not_swallow_one(tmp_path, capsys):
    """``--synthesize-summary-calls [PROMPT_FILE]`` takes an optional value: written
    before the inputs it took the first input for the prompt file, and the build went on
    without that session."""
    from pipeline.cli import main

    args = ["build-sft", "--synthesize-summary-calls", str(FIXTURE), str(FIXTURE.parent)]
    code = main([*args, "--out", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "that is a rollout input, not a prompt file" in err
    assert not (tmp_path / "out").exists()
