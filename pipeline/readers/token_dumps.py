"""Token-level dumps of RL frameworks: slime ``Sample`` (JSONL, or the ``.pt`` files of
``--save-debug-rollout-data``), verl agent-loop outputs and SkyRL generator outputs.

A sample is ``prompt ids + response ids`` with a mask over the response (1 where the
policy sampled the token, 0 on tool output the environment spliced in). Each run of
masked-in tokens is one call: its ``output_ids`` are the run, its ``prompt_ids`` every
token before it, its ``logprobs`` the run's; each run of masked-out tokens is context.
These ids are the truth the segmenter uses, so message text is only filled where it is
known (a one-turn response, a prompt given as text or messages).

Siblings that share a rollout id (a trajectory the framework split into samples, e.g.
at a compaction, or SkyRL's step-wise rows) are reassembled in order into one rollout:
a sibling whose prompt extends the previous sample's tokens appends, any other starts
with a ``compaction`` rewrite to its prompt. ``.pt`` files are loaded with
``torch.load(weights_only=True)``, which never runs code from the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.readers import Accepted, Reader, ReadItem, Rejected, register
from pipeline.readers.builder import RolloutBuilder, msg, openai_message
from pipeline.readers.common import (
    BAD_CONTENT,
    first_json_object,
    iter_json_records,
    reason_of,
    stable_id,
)


@dataclass
class Sample:
    key: str
    task: str
    order: tuple
    line: int | None
    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]
    logprobs: list[float] | None = None
    reward: float | None = None
    prompt: Any = None
    response: str | None = None
    truncated: bool = False
    meta: dict = field(default_factory=dict)


def _ints(value: Any, name: str) -> list[int]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(x, int) for x in value):
        raise ValueError(f"'{name}' is not a list of token ids")
    return value


def _position(value: Any) -> float:
    """A sample's place among its siblings (an index or step number; 0 if absent)."""
    return float(value) if isinstance(value, (int, float)) else 0.0


def _reward(value: Any) -> float | None:
    if isinstance(value, dict):
        value = value.get("reward", value.get("score"))
    if isinstance(value, list):
        value = next((v for v in reversed(value) if v), 0.0) if value else None
    return float(value) if isinstance(value, (int, float)) else None


def _check(s: Sample) -> Sample:
    if len(s.mask) != len(s.response_ids):
        raise ValueError(
            f"mask has {len(s.mask)} entries for {len(s.response_ids)} response tokens"
        )
    if s.logprobs is not None and len(s.logprobs) != len(s.response_ids):
        raise ValueError(f"{len(s.logprobs)} logprobs for {len(s.response_ids)} response tokens")
    if not s.response_ids:
        raise ValueError("empty response")
    return s


def slime_sample(rec: dict, line: int | None) -> Sample:
    tokens = _ints(rec.get("tokens"), "tokens")
    n = int(rec.get("response_length") or 0)
    meta = found if isinstance(found := rec.get("metadata"), dict) else {}
    key = (
        rec.get("rollout_id")
        or meta.get("rollout_id")
        or rec.get("session_id")
        or meta.get("session_id")
    )
    mask = rec.get("loss_mask")
    return _check(
        Sample(
            key=str(key if key is not None else f"g{rec.get('group_index')}-i{rec.get('index')}"),
            task=str(
                meta.get("task_id") or meta.get("instance_id") or f"group-{rec.get('group_index')}"
            ),
            order=(_position(rec.get("index")),),
            line=line,
            prompt_ids=tokens[: len(tokens) - n],
            response_ids=tokens[len(tokens) - n :],
            mask=_ints(mask, "loss_mask") if mask is not None else [1] * n,
            logprobs=[float(x) for x in rec["rollout_log_probs"]]
            if rec.get("rollout_log_probs")
            else None,
            reward=_reward(rec.get("reward")),
            prompt=rec.get("prompt"),
            response=rec.get("response"),
            truncated=str(rec.get("status", "")).lower().endswith("truncated"),
            meta={"status": str(rec.get("status"))} if rec.get("status") is not None else {},
        )
    )


def verl_sample(rec: dict, line: int | None) -> Sample:
    extra = found if isinstance(found := rec.get("extra_fields"), dict) else {}
    key = (
        rec.get("rollout_id")
        or rec.get("request_id")
        or extra.get("request_id")
        or rec.get("trajectory_id")
    )
    task = rec.get("uid") or extra.get("uid") or rec.get("task_id") or rec.get("index")
    response = _ints(rec.get("response_ids"), "response_ids")
    mask = rec.get("response_mask")
    return _check(
        Sample(
            key=str(key if key is not None else stable_id(line, rec.get("prompt_ids"))),
            task=str(task if task is not None else key),
            order=(_position(rec.get("step")),),
            line=line,
            prompt_ids=_ints(rec.get("prompt_ids"), "prompt_ids"),
            response_ids=response,
            mask=_ints(mask, "response_mask") if mask is not None else [1] * len(response),
            logprobs=[float(x) for x in rec["response_logprobs"]]
            if rec.get("response_logprobs")
            else None,
            reward=_reward(rec.get("reward_score")),
            meta={"num_turns": rec.get("num_turns")},
        )
    )


def skyrl_sample(rec: dict, line: int | None) -> Sample:
    traj = rec.get("trajectory_ids") or rec.get("trajectory_id") or {}
    instance = traj.get("instance_id") if isinstance(traj, dict) else traj
    key = (
        f"{instance}:{traj.get('repetition_id')}"
        if isinstance(traj, dict)
        else str(traj or stable_id(line))
    )
    response = _ints(rec.get("response_ids"), "response_ids")
    mask = rec.get("loss_masks", rec.get("loss_mask"))
    return _check(
        Sample(
            key=key,
            task=str(instance or key),
            order=(_position(rec.get("step")),),
            line=line,
            prompt_ids=_ints(rec.get("prompt_token_ids"), "prompt_token_ids"),
            response_ids=response,
            mask=_ints(mask, "loss_masks") if mask is not None else [1] * len(response),
            logprobs=[float(x) for x in rec["rollout_logprobs"]]
            if rec.get("rollout_logprobs")
            else None,
            reward=_reward(rec.get("rewards")),
            truncated=rec.get("stop_reasons") == "length",
            meta={"is_last_step": rec["is_last_step"]} if "is_last_step" in rec else {},
        )
    )


def rows_of(rec: dict, column: str) -> list[dict]:
    """A batch dict (every field a list, one entry per row) as rows; a row as itself."""
    values = rec.get(column)
    if not (isinstance(values, list) and values and isinstance(values[0], list)):
        return [rec]
    n = len(values)
    return [
        {k: v[i] for k, v in rec.items() if isinstance(v, list) and len(v) == n} for i in range(n)
    ]


def build_rollout(samples: list[Sample], source: str) -> Accepted | Rejected:
    """One rollout from the samples sharing a rollout id (see the module docstring)."""
    samples = sorted(samples, key=lambda s: s.order)
    builder = RolloutBuilder()
    previous: list[int] | None = None
    try:
        for s in samples:
            if previous is None:
                prompt = s.prompt if isinstance(s.prompt, list) else None
                for i, m in enumerate(prompt or []):
                    builder.append(openai_message(m, id=f"prompt.{i}"))
                if prompt is None:
                    builder.append(
                        msg(
                            "user",
                            s.prompt if isinstance(s.prompt, str) else "",
                            meta={"prompt_tokens": len(s.prompt_ids)},
                        )
                    )
            elif s.prompt_ids[: len(previous)] == previous:
                if len(s.prompt_ids) > len(previous):
                    builder.append(
                        msg("user", "", meta={"token_ids": s.prompt_ids[len(previous) :]})
                    )
            else:
                text = s.prompt if isinstance(s.prompt, str) else ""
                builder.rewrite(
                    "compaction",
                    "budget",
                    [msg("user", text, meta={"prompt_tokens": len(s.prompt_ids)})],
                    meta={"inferred_from": "prompt token ids do not extend the previous sample"},
                )
            _response(builder, s)
            previous = s.prompt_ids + s.response_ids
        last = samples[-1]
        rollout = builder.build(
            rollout_id=last.key,
            task_id=last.task,
            source=source,
            reward=last.reward,
            meta={"samples": len(samples), **last.meta},
        )
    except BAD_CONTENT as exc:
        return Rejected(
            samples[0].line, f"rollout {samples[0].key}: {reason_of(exc)}", records=len(samples)
        )
    return Accepted(rollout, samples[0].line, records=len(samples))


def _response(builder: RolloutBuilder, s: Sample) -> None:
    tokens = s.prompt_ids + s.response_ids
    runs: list[tuple[int, int, int]] = []
    for i, bit in enumerate(s.mask):
        if runs and runs[-1][2] == bit:
            runs[-1] = (runs[-1][0], i + 1, bit)
        else:
            runs.append((i, i + 1, bit))
    calls = sum(bit for _, _, bit in runs)
    for start, end, bit in runs:
        ids = s.response_ids[start:end]
        if not bit:
            builder.append(msg("user", "", meta={"token_ids": ids, "observation": True}))
            continue
        text = s.response if calls == 1 and isinstance(s.response, str) else ""
        at = len(s.prompt_ids) + start
        builder.append(
            msg(
                "assistant",
                text,
                prompt_ids=tokens[:at],
                output_ids=ids,
                logprobs=s.logprobs[start:end] if s.logprobs else None,
                finish_reason="length" if s.truncated and end == len(s.mask) else None,
            )
        )


class _TokenDumpReader(Reader):
    """Shared reading: one sample (or a batch of rows) per JSONL line, grouped by rollout id."""

    to_sample = staticmethod(slime_sample)
    batch_column = ""

    def read(self, path: Path) -> Iterator[ReadItem]:
        groups: dict[str, list[Sample]] = {}
        for line, rec, error, raw in self._records(path):
            if error:
                yield Rejected(line, error, raw)
                continue
            try:
                # Every row of a line is checked before any joins its rollout: a broken
                # row rejects the whole line, and no sibling row is left half-added.
                samples = [self.to_sample(row, line) for row in rows_of(rec, self.batch_column)]
            except BAD_CONTENT as exc:
                yield Rejected(line, reason_of(exc), raw)
                continue
            for s in samples:
                groups.setdefault(s.key, []).append(s)
        seen: set = set()
        for samples in groups.values():
            item = build_rollout(samples, self.name)
            lines = {s.line for s in samples} - seen
            seen |= lines
            yield replace(item, records=len(lines))

    def _records(self, path: Path) -> Iterator[tuple[int | None, dict, str | None, str]]:
        return iter_json_records(path)


@register
class SlimeReader(_TokenDumpReader):
    name = "slime"
    description = (
        "slime Sample dicts: JSONL, or .pt debug rollout dumps (loaded with weights_only=True)"
    )
    to_sample = staticmethod(slime_sample)
    batch_column = "tokens"

    def sniff(self, path: Path, head: bytes) -> bool:
        if path.suffix == ".pt":
            return True
        rec = first_json_object(head)
        return rec is not None and "tokens" in rec and "response_length" in rec

    def _records(self, path: Path) -> Iterator[tuple[int | None, dict, str | None, str]]:
        if path.suffix != ".pt":
            yield from iter_json_records(path)
            return
        try:
            import torch
        except ImportError:
            yield (
                None,
                {},
                "reading .pt needs PyTorch (pip install 'seam-rl[train]'), or convert the dump "
                "to JSONL",
                "",
            )
            return
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # any unpickling failure is a property of the file
            yield None, {}, f"cannot load {path.name} safely (weights_only=True): {exc}", ""
            return
        samples = data.get("samples") if isinstance(data, dict) else data
        for i, s in enumerate(samples if isinstance(samples, list) else []):
            if isinstance(s, dict):
                yield (
                    i + 1,
                    {k: v.tolist() if hasattr(v, "tolist") else v for k, v in s.items()},
                    None,
                    "",
                )
            else:
                yield i + 1, {}, f"sample {i} is not a dict", ""


@register
class VerlReader(_TokenDumpReader):
    name = "verl"
    description = "verl agent-loop outputs as JSONL (prompt_ids, response_ids, response_mask, ...)"
    to_sample = staticmethod(verl_sample)
    batch_column = "response_ids"

    def sniff(self, path: Path, head: bytes) -> bool:
        rec = first_json_object(head)
        return rec is not None and "prompt_ids" in rec and "response_ids" in rec


@register
class SkyRLReader(_TokenDumpReader):
    name = "skyrl"
    description = "SkyRL generator outputs as JSONL (one row per line, or a whole batch per line)"
    to_sample = staticmethod(skyrl_sample)
    batch_column = "response_ids"

    def sniff(self, path: Path, head: bytes) -> bool:
        rec = first_json_object(head)
        return rec is not None and "prompt_token_ids" in rec and "response_ids" in rec
