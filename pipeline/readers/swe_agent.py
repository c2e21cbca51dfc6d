"""SWE-agent trajectories (``*.traj``: ``trajectory``, ``history``, ``info``).

``history`` is the conversation as the agent appended it (OpenAI-style messages, tool
calls paired by ``tool_call_ids``, demonstrations flagged ``is_demo``). History
processors may rewrite old observations on every call without leaving an event; the
only trace is a step's ``query`` (the messages really sent, often empty). When a
step has a ``query`` that is not the live context, the call is preceded by an ``edit``
rewrite to that query (unchanged messages kept by id). Replayed demonstrations reuse
tool call ids; they are renamed per rollout (see ``common``). SWE-agent records no
reward: ``info.exit_status`` and whether a ``submission`` exists go to ``meta.outcome``.

Steps and history: the n-th ``trajectory`` step is the n-th non-demonstration assistant
message of ``history``. Some SWE-agent versions save the final step (the ``submit``
action) in ``trajectory`` only: a trailing step with an ``action`` becomes the last call
(its ``response`` is what the model wrote, as in ``history``; with function calling its
``tool_calls``, or for a one-word action such as ``submit`` a call of that tool with no
arguments). A trailing step without an action (an autosubmission after an error, written
by SWE-agent, not the model) is not a call; a function-calling step whose call cannot be
rebuilt is left out, named in ``meta.untrained_steps``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pipeline.readers import Accepted, Reader, ReadItem, Rejected, register
from pipeline.readers.builder import Msg, RolloutBuilder, openai_message
from pipeline.readers.common import BAD_CONTENT, file_digest, load_json, reason_of


def _config(doc: dict) -> dict:
    config = doc.get("replay_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError:
            return {}
    return config if isinstance(config, dict) else {}


def _final_step(step: dict, n: int, function_calling: bool) -> Msg | str:
    """A trajectory step that ``history`` lacks, as the call the model made; or why it is
    not one (empty: not a model call at all)."""
    action = str(step.get("action") or "").strip()
    if not action:
        return ""  # SWE-agent's own autosubmission after an error
    message: dict = {"role": "assistant", "content": step.get("response") or ""}
    if isinstance(step.get("tool_calls"), list) and step["tool_calls"]:
        message["tool_calls"] = step["tool_calls"]
    elif function_calling:
        if len(action.split()) != 1:
            return f"trajectory[{n}]: function call of action {action.split()[0]!r} not recorded"
        message["tool_calls"] = [
            {"id": f"step{n}", "function": {"name": action, "arguments": "{}"}}
        ]
    return openai_message(message, id=f"step{n}", meta={"from_trajectory_step": n})


def _task_id(config: dict, path: Path) -> str:
    problem = config.get("problem_statement")
    if isinstance(problem, dict) and problem.get("id"):
        return str(problem["id"])
    return path.name.split(".traj")[0]


@register
class SweAgentReader(Reader):
    name = "swe-agent"
    description = "SWE-agent .traj trajectories"

    def sniff(self, path: Path, head: bytes) -> bool:
        return (
            b'"trajectory"' in head
            and b'"history"' in head
            or (path.suffix == ".traj" and b'"history"' in head)
        )

    def read(self, path: Path) -> Iterator[ReadItem]:
        try:
            doc = load_json(path)
            if not isinstance(doc, dict) or not isinstance(doc.get("history"), list):
                raise ValueError("not a SWE-agent trajectory: no 'history' list")
        except (ValueError, OSError) as exc:
            yield Rejected(None, f"cannot read SWE-agent file: {exc}")
            return
        history, steps = doc["history"], doc.get("trajectory") or []
        builder = RolloutBuilder()
        calls = 0
        untrained: list[str] = []
        try:
            for i, item in enumerate(history):
                if not isinstance(item, dict):
                    raise ValueError(f"history[{i}] is not an object")
                meta = {k: item[k] for k in ("message_type", "agent") if item.get(k)}
                if item.get("is_demo"):
                    meta["is_demo"] = True
                if item.get("role") == "assistant" and not item.get("is_demo"):
                    step = (
                        steps[calls]
                        if calls < len(steps) and isinstance(steps[calls], dict)
                        else {}
                    )
                    self._query(builder, step.get("query"), calls)
                    calls += 1
                if item.get("role") == "tool" and len(item.get("tool_call_ids") or []) > 0:
                    for call_id in item["tool_call_ids"]:
                        m = openai_message({**item, "tool_call_id": call_id}, id=f"h{i}", meta=meta)
                        if builder.append(m) is None:
                            raise ValueError(f"history[{i}] answers unknown tool call {call_id!r}")
                    continue
                builder.append(openai_message(item, id=f"h{i}", meta=meta))
            function_calling = any(
                isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls")
                for m in history
            )
            for n in range(calls, len(steps)):
                step = steps[n] if isinstance(steps[n], dict) else {}
                final = _final_step(step, n, function_calling)
                if isinstance(final, str):
                    if final:
                        untrained.append(final)
                    continue
                self._query(builder, step.get("query"), n)
                builder.append(final)
            info = doc["info"] if isinstance(doc.get("info"), dict) else {}
            outcome = {
                "exit_status": info.get("exit_status"),
                "submitted": bool(info.get("submission")),
            }
            config = _config(doc)
            model = ((config.get("agent") or {}).get("model") or {}).get("name")
            rollout = builder.build(
                rollout_id=f"{path.name.split('.traj')[0]}-{file_digest(path)}",
                task_id=_task_id(config, path),
                source=self.name,
                model=model,
                meta={"outcome": outcome, "steps": len(steps)}
                | ({"untrained_steps": untrained} if untrained else {}),
            )
        except BAD_CONTENT as exc:
            yield Rejected(None, f"{path.name}: {reason_of(exc)}", records=len(history))
            return
        yield Accepted(rollout, None, records=len(history))

    @staticmethod
    def _query(builder: RolloutBuilder, query: object, step: int) -> None:
        """If the step says what was really sent and it differs, rewrite to it first."""
        if not isinstance(query, list) or not query:
            return
        sent = [
            openai_message(m, id=f"q{step}.{j}") for j, m in enumerate(query) if isinstance(m, dict)
        ]
        items = builder.match(sent)
        if len(items) == len(builder.live) and all(
            getattr(it, "type", None) == "keep" for it in items
        ):
            return
        builder.rewrite(
            "edit", "budget", items, id=f"query-{step}", meta={"by": "history processor"}
        )
