"""mini-swe-agent trajectories (``info``, ``messages``, ``trajectory_format``).

The history is append-only: ``messages`` is exactly what the model saw, in order. An
assistant message is a call; its ``extra.response`` (the raw completion) gives the
model name. Version 2 files may carry tool calls and end with a role ``exit`` message,
which holds the outcome and is not part of the conversation. No reward is recorded:
``info.exit_status`` and whether a ``submission`` exists go to ``meta.outcome``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pipeline.readers import Accepted, Reader, ReadItem, Rejected, Skipped, register
from pipeline.readers.builder import RolloutBuilder, openai_message
from pipeline.readers.common import BAD_CONTENT, file_digest, load_json, reason_of


@register
class MiniSweAgentReader(Reader):
    name = "mini-swe-agent"
    description = "mini-swe-agent trajectory JSON (trajectory_format mini-swe-agent-1*)"

    def sniff(self, path: Path, head: bytes) -> bool:
        return b'"mini-swe-agent' in head or (b'"messages"' in head and b'"mini_version"' in head)

    def read(self, path: Path) -> Iterator[ReadItem]:
        try:
            doc = load_json(path)
            if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
                raise ValueError("not a mini-swe-agent trajectory: no 'messages' list")
        except (ValueError, OSError) as exc:
            yield Rejected(None, f"cannot read mini-swe-agent file: {exc}")
            return
        messages = doc["messages"]
        info = doc["info"] if isinstance(doc.get("info"), dict) else {}
        outcome = {
            "exit_status": info.get("exit_status"),
            "submitted": bool(info.get("submission")),
        }
        builder = RolloutBuilder()
        model = None
        used = 0
        try:
            for i, m in enumerate(messages):
                if not isinstance(m, dict):
                    raise ValueError(f"messages[{i}] is not an object")
                if m.get("role") == "exit":
                    outcome.update(
                        {k: v for k, v in (m.get("extra") or {}).items() if k in ("exit_status",)}
                    )
                    yield Skipped(
                        None, "role 'exit' message (the run's outcome, not sent to the model)"
                    )
                    continue
                response = (m.get("extra") or {}).get("response") or {}
                model = model or (response.get("model") if isinstance(response, dict) else None)
                if builder.append(openai_message(m, id=f"m{i}")) is None:
                    raise ValueError(
                        f"messages[{i}] answers unknown tool call {m.get('tool_call_id')!r}"
                    )
                used += 1
            rollout = builder.build(
                rollout_id=f"{path.name.split('.')[0]}-{file_digest(path)}",
                task_id=path.name.split(".")[0],
                source=self.name,
                model=model,
                meta={
                    "outcome": outcome,
                    "trajectory_format": doc.get("trajectory_format"),
                    "mini_version": info.get("mini_version"),
                },
            )
        except BAD_CONTENT as exc:
            yield Rejected(None, f"{path.name}: {reason_of(exc)}", records=len(messages))
            return
        yield Accepted(rollout, None, records=used)
