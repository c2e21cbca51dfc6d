"""The agent's actions: each intent becomes a step with tool calls and realistic results.

An action is a pure function of the agent's current view (task, workspace, state): it
returns a ``Step`` whose ``effects`` change the workspace and the working state only
when the step is actually executed. That purity is what lets the simulator also build
*proposals that were never executed* — the originals a judge replaced — from the same
code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.simulate import outputs
from pipeline.simulate.state import Fact, Step, ToolUse

if TYPE_CHECKING:
    from pipeline.simulate.agent import Agent


def _say(a: Agent, *options: str) -> str:
    return a.rng.choice(options)


def _think(a: Agent, text: str) -> str:
    return text if a.reasoning else ""


def orient(a: Agent) -> Step:
    t = a.task
    cmd = a.rng.choice(
        ["find src tests -name '*.py' | sort", "git ls-files", "git ls-files | head -50"]
    )
    files = [p for p in t.tree if p.endswith(".py")] if cmd.startswith("find") else t.tree
    return Step(
        "orient",
        _say(
            a,
            "Let me look at the repository layout first.",
            "I'll start by exploring the repository structure.",
        ),
        _think(
            a,
            f"The issue is about `{t.func}`. I need to find the module that defines it and its tests.",
        ),
        [ToolUse("bash", {"command": cmd}, "\n".join(files))],
        action=f"Listed the repository (`{cmd}`).",
    )


def grep_symbol(a: Agent) -> Step:
    t = a.task
    pattern = f"class {t.symbol}" if t.symbol[0].isupper() else f"def {t.symbol}"
    line = t.func_line
    hits = [(t.module_path, line, t.file(t.module_path)[line - 1])] + [
        h for h in t.callers if "import" in h[2]
    ]
    hit = f"{t.module_path}:{line}:"
    return Step(
        "grep_symbol",
        _say(
            a,
            f"Searching for the definition of `{t.symbol}`.",
            f"Let me find where `{t.symbol}` is defined.",
        ),
        _think(a, f"`{t.symbol}` should be defined somewhere under src/{t.repo.name}."),
        [ToolUse("grep", {"pattern": pattern, "path": "src"}, outputs.grep_output(hits))],
        [
            (
                "definition",
                Fact(f"`{t.func}` is defined in {t.module_path} (line {line})", quote=hit),
            )
        ],
        action=f"Searched for `{pattern}`: defined at {t.module_path}:{line}.",
    )


def read_module(a: Agent, narrow: bool = False) -> Step:
    t = a.task
    lines = a.lines(t.module_path)
    start = max(1, t.func_line - (2 if narrow else a.rng.randint(8, 20)))
    end = t.func_line + (12 if narrow else a.rng.randint(15, 40))
    args = {"path": t.module_path, "start_line": start, "end_line": min(end, len(lines))}
    return Step(
        "read_module",
        _say(a, f"Let me read `{t.func}` and its surroundings.", f"Opening {t.module_path}."),
        _think(a, f"I want to see the body of `{t.func}` and the helpers around it."),
        [ToolUse("read_file", args, outputs.cat_n(lines, start, end))],
        action=f"Read {t.module_path} lines {start}-{args['end_line']}.",
    )


def read_tests(a: Agent) -> Step:
    t = a.task
    lines = a.lines(t.test_path)
    return Step(
        "read_tests",
        _say(a, "Now the existing tests for this module.", f"Let me check {t.test_path}."),
        _think(a, "The tests tell me which behaviour is intended."),
        [
            ToolUse(
                "read_file",
                {"path": t.test_path, "start_line": 1, "end_line": len(lines)},
                outputs.cat_n(lines, 1, len(lines)),
            )
        ],
        [
            (
                "test",
                Fact(
                    f"{t.failing_test_id} covers the reported behaviour",
                    quote=f"def {t.failing_test}():",
                ),
            )
        ],
        action=f"Read {t.test_path}; `{t.failing_test}` covers the issue.",
    )


def repro(a: Agent) -> Step:
    t = a.task
    step = run_tests(a, "failing")
    step.intent = "repro"
    step.content = _say(
        a, "Let me reproduce the failure.", f"Running `{t.failing_test}` to confirm the bug."
    )
    step.reasoning = _think(a, "Before changing anything I want to see the exact error.")
    step.learned.append(
        ("error", Fact(f"{t.failing_test_id} fails with `{t.error}`", quote=t.error))
    )
    step.action = f"Reproduced: `{t.test_command}` fails with {t.error}."

    def note() -> None:
        a.state.failing_command = t.test_command

    step.effects.append(note)
    return step


def locate(a: Agent, wrong: bool = False) -> Step:
    """Read the function closely and name the cause; ``wrong``: a misdiagnosis (the
    template's tempting wrong fix), which is how unresolved rollouts go astray."""
    t = a.task
    step = read_module(a, narrow=True)
    step.intent = "locate"
    if wrong:
        line = t.text(t.bug.wrong_old).strip()
        at = t.line_of(t.module_path, t.text(t.bug.wrong_old))
        step.content = f"I think the problem is `{line}` in `{t.func}`."
        step.reasoning = _think(
            a,
            f"Line {at}: `{line}` looks wrong. Changing it to `{t.text(t.bug.wrong_new).strip()}` "
            "should make the failing test pass.",
        )
        step.learned.append(
            ("cause", Fact(f"suspected cause at {t.module_path}:{at}: `{line}`", quote=line))
        )
        step.action = f"Suspected {t.module_path}:{at} (`{line}`)."
        return step
    step.content = _say(a, f"The problem is in `{t.func}`: {t.cause}.", f"Found it: {t.cause}.")
    step.reasoning = _think(
        a,
        f"Looking at line {t.bad_line_no}: `{t.text(t.bug.bad_line).strip()}`. "
        f"{t.cause[0].upper() + t.cause[1:]}. "
        f"The minimal fix is `{one_line(t.text(t.bug.new))}`.",
    )
    step.learned.append(
        (
            "cause",
            Fact(
                f"root cause at {t.module_path}:{t.bad_line_no}: {t.cause}",
                quote=t.text(t.bug.bad_line).strip(),
            ),
        )
    )
    step.action = f"Located the root cause at {t.module_path}:{t.bad_line_no}."
    return step


def edit(a: Agent, kind: str) -> Step:
    """``kind``: fix | wrong | revert | miss (an old_str that does not match)."""
    t, bug = a.task, a.task.bug
    old, new = {
        "fix": (bug.old, bug.new),
        "wrong": (bug.wrong_old, bug.wrong_new),
        "revert": (bug.wrong_new, bug.wrong_old),
        "miss": (bug.old, bug.new),
    }[kind]
    old, new = t.text(old), t.text(new)
    if kind == "miss":  # a doubled space: the classic reason an exact-match edit misses
        old = old.replace(" ", "  ", 1)
    path = t.module_path
    text = a.workspace[path]
    args = {"path": path, "old_str": old, "new_str": new}
    if old not in text:
        result = outputs.edit_failed(path, old)
        return Step(
            "edit_" + kind,
            _say(a, "Applying the fix.", f"Editing {path}."),
            "",
            [ToolUse("str_replace", args, result)],
            action=f"Edit of {path} failed (old_str did not match).",
        )
    after = text.replace(old, new, 1)
    line = text[: text.index(old)].count("\n") + 1
    step = Step(
        "edit_" + kind,
        {
            "fix": f"Applying the fix: `{one_line(new)}`.",
            "wrong": f"Let me try changing `{old.strip()}`.",
            "revert": "That change was wrong; reverting it.",
        }[kind],
        _think(
            a,
            {
                "fix": f"{t.cause[0].upper() + t.cause[1:]}; this edit addresses it directly.",
                "wrong": "This line looks suspicious; changing it might be enough.",
                "revert": "The test still fails after my change, so it was not the root cause.",
            }[kind],
        ),
        [ToolUse("str_replace", args, outputs.edit_result(path, after.split("\n"), line))],
        action={
            "fix": f"Fixed {path}:{line}: `{one_line(old)}` -> `{one_line(new)}`.",
            "wrong": f"Changed {path}:{line} to `{new.strip()}` (did not fix the failure).",
            "revert": f"Reverted the change at {path}:{line}.",
        }[kind],
    )

    def apply() -> None:
        a.workspace[path] = after
        if kind == "fix":
            a.fixed = True
            a.state.changed[path] = f"fixed `{t.func}`: `{one_line(new)}`"
        elif kind == "wrong":
            a.wrong_applied = True
            a.state.changed[path] = f"changed to `{new.strip()}` (did not fix the failure)"
        else:
            a.wrong_applied = False
            a.state.changed.pop(path, None)

    step.effects.append(apply)
    return step


def one_line(code: str) -> str:
    """Code on one line, as a summary quotes an edit (``if x: raise ...; return y``)."""
    return "; ".join(line.strip() for line in code.strip().splitlines())


def add_test(a: Agent) -> Step:
    t = a.task
    path, text = t.test_path, a.workspace[t.test_path]
    anchor = t.text(t.bug.test_code).split("\n")[-1]
    name = f"test_{t.symbol.lower()}_regression_{t.issue_number}"
    new = anchor + f"\n\n\ndef {name}():\n" + t.text(t.bug.test_code)
    after = text.replace(anchor, new, 1)
    line = text[: text.index(anchor)].count("\n") + 4
    test_id = f"{path}::{name}"

    def apply() -> None:
        a.workspace[path] = after
        a.state.tests[test_id] = "added, not run"
        a.state.changed[path] = f"added `{name}`"

    step = Step(
        "add_test",
        f"Adding a regression test for #{t.issue_number}.",
        _think(a, "A dedicated test keeps this from regressing."),
        [
            ToolUse(
                "str_replace",
                {"path": path, "old_str": anchor, "new_str": new},
                outputs.edit_result(path, after.split("\n"), line),
            )
        ],
        action=f"Added `{name}` to {path}.",
    )
    step.effects.append(apply)
    return step


def run_tests(a: Agent, scope: str) -> Step:
    """scope: failing (one test) | file | all."""
    t = a.task
    cmd = {
        "failing": t.test_command,
        "file": f"python -m pytest {t.test_path}",
        "all": "python -m pytest",
    }[scope]
    names = [t.failing_test] if scope == "failing" else a.test_names()
    files = [(t.test_path, names)]
    if scope == "all":
        files = sorted(
            files
            + [
                (p, a.other_tests(p))
                for p in t.tree
                if p.startswith("tests/test_") and p != t.test_path
            ]
        )
    failure = a.failure_now()
    failures = []
    if failure is not None:
        for name in names:
            if name == t.failing_test or name.endswith(f"_regression_{t.issue_number}"):
                failures.append((t.test_path, name, a.failure_block(name, failure), failure.error))
    result = outputs.pytest_report(
        files, failures, a.rng.uniform(0.04, 1.8) * (4 if scope == "all" else 1)
    )
    ids = [f"{path}::{name}" for path, name, _, _ in failures]

    def apply() -> None:
        for name in names:
            tid = f"{t.test_path}::{name}"
            if tid in a.state.tests or name == t.failing_test:
                a.state.tests[tid] = "failing" if tid in ids else "passing"
            a.state.errors.pop(tid, None)
        for tid in ids:
            a.state.errors[tid] = failure.error if failure else ""

    step = Step(
        "run_" + scope,
        _say(a, f"Running `{cmd}`.", "Let me run the tests."),
        _think(a, "I need to see whether the current code passes."),
        [ToolUse("bash", {"command": cmd}, result)],
        action=f"Ran `{cmd}`: "
        + (f"{len(failures)} failed ({failure.error})." if failure and failures else "all passed."),
    )
    step.effects.append(apply)
    return step


def diff(a: Agent) -> Step:
    t = a.task
    parts = [
        outputs.unified_diff(p, t.files[p], a.workspace[p].split("\n"))
        for p in (t.module_path, t.test_path)
        if a.workspace[p] != "\n".join(t.files[p])
    ]
    return Step(
        "diff",
        "Let me review the full change.",
        "",
        [ToolUse("bash", {"command": "git diff"}, "\n".join(parts))],
        action="Reviewed `git diff`.",
    )


def submit(a: Agent) -> Step:
    text = (
        "The fix is in place and the tests pass. Submitting."
        if a.fixed and not a.wrong_applied
        else "I believe the change addresses the issue. Submitting."
    )
    return Step("submit", text, "", [ToolUse("submit", {}, None)], final=True)


def ramble(a: Agent) -> Step:
    """A long recap that hits the max-token limit mid-word: no tool call, ``finish_reason="length"``."""
    recap = " ".join(a.state.actions[-12:]) or a.task.issue
    text = (
        "Let me step back and go over everything so far before deciding what to do. " + recap + " "
    ) * 2
    cut = a.rng.randint(len(text) // 2, len(text) - 2)
    while cut < len(text) - 1 and not (text[cut - 1].isalpha() and text[cut].isalpha()):
        cut += 1
    return Step("ramble", text[:cut], _think(a, "I keep going around in circles."), [], final=True)
