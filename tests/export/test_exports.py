"""`seam export`: each target's output, read back in the shape its library documents.

Without the trainers installed, each test here rebuilds what the library's loader does with the
files (TRL's collator and GRPO batch, verl's RLHFDataset row and AgentLoopOutput,
slime's ``Sample.from_dict``) from the documented field names and types; the trainers'
own code runs on the exports in ``test_with_trl.py`` and ``test_with_verl.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import datasets
import numpy as np
import pytest
from pydantic import BaseModel

from pipeline.cli import main
from pipeline.export import ExportError, export_build
from tests.sample_builds import ROLLOUTS, shard_rows

PAD = 151643  # Qwen2.5's <|endoftext|>, TRL's pad token for it


def load_rows(out, tmp_path) -> list[dict]:
    ds = datasets.load_dataset(
        "parquet", data_dir=str(out), split="train", cache_dir=str(tmp_path / "cache")
    )
    return list(ds)


def trained_outputs(row: dict) -> list[list[int]]:
    """The shard row's trained call outputs, in order."""
    return [
        row["input_ids"][s["start"] : s["start"] + s["length"]]
        for s in row["call_spans"]
        if s["trained"]
    ]


def runs(ids: np.ndarray, keep: np.ndarray) -> list[list[int]]:
    """Maximal runs of ``ids`` where ``keep`` is true."""
    out, current = [], []
    for token, k in zip(ids.tolist(), keep.tolist()):
        if k:
            current.append(token)
        elif current:
            out, current = out + [current], []
    return out + ([current] if current else [])


def test_trl_sft_labels_are_exactly_the_generated_outputs(rl_build, tmp_path):
    out = tmp_path / "trl"
    export_build(rl_build, "trl", out, mode="sft")
    examples = load_rows(out, tmp_path)
    shard = shard_rows(rl_build)
    # DataCollatorForLanguageModeling: labels = input_ids, -100 where a mask is 0, right padding.
    width = max(len(e["input_ids"]) for e in examples)
    labels = np.full((len(examples), width), -100)
    for i, e in enumerate(examples):
        ids = np.array(e["input_ids"])
        keep = (np.array(e["completion_mask"]) != 0) & (np.array(e["assistant_masks"]) != 0)
        labels[i, : len(ids)] = np.where(keep, ids, -100)
        assert runs(ids, keep) == trained_outputs(shard[i])
    assert int((labels != -100).sum()) == sum(r["num_trainable_tokens"] for r in shard)


def test_trl_grpo_batch_rebuilds_each_segment_and_its_advantage(rl_build, tmp_path):
    out = tmp_path / "grpo"
    result = export_build(rl_build, "trl", out)
    assert result.mode == "grpo"
    rows, shard = load_rows(out, tmp_path), shard_rows(rl_build)
    # GRPOTrainer's batch: prompts left-padded, completions right-padded, one advantage per row.
    p_len = max(len(r["prompt_ids"]) for r in rows)
    c_len = max(len(r["completion_ids"]) for r in rows)
    prompt_ids, prompt_mask = np.full((len(rows), p_len), PAD), np.zeros((len(rows), p_len), int)
    completion_ids, completion_mask = (
        np.full((len(rows), c_len), PAD),
        np.zeros((len(rows), c_len), int),
    )
    old_logps = np.zeros((len(rows), c_len))
    for i, r in enumerate(rows):
        n, m = len(r["prompt_ids"]), len(r["completion_ids"])
        prompt_ids[i, p_len - n :], prompt_mask[i, p_len - n :] = r["prompt_ids"], 1
        completion_ids[i, :m] = r["completion_ids"]
        # TRL trains completion_mask * tool_mask; completion_mask is attention (all 1).
        assert r["completion_mask"] == [1] * m
        completion_mask[i, :m] = r["tool_mask"]
        if r["old_per_token_logps"] is not None:
            old_logps[i, :m] = r["old_per_token_logps"]
    advantages = np.array([r["advantages"] for r in rows], dtype=np.float32)
    for i, (r, s) in enumerate(zip(rows, shard)):
        sequence = np.concatenate(
            [prompt_ids[i][prompt_mask[i] == 1], completion_ids[i][: len(r["completion_ids"])]]
        )
        assert sequence.tolist() == s["input_ids"]
        assert completion_mask[i].sum() == s["num_trainable_tokens"]
        assert advantages[i] == np.float32(s["advantage"])
        logged = s["rollout_id"] == "b0"
        assert (r["old_per_token_logps"] is not None) == logged
        if logged:
            assert np.allclose(old_logps[i][completion_mask[i] == 1], -0.25)


class AgentLoopOutput(BaseModel):
    """verl.experimental.agent_loop.AgentLoopOutput's documented fields (metrics left out)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    extra_fields: dict[str, Any] = {}


def test_verl_rows_are_rlhf_dataset_rows_and_agent_loop_outputs(rl_build, tmp_path, tokenizer):
    out = tmp_path / "verl"
    export_build(rl_build, "verl", out)
    rows, shard = load_rows(out, tmp_path), shard_rows(rl_build)
    for index, (row, s) in enumerate(zip(rows, shard)):
        # RLHFDataset: chat messages under `prompt`, rendered with the chat template.
        assert all(set(m) == {"role", "content"} for m in row["prompt"])
        assert row["data_source"] == "seam/test" and row["ability"] == "agent"
        assert float(row["reward_model"]["ground_truth"]) == s["reward"]
        assert (
            row["extra_info"]["index"] == index
            and row["extra_info"]["rollout_id"] == s["rollout_id"]
        )
        # The per-row numbers of seam's cross-trajectory GAE (verl_gae.py).
        for name in ("trainable_tokens_after", "rollout_trainable_tokens"):
            assert row["extra_info"][name] == s[name]
        raw_prompt = tokenizer.apply_chat_template(
            row["prompt"], add_generation_prompt=True, tokenize=False
        )
        recorded = row["agent_loop_output"]
        assert (
            tokenizer(raw_prompt, add_special_tokens=False)["input_ids"] == recorded["prompt_ids"]
        )
        # The agent loop's output, returned as recorded: the struct's fields are its fields.
        assert set(recorded) <= set(AgentLoopOutput.model_fields)
        output = AgentLoopOutput(**recorded)
        assert output.prompt_ids + output.response_ids == s["input_ids"]
        assert len(output.response_mask) == len(output.response_ids)
        assert sum(output.response_mask) == s["num_trainable_tokens"]
        assert output.reward_score == s["reward"]
        assert (output.response_logprobs is not None) == (s["rollout_id"] == "b0")
    # The lengths verl needs to keep every row, in export.json and the README.
    longest = json.loads((out / "export.json").read_text())["verl_lengths"]
    outputs = [x["agent_loop_output"] for x in rows]
    p, r = max(len(x["prompt_ids"]) for x in outputs), max(len(x["response_ids"]) for x in outputs)
    assert longest == {"max_prompt_length": p, "max_response_length": r}
    readme = (out / "README.md").read_text()
    assert f"`data.max_prompt_length={p} data.max_response_length={r}`" in readme


def test_verl_counts_turns_as_messages(rl_build, tmp_path):
    out = tmp_path / "verl"
    export_build(rl_build, "verl", out)
    first = next(r for r in load_rows(out, tmp_path) if r["extra_info"]["rollout_id"] == "a0")
    # system, task, assistant (two tool calls), two tool results (one turn each), assistant.
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert first["agent_loop_output"]["num_turns"] == 6


class Status(Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class Sample:
    """slime.utils.types.Sample's documented fields and ``from_dict`` (torch-free subset)."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)

    @staticmethod
    def from_dict(data: dict) -> Sample:
        data = dict(data, status=Status(data["status"]))
        unknown = set(data) - set(Sample.__dataclass_fields__)
        assert not unknown, f"fields slime's Sample does not have: {unknown}"
        return Sample(**data)


def test_slime_samples_load_and_siblings_share_their_rollout_id(rl_build, tmp_path):
    out = tmp_path / "slime"
    export_build(rl_build, "slime", out)
    lines = (out / "samples.jsonl").read_text().splitlines()
    # slime's loader: torch.load(args.load_debug_rollout_data.format(rollout_id=...),
    # weights_only=False)["samples"], then Sample.from_dict (slime/ray/rollout.py).
    torch = pytest.importorskip("torch")
    template = str(out / "rollout_{rollout_id}.pt")
    container = torch.load(template.format(rollout_id=0), weights_only=False)
    assert container["rollout_id"] == 0
    assert container["samples"] == [json.loads(line) for line in lines]
    samples = [Sample.from_dict(d) for d in container["samples"]]
    shard = shard_rows(rl_build)
    assert [s.index for s in samples] == list(range(len(shard)))
    for sample, row in zip(samples, shard):
        assert sample.tokens == row["input_ids"]
        assert len(sample.loss_mask) == sample.response_length
        assert sum(sample.loss_mask) == row["num_trainable_tokens"]
        assert (
            sample.tokens[-sample.response_length :]
            == row["input_ids"][row["call_spans"][0]["start"] :]
        )
        assert sample.status is Status.COMPLETED and sample.reward == row["reward"]
        assert sample.metadata["seam_rollout_id"] == row["rollout_id"]
        if sample.rollout_log_probs is not None:
            assert len(sample.rollout_log_probs) == sample.response_length
    by_rollout: dict[str, set] = {}
    by_task: dict[str, set] = {}
    for sample, row in zip(samples, shard):
        by_rollout.setdefault(row["rollout_id"], set()).add(sample.rollout_id)
        by_task.setdefault(row["task_id"], set()).add(sample.group_index)
    assert all(len(ids) == 1 for ids in by_rollout.values())
    assert len({next(iter(ids)) for ids in by_rollout.values()}) == len(ROLLOUTS)
    assert all(len(groups) == 1 for groups in by_task.values()) and len(by_task) == 2


def test_export_refuses_a_directory_it_did_not_write(rl_build, tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not empty"):
        export_build(rl_build, "slime", tmp_path, overwrite=True)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_export_overwrite_replaces_an_earlier_export(rl_build, tmp_path):
    out = tmp_path / "x"
    export_build(rl_build, "trl", out)
    with pytest.raises(ExportError, match="--overwrite"):
        export_build(rl_build, "trl", out)
    export_build(rl_build, "slime", out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "export.json",
        "rollout_0.pt",
        "samples.jsonl",
    ]


def test_export_command_rejects_a_mode_for_other_targets(rl_build, tmp_path, capsys):
    assert (
        main(
            ["export", str(rl_build), "--to", "verl", "--mode", "sft", "--out", str(tmp_path / "v")]
        )
        == 2
    )
    assert "--mode only applies to --to trl" in capsys.readouterr().err


def test_sft_builds_export_for_trl_sft_by_default(sft_build, tmp_path):
    result = export_build(sft_build, "trl", tmp_path / "t")
    assert result.mode == "sft" and result.rows == len(shard_rows(sft_build))


def test_max_length_leaves_out_longer_rows_and_says_how_many(rl_build, tmp_path, capsys):
    shard = shard_rows(rl_build)
    lengths = sorted(r["num_tokens"] for r in shard)
    cutoff = lengths[len(lengths) // 2]
    over = [r for r in shard if r["num_tokens"] > cutoff]
    assert over, "the cutoff must leave something out"
    out = tmp_path / "trl"
    assert (
        main(
            ["export", str(rl_build), "--to", "trl", "--out", str(out), "--max-length", str(cutoff)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    dropped_trainable = sum(r["num_trainable_tokens"] for r in over)
    assert (
        f"left out {len(over)} segment(s) longer than that ({dropped_trainable} trainable"
        in printed
    )
    rows = load_rows(out, tmp_path)
    assert len(rows) == len(shard) - len(over)
    assert all(len(r["prompt_ids"]) + len(r["completion_ids"]) <= cutoff for r in rows)
    marker = json.loads((out / "export.json").read_text())
    assert marker["dropped_over_max_length"] == {
        "rows": len(over),
        "trainable_tokens": dropped_trainable,
    }
    at_cutoff = next(x for x in marker["lengths"] if x["max_length"] == cutoff)
    assert at_cutoff["rows"] == len(rows)
    assert f"left out {len(over)} row(s)" in (out / "README.md").read_text()


def test_length_table_counts_rows_and_trainable_tokens_per_cutoff():
    from pipeline.export.lengths import length_table

    table = length_table(np.array([500, 1500, 5000]), np.array([10, 30, 60]), cutoffs=(1024, 4096))
    assert [(r["max_length"], r["rows"], r["trainable_tokens"]) for r in table] == [
        (1024, 1, 10),
        (4096, 2, 40),
    ]
    assert table[1]["trainable_share"] == pytest.approx(0.4)


def test_every_export_carries_each_rows_context_fidelity(rl_build, tmp_path):
    shard = shard_rows(rl_build)
    want = [(r["context_fidelity"], r["context_gap_tokens"]) for r in shard]
    # The build's rollout with reported usage departs from its rebuilt growth (the
    # fixture's counts are made up): some row is flagged, so the columns are not constant.
    assert any("unexplained_context_gap" in f for f, _ in want) and ["exact"] in [
        f for f, _ in want
    ]
    for target, mode in (("trl", "sft"), ("trl", "grpo"), ("verl", None)):
        out = tmp_path / f"{target}-{mode}"
        export_build(rl_build, target, out, mode=mode)
        rows = load_rows(out, tmp_path)
        fields = [r["extra_info"] if target == "verl" else r for r in rows]
        assert [(f["context_fidelity"], f["context_gap_tokens"]) for f in fields] == want
    export_build(rl_build, "slime", tmp_path / "slime")
    samples = [
        json.loads(x) for x in (tmp_path / "slime" / "samples.jsonl").read_text().splitlines()
    ]
    assert [
        (s["metadata"]["context_fidelity"], s["metadata"]["context_gap_tokens"]) for s in samples
    ] == want
