"""ATIF trajectories (Harbor / Terminus-2, ``schema_version`` ``ATIF-v1.x``).

Steps map one to one: ``system``/``user`` steps are context messages, an ``agent`` step
is one call (its ``tool_calls``, ``reasoning_content`` and the token truth in
``metrics.prompt_token_ids / completion_token_ids / logprobs``), and its
``observation.results`` come back as tool messages (``source_call_id``) or, for agents
that do not use tool calling (Terminus-2), as the next user message.

Summarization: Terminus-2 (linear history) ends the file with a system step whose
observation references the summary / questions / answers sub-agent trajectories, and
continues in the file named by ``continued_trajectory_ref``, whose first steps are
copies (``is_copied_context``). The continuation is joined into the same rollout: a run
of copied steps is a ``compaction`` rewrite (copies of live messages kept by id,
copied agent steps are context, not calls). A summarization or ``context_management``
system step not followed by copies replaces the context by its observation content.
A continuation file that a sibling references is skipped (it is read with its parent).
Rewards and the task name come from the trial's ``result.json`` when it is there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.readers import Accepted, Reader, ReadItem, Rejected, Skipped, register
from pipeline.readers.builder import Msg, RolloutBuilder, msg
from pipeline.readers.common import BAD_CONTENT, content_text, load_json, reason_of

MAX_CONTINUATIONS = 100


def _resolve(path: Path, ref: str) -> Path | None:
    """A referenced file next to ``path``; a renamed copy keeps the prefix before ``trajectory``."""
    candidates = [path.parent / ref]
    cut = path.name.rfind("trajectory")
    if cut > 0:
        candidates.append(path.parent / (path.name[:cut] + Path(ref).name))
    return next((c for c in candidates if c.is_file()), None)


def _referenced_by_sibling(path: Path) -> tuple[str, dict] | None:
    """How a sibling trajectory refers to ``path``: ``("continuation", parent doc)`` or
    ``("subagent", parent doc)``. Only files named as Harbor names continuations
    (``.cont-N``) and summarization sub-agents are looked up, so a directory of many
    trajectories is not read once per file."""
    is_continuation = re.search(r"\.cont-\d+\.json$", path.name) is not None
    if not is_continuation and "summarization-" not in path.name:
        return None
    cut = path.name.rfind("trajectory")
    for sibling in sorted(path.parent.glob(f"{path.name[:cut] if cut > 0 else ''}*.json")):
        try:
            doc = load_json(sibling) if sibling != path else None
            if not isinstance(doc, dict):
                continue
            ref = doc.get("continued_trajectory_ref")
            if is_continuation and isinstance(ref, str) and _resolve(sibling, ref) == path:
                return "continuation", doc
            paths = [
                r.get("trajectory_path")
                for step in doc.get("steps") or []
                if isinstance(step, dict)
                for res in ((step.get("observation") or {}).get("results") or [])
                if isinstance(res, dict)
                for r in res.get("subagent_trajectory_ref") or []
                if isinstance(r, dict)
            ]
        except (OSError, *BAD_CONTENT):
            continue
        if any(isinstance(p, str) and _resolve(sibling, p) == path for p in paths):
            return "subagent", doc
    return None


def _rollout_id(doc: dict, path: Path | None) -> str:
    return str(
        doc.get("trajectory_id") or doc.get("session_id") or (path.stem if path else "trajectory")
    )


def _trial_result(path: Path) -> dict:
    for candidate in (path.parent / "result.json", path.parent.parent / "result.json"):
        if candidate.is_file():
            try:
                result = load_json(candidate)
            except (ValueError, OSError):
                return {}
            return result if isinstance(result, dict) else {}
    return {}


def _reward(result: dict) -> float | None:
    rewards = (result.get("verifier_result") or {}).get("rewards")
    if isinstance(rewards, dict):
        value = rewards.get(
            "reward", next(iter(rewards.values()), None) if len(rewards) == 1 else None
        )
        return float(value) if isinstance(value, (int, float)) else None
    return float(rewards) if isinstance(rewards, (int, float)) else None


@register
class AtifReader(Reader):
    name = "atif"
    description = "ATIF trajectory JSON (Harbor, Terminus-2), continuation files joined"

    def sniff(self, path: Path, head: bytes) -> bool:
        return b'"schema_version"' in head and b"ATIF-" in head and b'"steps"' in head

    def read(self, path: Path) -> Iterator[ReadItem]:
        try:
            doc = load_json(path)
            if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
                raise ValueError("not an ATIF trajectory: no 'steps' list")
        except (ValueError, OSError) as exc:
            yield Rejected(None, f"cannot read ATIF file: {exc}")
            return
        referenced = _referenced_by_sibling(path)
        if referenced and referenced[0] == "continuation":
            yield Skipped(
                None, "continuation file: read as part of the trajectory that references it"
            )
            return
        parent = _rollout_id(referenced[1], None) if referenced else None
        docs, notes = [doc], {}
        current_path, current = path, doc
        while (
            isinstance(current.get("continued_trajectory_ref"), str)
            and len(docs) <= MAX_CONTINUATIONS
        ):
            nxt = _resolve(current_path, current["continued_trajectory_ref"])
            if nxt is None:
                notes["continuation_missing"] = current["continued_trajectory_ref"]
                break
            try:
                current = load_json(nxt)
                if not isinstance(current, dict) or not isinstance(current.get("steps"), list):
                    raise ValueError("not an ATIF trajectory")
                current_path = nxt
            except (ValueError, OSError) as exc:
                notes["continuation_unreadable"] = f"{nxt.name}: {exc}"
                break
            docs.append(current)
            notes.setdefault("continuation_files", []).append(nxt.name)
        result = _trial_result(path)
        rollout_id = _rollout_id(doc, path)
        if parent is not None and rollout_id == parent:
            rollout_id = f"{parent}/{path.stem}"
        summary = (
            parent is not None and re.search(r"summarization-\d+-summary", path.name) is not None
        )
        yield self._rollout(docs, rollout_id, result, notes, parent, summary)
        embedded = doc.get("subagent_trajectories")
        for sub in embedded if isinstance(embedded, list) else []:
            if isinstance(sub, dict) and isinstance(sub.get("steps"), list):
                sub_id = f"{rollout_id}/{sub.get('trajectory_id') or sub.get('session_id')}"
                # The parent's trial outcome is the sub-agent's too (one vote with it).
                yield self._rollout([sub], sub_id, result, {}, rollout_id)

    def _rollout(
        self,
        docs: list[dict],
        rollout_id: str,
        result: dict,
        notes: dict,
        parent: str | None,
        summary: bool = False,
    ) -> ReadItem:
        """One rollout from a trajectory and its continuations. ``summary``: the trajectory
        is a summarization sub-agent's, so its last call produced the summary."""
        steps = sum(len(d["steps"]) for d in docs if isinstance(d.get("steps"), list))
        builder = RolloutBuilder(fill_missing_results=True)
        try:
            pending: dict | None = None
            for doc in docs:
                copied: list[Msg] = []
                for step in doc["steps"]:
                    if not isinstance(step, dict):
                        raise ValueError(f"step is not an object: {str(step)[:80]}")
                    if step.get("is_copied_context"):
                        copied.extend(self._messages(step, as_context=True))
                        continue
                    if copied:
                        builder.rewrite(
                            "compaction",
                            "budget",
                            builder.match(copied),
                            id=f"copied-before-step-{step.get('step_id')}",
                            meta={"copied_steps": len(copied), **(pending or {})},
                        )
                        copied, pending = [], None
                    elif pending is not None:
                        self._boundary(builder, pending)
                        pending = None
                    if step.get("source") == "system" and self._is_boundary(step):
                        pending = self._boundary_meta(step)
                        continue
                    for m in self._messages(step, as_context=False):
                        if m.role == "tool" and not builder.is_open(m.fields["tool_call_id"]):
                            m = msg(
                                "user",
                                m.content,
                                id=m.id,
                                meta={"source_call_id": m.fields["tool_call_id"]},
                            )
                        builder.append(m)
                if copied:
                    builder.rewrite(
                        "compaction",
                        "budget",
                        builder.match(copied),
                        meta={"copied_steps": len(copied)},
                    )
            if pending is not None:
                self._boundary(builder, pending)
            if summary and builder.last_call is not None:
                builder.update(builder.last_call.id, kind="summary")
            agent = docs[0].get("agent") or {}
            meta = {
                **notes,
                "agent": agent.get("name"),
                "agent_version": agent.get("version"),
                "session_id": docs[0].get("session_id"),
                "schema_version": docs[0].get("schema_version"),
            }
            tools = [
                t if "function" in t else {"type": "function", "function": t}
                for t in agent.get("tool_definitions") or []
                if isinstance(t, dict)
            ]
            rollout = builder.build(
                rollout_id=rollout_id,
                task_id=str(result.get("task_name") or rollout_id),
                source=self.name,
                model=agent.get("model_name"),
                tools=tools,
                reward=_reward(result),
                parent_rollout_id=parent,
                meta={k: v for k, v in meta.items() if v is not None},
            )
        except BAD_CONTENT as exc:
            return Rejected(None, f"trajectory {rollout_id}: {reason_of(exc)}", records=steps)
        return Accepted(rollout, None, records=steps)

    @staticmethod
    def _is_boundary(step: dict) -> bool:
        """A system step that declares context management, or hands off to summarization
        sub-agents (other delegations are not rewrites)."""
        extra = step.get("extra") or {}
        results = (step.get("observation") or {}).get("results") or []
        refs = [r.get("subagent_trajectory_ref") for r in results if isinstance(r, dict)]
        return bool(extra.get("context_management")) or "summar" in json.dumps(refs).lower()

    @staticmethod
    def _boundary_meta(step: dict) -> dict:
        results = [
            r for r in (step.get("observation") or {}).get("results") or [] if isinstance(r, dict)
        ]
        refs = [ref for r in results for ref in r.get("subagent_trajectory_ref") or []]
        content = "\n".join(content_text(r.get("content")) for r in results if r.get("content"))
        return {
            "boundary_step": step.get("step_id"),
            "subagent_refs": refs,
            "summary": content,
            "context_management": (step.get("extra") or {}).get("context_management"),
        }

    @staticmethod
    def _boundary(builder: RolloutBuilder, meta: dict) -> None:
        """A summarization step with no copied steps after it: its content is the new context."""
        summary = meta.pop("summary")
        items = (
            [
                msg(
                    "user",
                    summary,
                    id=f"step-{meta['boundary_step']}:summary",
                    meta={"compact_summary": True},
                )
            ]
            if summary
            else []
        )
        if not summary:
            meta["context_unknown"] = "no copied steps and no summary content after this step"
        builder.rewrite(
            "compaction",
            "budget",
            items,
            id=f"boundary-step-{meta['boundary_step']}",
            meta={k: v for k, v in meta.items() if v},
        )

    @staticmethod
    def _messages(step: dict, as_context: bool) -> list[Msg]:
        source = step.get("source")
        text = content_text(step.get("message"))
        sid = f"step-{step.get('step_id')}"
        meta = {"step_id": step.get("step_id")}
        if source != "agent":
            return [msg("system" if source == "system" else "user", text, id=sid, meta=meta)]
        metrics = step.get("metrics") or {}
        if step.get("model_name"):
            meta["model"] = step["model_name"]
        if step.get("llm_call_count") == 0:
            meta["not_a_model_call"] = True
        calls = [
            {
                "id": c.get("tool_call_id"),
                "name": c.get("function_name"),
                "arguments": c.get("arguments"),
            }
            for c in step.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        fields: dict[str, Any] = {
            "reasoning": step.get("reasoning_content") or None,
            "tool_calls": calls or None,
        }
        if not as_context and metrics.get("completion_token_ids"):
            fields["output_ids"] = list(metrics["completion_token_ids"])
            fields["prompt_ids"] = (
                list(metrics["prompt_token_ids"]) if metrics.get("prompt_token_ids") else None
            )
            logprobs = metrics.get("logprobs")
            if logprobs and len(logprobs) == len(fields["output_ids"]):
                fields["logprobs"] = [float(x) for x in logprobs]
            elif logprobs:
                meta["logprobs_length_mismatch"] = [len(logprobs), len(fields["output_ids"])]
        out = [msg("assistant", text, id=sid, meta=meta, **fields)]
        plain = []
        for result in (step.get("observation") or {}).get("results") or []:
            if not isinstance(result, dict):
                continue
            body = content_text(result.get("content"))
            if result.get("source_call_id"):
                out.append(
                    msg(
                        "tool",
                        body,
                        id=f"{sid}:{result['source_call_id']}",
                        tool_call_id=str(result["source_call_id"]),
                    )
                )
            else:
                plain.append(body)
        if plain:
            out.append(
                msg(
                    "user",
                    "\n".join(plain),
                    id=f"{sid}:observation",
                    meta={"observation_of_step": step.get("step_id")},
                )
            )
        return out
