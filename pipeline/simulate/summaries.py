"""Summaries as real harnesses write them (docs/summaries.md), and their defects.

- CompactionRL: after the instruction ``Q_SUM`` the policy writes a summary with the
  original goal, completed actions, important observations, unresolved errors, the
  current state and a next step; the harness re-injects it in a resume message.
- AutoCompact: a working state headed ``# Auto Context Summary`` — established facts
  with their evidence, the workspace state (changed files; tests and whether they
  pass, "added" and "passing" being different facts), and what to do next.

A summary can be written with deliberate *defects* — an omitted key item, no next
step, a next step that contradicts the state, an invented path — at the rates the
audit should find them. ``Summary.omitted`` says exactly what was left out, so the
judge and the audit can be checked against ground truth.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pipeline.simulate.state import WorkState
from pipeline.simulate.tasks import CodingTask

Q_SUM = (
    "Your context window is almost full. Write a summary of the work so far; it will replace the conversation "
    "history. Keep the original goal, the actions you completed, important observations (file paths, function "
    "names, error messages, test names), unresolved errors, the current state of the workspace, and a concrete "
    "next step. Be specific: after this you will only see your summary and your last two steps."
)
RESUME_PREFIX = (
    "This session is being continued from a previous conversation that ran out of context. The summary "
    "below covers the earlier part of the conversation; the most recent steps follow it unchanged.\n\n"
)
RESUME_SUFFIX = "\n\nContinue with the task from where it left off, starting with the next step."
AUTO_PREFIX = "Context compacted. Continue from your working state:\n\n"

DEFECTS = ("omit_item", "omit_next", "contradiction", "invented")
_VAGUE = {
    "file_path": "the module",
    "error_message": "an error",
    "test_name": "the failing test",
    "failing_command": "the test command",
}


@dataclass
class Summary:
    text: str
    defects: list[str] = field(default_factory=list)
    omitted: list[tuple[str, str]] = field(
        default_factory=list
    )  # (kind, value) as the audit types them
    invented: list[str] = field(default_factory=list)


def draw_defects(rng: random.Random, clean: bool) -> list[str]:
    """Defects of an executed summary: modest rates, none when a judge corrected it."""
    if clean:
        return []
    rates = {"omit_item": 0.05, "omit_next": 0.06, "contradiction": 0.02, "invented": 0.015}
    return [d for d in DEFECTS if rng.random() < rates[d]]


def _actions(state: WorkState) -> list[str]:
    """Completed actions, consecutive repeats merged ("(x3)")."""
    out: list[list] = []
    for action in state.actions:
        if out and out[-1][0] == action:
            out[-1][1] += 1
        else:
            out.append([action, 1])
    return [a if n == 1 else f"{a} (x{n})" for a, n in out]


def _code(task: CodingTask, workspace_text: str) -> list[str]:
    lines = workspace_text.split("\n")
    start = next(
        (
            i
            for i, line in enumerate(lines)
            if line.startswith((f"def {task.symbol}(", f"class {task.symbol}"))
        ),
        None,
    )
    if start is None:
        return []
    end = start + 1
    while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return [
        f"Current code of `{task.func}` ({task.module_path}):",
        "```python",
        *lines[start:end],
        "```",
    ]


def _sections(
    task: CodingTask,
    state: WorkState,
    workspace_text: str,
    rng: random.Random,
    defects: list[str],
    auto: bool,
) -> tuple[list[tuple[str, list[str]]], Summary]:
    result = Summary("", list(defects))
    facts = [
        f.text + (f". Evidence: `{f.quote}`" if auto and f.quote else "")
        for f in state.facts.values()
    ]
    if "invented" in defects:
        fake = f"src/{task.repo.name}/_{task.names['mod']}_impl.py"
        facts.append(f"`{task.symbol}` is re-exported from {fake}, which must be kept in sync")
        result.invented.append(fake)
    errors = [f"{tid}: {err}" for tid, err in state.errors.items()]
    changed = [f"{p}: {what}" for p, what in state.changed.items()] or ["No files modified yet."]
    tests = [f"{tid} — {status}" for tid, status in state.tests.items()]
    next_step = state.next_step
    if "contradiction" in defects:
        if state.errors:
            next_step = "Everything is fixed and verified; submit the change."
        elif any(s == "added, not run" for s in state.tests.values()):
            tests = [t.replace("added, not run", "passing") for t in tests]
            result.defects.append("wrong_state")
        else:
            result.defects.remove("contradiction")
    if auto:
        sections = [
            ("## Task", [f"Issue #{task.issue_number} ({task.repo.name}): {state.goal}."]),
            ("## Established facts", [f"- {f}" for f in facts] or ["- Nothing established yet."]),
            (
                "## Workspace state",
                [f"- Changed files: {'; '.join(changed)}", "- Tests:"]
                + [f"  - {t}" for t in tests or ["none run yet"]]
                + (
                    [f"- Failing command: `{state.failing_command}`"]
                    if state.failing_command and state.errors
                    else []
                )
                + [f"- Unresolved: {e}" for e in errors],
            ),
        ]
        if "definition" in state.facts:
            sections.append(("## Relevant code", _code(task, workspace_text)))
    else:
        sections = [
            (
                "## Original goal",
                [
                    f"Resolve issue #{task.issue_number} in {task.repo.name}: {state.goal}. Make the minimal "
                    "change to non-test files; existing tests must keep passing."
                ],
            ),
            ("## Completed actions", [f"{i}. {a}" for i, a in enumerate(_actions(state), 1)]),
            (
                "## Important observations",
                [f"- {f}" for f in facts]
                + ([""] + _code(task, workspace_text) if "definition" in state.facts else []),
            ),
            (
                "## Unresolved errors",
                [f"- {e}" for e in errors]
                + (
                    [f"- Reproduce with `{state.failing_command}`"]
                    if errors and state.failing_command
                    else []
                )
                or ["- None: the last test run passed." if state.tests else "- None observed yet."],
            ),
            (
                "## Current state",
                [f"- Modified: {c}" for c in changed]
                + [f"- Test {t}" for t in tests]
                + ([f"- Files viewed: {', '.join(state.viewed)}"] if state.viewed else []),
            ),
        ]
    if state.errors and "`submit`" in next_step and "contradiction" not in result.defects:
        result.defects.append(
            "contradiction"
        )  # an agent about to give up: the state itself says so, honestly
    if "omit_next" not in defects:
        sections.append(("## Next step", [next_step]))
    else:
        result.omitted.append(("next_step", state.next_step))
    return sections, result


def write_summary(
    task: CodingTask,
    state: WorkState,
    workspace_text: str,
    rng: random.Random,
    defects: list[str],
    auto: bool,
) -> Summary:
    """A CompactionRL summary (``auto=False``) or an AutoCompact working state."""
    sections, result = _sections(task, state, workspace_text, rng, defects, auto)
    text = "\n\n".join(head + "\n" + "\n".join(body) for head, body in sections)
    if auto:
        text = "# Auto Context Summary\n\n" + text
    if "omit_item" in defects:
        present = [(k, v) for k, v in state.key_items() if v in text]
        if present:
            kind, value = rng.choice(present)
            if (
                kind == "test_name" and state.failing_command in text
            ):  # the command names the test too
                text = text.replace(state.failing_command, _VAGUE["failing_command"])
                result.omitted.append(("failing_command", state.failing_command))
            text = text.replace(value, _VAGUE[kind])
            if kind == "test_name":  # the bare function name too, or the test is not really gone
                text = text.replace(value.split("::")[-1], _VAGUE[kind])
            result.omitted.append((kind, value))
        else:
            result.defects.remove("omit_item")
    result.text = text
    return result
