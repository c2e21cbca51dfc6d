"""Hand-written rollouts for the judge tests: a few lines each, readable as a story."""

from __future__ import annotations

import json

from schemas.rollout import Keep, MessageEvent, RewriteEvent, Rollout, ToolCall

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("bash", "read_file", "edit_file", "grep", "compact", "submit")
]
Q_SUM = "Context is nearly full. Write a working-state summary: what is established, files, tests, next step."


class Story:
    """Builds a canonical rollout call by call: ``act`` makes a call with tool results,
    ``compact`` makes a summary call and rebuilds the context around its summary."""

    def __init__(self, rollout_id: str = "r1", task: str = "Fix the date parsing bug in the repo."):
        self.rollout_id = rollout_id
        self.events: list = [
            MessageEvent(id="sys", role="system", content="You are a coding agent."),
            MessageEvent(id="task", role="user", content=task),
        ]
        self._n = 0

    def _id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def act(self, *calls: tuple[str, dict, str], content: str = "") -> Story:
        """One assistant call making ``calls`` = (tool, arguments, result) and their results."""
        tool_calls = [
            ToolCall(id=self._id("tc"), name=name, arguments=json.dumps(args))
            for name, args, _ in calls
        ]
        self.events.append(
            MessageEvent(id=self._id("a"), role="assistant", content=content, tool_calls=tool_calls)
        )
        for call, (name, _, result) in zip(tool_calls, calls):
            self.events.append(
                MessageEvent(
                    id=self._id("t"), role="tool", tool_call_id=call.id, name=name, content=result
                )
            )
        return self

    def say(self, content: str) -> Story:
        self.events.append(MessageEvent(id=self._id("a"), role="assistant", content=content))
        return self

    def compact(self, summary: str, trigger: str = "model") -> Story:
        """The policy writes ``summary`` after q_sum; the context becomes system + task + resume."""
        self.events.append(MessageEvent(id=self._id("u"), role="user", content=Q_SUM))
        self.events.append(
            MessageEvent(id=self._id("s"), role="assistant", kind="summary", content=summary)
        )
        resume = MessageEvent(
            id=self._id("resume"), role="user", content="Summary of earlier work:\n" + summary
        )
        self.events.append(
            RewriteEvent(
                id=self._id("rw"),
                reason="compaction",
                trigger=trigger,
                context=[Keep(id="sys"), Keep(id="task"), resume],
            )
        )
        return self

    def build(self, **fields) -> Rollout:
        return Rollout(
            rollout_id=self.rollout_id,
            task_id="t1",
            source="test",
            tools=TOOLS,
            events=self.events,
            **fields,
        )
