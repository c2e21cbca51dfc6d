"""What the simulated agent knows at each point: the source of every summary it writes.

Real summaries are written from the history; the simulator writes them from this
record of the history instead, which is the same information in structured form:
completed actions, established facts with the message that proves them (the judge's
evidence), the workspace (changed files, tests and whether they pass), unresolved
errors, and the next step. Keeping it explicit is also what lets the simulator write
a *deficient* summary on purpose (an omitted error, a missing next step) and know
exactly what it left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fact:
    """An established fact and its evidence (a quote from a tool result)."""

    text: str
    message_id: str = ""
    quote: str = ""


@dataclass
class ToolUse:
    """One tool call of a step and the result the environment returned."""

    name: str
    args: dict
    result: str | None  # None: no result (the rollout ended with this call)


@dataclass
class Step:
    """One action of the agent: what it says, thinks and calls, and what it learns."""

    intent: str
    content: str
    reasoning: str
    uses: list[ToolUse]
    learned: list[tuple[str, Fact]] = field(
        default_factory=list
    )  # (fact key, fact; quote found in use 0)
    action: str = ""  # one line for the summary's "completed actions"
    final: bool = False
    effects: list[Callable[[], None]] = field(
        default_factory=list
    )  # applied only if the step is executed


@dataclass
class WorkState:
    goal: str
    module_path: str
    test_path: str
    actions: list[str] = field(default_factory=list)
    facts: dict[str, Fact] = field(default_factory=dict)
    viewed: list[str] = field(default_factory=list)
    changed: dict[str, str] = field(default_factory=dict)  # path -> what changed
    tests: dict[str, str] = field(
        default_factory=dict
    )  # test id -> failing | passing | added, not run
    errors: dict[str, str] = field(default_factory=dict)  # test id -> error signature (unresolved)
    failing_command: str = ""
    next_step: str = ""

    def record(self, step: Step, tool_message_ids: list[str]) -> None:
        """Fold a finished step in; evidence points at the tool result that showed it."""
        if step.action:
            self.actions.append(step.action)
        for key, fact in step.learned:
            mid = tool_message_ids[0] if tool_message_ids else ""
            self.facts[key] = Fact(fact.text, mid, fact.quote)
        for use in step.uses:
            path = use.args.get("path")
            if use.name == "read_file" and path and path not in self.viewed:
                self.viewed.append(path)

    def key_items(self) -> list[tuple[str, str]]:
        """The state a summary must not lose: (kind, value) as the audit types them."""
        items = []
        if "definition" in self.facts:
            items.append(("file_path", self.module_path))
        if self.failing_command:
            items.append(("failing_command", self.failing_command))
        for test_id, error in self.errors.items():
            items.append(("test_name", test_id))
            items.append(("error_message", error))
        return items
