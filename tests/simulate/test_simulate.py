"""The simulator (``seam simulate``) and the committed sample it wrote (``data/sample``).

Token counts here are computed independently of the simulator: each message is rendered
with the chat template and tokenized with the real tokenizer (``ChatRenderer``), and a
call's input length is the sum over its live context plus the generation prompt.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.render import template_message
from pipeline.sft.attach import attach
from pipeline.simulate import corrections as corr
from pipeline.simulate.context import Engine
from pipeline.simulate.rollouts import iter_rollouts
from pipeline.simulate.run import Job, run
from pipeline.simulate.summaries import Q_SUM, RESUME_PREFIX
from pipeline.sources.canonical_io import iter_raw_records, parse_rollout, rollout_to_json
from schemas.correction import executed_output_text
from schemas.replay import replay
from schemas.rollout import Keep, MessageEvent

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "rollouts.jsonl.zst"
SAMPLE_SEED, SAMPLE_GROUP = "seam-sample", 4


@pytest.fixture(scope="module")
def simulated(renderer):
    """48 rollouts (12 tasks x 4), round-tripped through JSON like any input file."""
    return [parse_rollout(rollout_to_json(r)) for r in iter_rollouts(Engine(renderer), "t", 48, 4)]


@pytest.fixture(scope="module")
def sample():
    return [parse_rollout(raw.data) for raw in iter_raw_records(SAMPLE)]


def input_lengths(renderer, rollout) -> list[int]:
    """|h| of every call: the token count of its rendered context plus the generation prompt."""
    sizes: dict[tuple[str, bool], int] = {}
    gen = len(renderer.encode(renderer.generation_prompt()))
    out = []
    for view in replay(rollout):
        total = gen
        for i, m in enumerate(view.context):
            key = (m.id, i == 0)
            if key not in sizes:
                sizes[key] = len(
                    renderer.encode(renderer.piece(template_message(m), i == 0, rollout.tools))
                )
            total += sizes[key]
        out.append(total)
    return out


def action_steps(messages) -> list[list[str]]:
    """Message ids of each step: an assistant action and the tool results that follow it."""
    steps: list[list[str]] = []
    for m in messages:
        if m.role == "assistant":
            steps.append([m.id])
        elif m.role == "tool" and steps:
            steps[-1].append(m.id)
        elif steps and steps[-1]:
            steps.append([])
    return [s for s in steps if s]


def test_same_seed_gives_identical_bytes_for_any_worker_count(tmp_path):
    outs = []  # 8 tasks of one rollout: two chunks, so two workers really interleave
    for name, seed, workers in (("a", "s", 1), ("b", "s", 2), ("c", "s", 1), ("d", "other", 1)):
        path = tmp_path / f"{name}.jsonl.gz"
        run(Job(n=8, seed=seed, group_size=1, out=path, fmt="jsonl.gz", workers=workers))
        outs.append(path.read_bytes())
    assert outs[0] == outs[1] == outs[2]
    assert outs[0] != outs[3]


def test_every_simulated_rollout_validates_and_round_trips(simulated):
    for r in simulated:
        assert parse_rollout(rollout_to_json(r)) == r


def test_groups_share_a_task_and_rewards_are_binary_and_mixed(simulated):
    groups: dict[str, list] = {}
    for r in simulated:
        groups.setdefault(r.task_id, []).append(r)
        assert r.reward in (0.0, 1.0) and r.resolved == (r.reward == 1.0)
    assert all(len(g) == 4 for g in groups.values())
    kinds = {
        "pass"
        if all(r.resolved for r in g)
        else "fail"
        if not any(r.resolved for r in g)
        else "mixed"
        for g in groups.values()
    }
    assert kinds == {"pass", "fail", "mixed"}


def test_rollouts_span_twenty_to_one_hundred_twenty_calls(simulated, sample):
    lengths = [len(r.calls()) for r in simulated + sample]
    assert min(lengths) >= 20 and max(lengths) <= 120
    assert max(lengths) >= 70


def test_budget_compaction_fires_exactly_when_headroom_drops_below_threshold(renderer, simulated):
    checked = 0
    for r in (r for r in simulated if r.meta["strategy"] == "budget"):
        budget, threshold = r.meta["context_budget"], r.meta["compaction_threshold"]
        views, lengths = replay(r), input_lengths(renderer, r)
        assert sum(v.rewrite is not None and v.rewrite.reason == "compaction" for v in views) <= 3
        for view, h in zip(views, lengths):
            last_cut = view.index == len(views) - 1 and view.message.finish_reason == "length"
            if view.message.call_kind == "action" and not last_cut:
                assert budget - h >= threshold, (r.rollout_id, view.index)
            if view.message.call_kind == "summary":
                assert view.context[-1].content == Q_SUM
                before = h - len(
                    renderer.encode(
                        renderer.piece(template_message(view.context[-1]), False, r.tools)
                    )
                )
                assert budget - before < threshold
                checked += 1
    assert checked >= 3


def test_budget_rebuild_is_system_resume_and_at_most_two_whole_recent_steps(simulated):
    checked = 0
    for r in (r for r in simulated if r.meta["strategy"] == "budget"):
        views = replay(r)
        for i, view in enumerate(views):
            if view.message.call_kind != "summary":
                continue
            rewrite = views[i + 1].rewrite if i + 1 < len(views) else None
            if rewrite is None:
                continue
            system, resume, *kept = rewrite.context
            assert isinstance(system, Keep) and system.id == view.context[0].id
            assert isinstance(resume, MessageEvent) and resume.role == "user"
            assert (
                resume.content.startswith(RESUME_PREFIX) and view.message.content in resume.content
            )
            assert all(isinstance(k, Keep) for k in kept)
            steps = action_steps(view.context[:-1])  # the live context before q_sum
            kept_ids = [k.id for k in kept]
            assert kept_ids in ([], steps[-1], steps[-2] + steps[-1])
            assert rewrite.meta["kept_steps"] == (
                0 if not kept_ids else 1 if kept_ids == steps[-1] else 2
            )
            checked += 1
    assert checked >= 3


def test_autocompact_calls_compact_with_a_working_state(simulated):
    found = 0
    for r in (r for r in simulated if r.meta["strategy"] == "auto"):
        for call in r.calls():
            if call.call_kind == "summary":
                assert call.content.startswith("# Auto Context Summary")
                assert [t.name for t in call.tool_calls] == ["compact"]
                found += 1
        assert all(
            e.trigger == "model"
            for e in r.events
            if e.type == "rewrite" and e.reason == "compaction"
        )
    assert found >= 2


def test_memact_edits_and_truncations_drop_whole_steps(simulated):
    reasons = Counter()
    for r in simulated:
        seen: dict[str, MessageEvent] = {}
        live: list[str] = []
        for e in r.events:
            if e.type == "message":
                seen[e.id] = e
                live.append(e.id)
                continue
            reasons[e.reason] += 1
            kept = {item.id for item in e.context if isinstance(item, Keep)}
            if e.reason in ("edit", "truncation"):
                dropped = [seen[i] for i in live if i not in kept]
                calls = {c.id for m in dropped for c in m.tool_calls}
                assert {
                    m.tool_call_id for m in dropped if m.role == "tool"
                } == calls  # no step is cut
            live = [item.id for item in e.context]
            seen.update({item.id: item for item in e.context if isinstance(item, MessageEvent)})
    assert reasons["edit"] and reasons["truncation"] and reasons["compaction"]


def test_logged_prompt_ids_are_what_an_engine_sees(renderer, simulated):
    full = [r for r in simulated if r.meta["token_logging"] == "full"]
    assert full
    for r in full[:2]:
        for view in replay(r):
            prompt, _ = renderer.engine_view(view.context, view.message, r.tools)
            assert view.message.prompt_ids == prompt


def test_some_outputs_use_a_noncanonical_tokenization_of_the_same_text(renderer, simulated):
    drifted = 0
    for r in simulated:
        for view in replay(r):
            m = view.message
            if m.output_ids is None:
                continue
            assert len(m.logprobs) == len(m.output_ids) and max(m.logprobs) < 0
            text, _ = renderer.output_text(template_message(m), r.tools)
            canonical = renderer.encode(text).tolist()
            if m.finish_reason == "length":  # cut by max tokens: no end-of-turn was sampled
                canonical = canonical[:-1]
                assert m.output_ids[-1] != renderer.eos_id
            if m.output_ids != canonical:
                assert renderer.decode(m.output_ids) == renderer.decode(canonical)
                drifted += 1
    assert drifted >= 3
    assert any(r.meta["token_logging"] == "none" for r in simulated)
    assert any(r.meta["token_logging"] == "output" for r in simulated)


def test_some_rollouts_reason_and_some_end_cut_by_length(simulated, sample):
    rollouts = simulated + sample
    assert any(c.reasoning for r in rollouts for c in r.calls())
    cut = [r for r in rollouts if r.calls()[-1].finish_reason == "length"]
    assert 0 < len(cut) < len(rollouts) * 0.1
    assert all(not r.calls()[-1].tool_calls for r in cut)


def test_correction_replacements_are_executed_outputs_and_attach(renderer, simulated, sample):
    records = 0
    for r in simulated + sample:
        attached, rejected = attach(r)
        assert not rejected, rejected[0].reason
        calls = r.calls()
        for c in r.corrections:
            call = calls[c.call_index]
            assert c.replacement == executed_output_text(call) != c.original
            if (
                not call.reasoning
            ):  # the template's rendering of the call, minus the end-of-turn token
                text, _ = renderer.output_text(template_message(call), r.tools)
                assert text == c.replacement + renderer.eos_text
            records += 1
    assert records >= 20


def test_correction_types_follow_autocompact_proportions(sample):
    import random

    rng = random.Random(0)
    drawn = Counter(corr.draw_type(rng).split(":")[0] for _ in range(20000))
    for kind, share in corr.TYPE_WEIGHTS.items():
        assert abs(drawn[kind] / 20000 - share) < 0.015
    realized = Counter(c.type for r in sample for c in r.corrections)
    total = sum(realized.values())
    assert set(realized) == {"trigger", "state", "continuation"}
    assert realized.most_common(1)[0][0] == "state"
    assert all(abs(realized[k] / total - share) < 0.15 for k, share in corr.TYPE_WEIGHTS.items())


def test_sample_is_what_its_readme_command_writes(tmp_path, sample):
    path = tmp_path / "head.jsonl"
    run(Job(n=8, seed=SAMPLE_SEED, group_size=SAMPLE_GROUP, out=path, fmt="jsonl", workers=1))
    head = [parse_rollout(line) for line in path.read_bytes().splitlines()]
    assert head == sample[:8]
    readme = (SAMPLE.parent / "README.md").read_text()
    assert f"--seed {SAMPLE_SEED}" in readme and f"--n {len(sample)}" in readme


def test_summaries_are_mostly_complete(sample):
    summaries = [c for r in sample for c in r.calls() if c.call_kind == "summary"]
    defective = [c for c in summaries if c.meta.get("sim_defects")]
    assert len(summaries) >= 100
    assert 0 < len(defective) < 0.2 * len(summaries)
    assert np.median([len(c.content) for c in summaries]) > 1500
