"""The simulated agent: a plan of intents, a workspace it edits, and what it knows.

The plan is drawn up front from the intended outcome (resolved or not) and a target
length; side trips pad it to the target so rollouts span 20–120 calls. Resolved plans
explore, reproduce, locate, sometimes try a wrong edit first, fix, add a regression
test, run the suite and submit; unresolved plans commit to the template's plausible
wrong fix and then loop (re-read, re-run, search again) until they give up. Whether a
rollout is resolved is read off the final workspace, so the reward never disagrees
with what the tool outputs showed.
"""

from __future__ import annotations

import random
from collections import deque

from pipeline.simulate import outputs
from pipeline.simulate.actions import (
    add_test,
    diff,
    edit,
    grep_symbol,
    locate,
    one_line,
    orient,
    ramble,
    read_module,
    read_tests,
    repro,
    run_tests,
    submit,
)
from pipeline.simulate.bugs import Failure
from pipeline.simulate.sidetrips import wander
from pipeline.simulate.state import Step, WorkState
from pipeline.simulate.tasks import CodingTask

_WANDER = "wander"

ACTIONS = {  # intent -> the action that realizes it
    "orient": orient,
    "grep_symbol": grep_symbol,
    "read_module": read_module,
    "read_tests": read_tests,
    "repro": repro,
    "locate": locate,
    "locate_wrong": lambda a: locate(a, wrong=True),
    "edit_fix": lambda a: edit(a, "fix"),
    "edit_wrong": lambda a: edit(a, "wrong"),
    "edit_miss": lambda a: edit(a, "miss"),
    "revert_wrong": lambda a: edit(a, "revert"),
    "add_test": add_test,
    "run_failing": lambda a: run_tests(a, "failing"),
    "run_file": lambda a: run_tests(a, "file"),
    "run_all": lambda a: run_tests(a, "all"),
    "diff": diff,
    "submit": submit,
    "wander": wander,
    "ramble": ramble,
}


def build_plan(rng: random.Random, resolved: bool, n_steps: int) -> list[str]:
    """The intents of one episode, padded with side trips to about ``n_steps``."""
    explore = ["orient", "grep_symbol", "read_module", "read_tests", "repro"]
    if rng.random() < 0.25:
        explore.remove("orient")
    if resolved:
        fix = (
            ["edit_wrong", "run_failing", "locate", "revert_wrong"]
            if rng.random() < 0.3
            else ["locate"]
        )
        fix += (["edit_miss"] if rng.random() < 0.25 else []) + ["edit_fix", "run_failing"]
        finish = (["add_test", "run_file"] if rng.random() < 0.7 else []) + [
            "run_all",
            "diff",
            "submit",
        ]
        spare = max(0, n_steps - len(explore) - len(fix) - len(finish))
        w1 = int(spare * rng.uniform(0.5, 0.8))
        w2 = int((spare - w1) * rng.uniform(0.4, 0.8))
        cut = rng.randint(1, len(fix) - 2)
        return (
            explore
            + [_WANDER] * w1
            + fix[:cut]
            + [_WANDER] * w2
            + fix[cut:]
            + finish[:-2]
            + [_WANDER] * (spare - w1 - w2)
            + finish[-2:]
        )
    attempt = ["locate_wrong", "edit_wrong", "run_failing"] if rng.random() < 0.9 else []
    spare = max(0, n_steps - len(explore) - len(attempt) - 2)
    w1 = int(spare * rng.uniform(0.3, 0.5))
    loop = [
        rng.choice(["read_module", "run_failing", _WANDER, _WANDER, "grep_symbol"])
        for _ in range(spare - w1)
    ]
    return (
        explore
        + [_WANDER] * w1
        + attempt
        + loop
        + (["diff", "submit"] if rng.random() < 0.8 else ["submit"])
    )


class Agent:
    def __init__(
        self, task: CodingTask, rng: random.Random, resolved: bool, n_steps: int, reasoning: bool
    ):
        self.task = task
        self.rng = rng
        self.reasoning = reasoning
        self.workspace = {path: "\n".join(lines) for path, lines in task.files.items()}
        self.fixed = False
        self.wrong_applied = False
        self.state = WorkState(
            goal=task.text(task.bug.issue_title),
            module_path=task.module_path,
            test_path=task.test_path,
        )
        self.queue = deque(build_plan(rng, resolved, n_steps))
        self.done = False
        self._other_tests: dict[str, list[str]] = {}
        self.side_trips: set[tuple[str, str]] = set()
        self.state.next_step = self.describe_next()

    # -- the environment the actions see --------------------------------------------------
    def lines(self, path: str) -> list[str]:
        return self.workspace[path].split("\n") if path in self.workspace else self.task.file(path)

    def test_names(self) -> list[str]:
        return [
            line[4 : line.index("(")]
            for line in self.lines(self.task.test_path)
            if line.startswith("def test_")
        ]

    def other_tests(self, path: str) -> list[str]:
        if path not in self._other_tests:
            n = random.Random(f"{self.task.seed}:{path}:tests").randint(3, 9)
            self._other_tests[path] = [f"test_{i}" for i in range(n)]
        return self._other_tests[path]

    def failure_now(self) -> Failure | None:
        if self.wrong_applied:
            return self.task.failure(wrong=True)
        return None if self.fixed else self.task.failure()

    def failure_block(self, test_name: str, failure: Failure) -> str:
        t = self.task
        tests, module = self.lines(t.test_path), self.lines(t.module_path)
        test_def = next(
            i for i, line in enumerate(tests, 1) if line.startswith(f"def {test_name}(")
        )
        func_def = next(
            i
            for i, line in enumerate(module, 1)
            if line.startswith((f"def {t.symbol}(", f"class {t.symbol}"))
        )
        return outputs.failure_block(
            test_name, t.test_path, tests, test_def, failure, t.module_path, module, func_def
        )

    @property
    def resolved(self) -> bool:
        return self.fixed and not self.wrong_applied

    # -- stepping ---------------------------------------------------------------------------
    def next_step(self) -> Step:
        return ACTIONS[self.queue.popleft()](self)

    def commit(self, step: Step, tool_message_ids: list[str]) -> None:
        """The step was executed: apply its effects and fold it into the working state."""
        for effect in step.effects:
            effect()
        self.state.record(step, tool_message_ids)
        self.done = step.final or not self.queue
        self.state.next_step = self.describe_next()

    def after_compaction(self, redo: bool, reread: bool) -> None:
        """A fresh context refocuses the agent: side trips at the head of the plan are
        dropped so the next action is the summary's next step; ``redo``/``reread`` insert
        the two classic post-compaction habits (searching again, re-reading the file)."""
        while self.queue and self.queue[0] == _WANDER and len(self.queue) > 2:
            self.queue.popleft()
        if redo:
            self.queue.appendleft("grep_symbol")
        elif reread:
            self.queue.appendleft("read_module")

    def describe_next(self) -> str:
        """The next step as a summary would state it (the next non-side-trip intent)."""
        t = self.task
        intent = next((i for i in self.queue if i != _WANDER), "submit")
        bad, fix = t.text(t.bug.bad_line).strip(), one_line(t.text(t.bug.new))
        inspect = f"Inspect `{t.func}` in {t.module_path} (lines {t.func_line}-{t.func_line + 12}) to pin down the root cause."
        return {
            "orient": "Look at the repository layout.",
            "grep_symbol": f"Find where `{t.symbol}` is defined (grep under src/).",
            "read_module": f"Read {t.module_path} around `{t.func}` (line {t.func_line}).",
            "read_tests": f"Read {t.test_path} to see how `{t.func}` is tested.",
            "repro": f"Reproduce the failure with `{t.test_command}`.",
            "locate": inspect,
            "locate_wrong": inspect,
            "edit_wrong": f"Edit {t.module_path}: change `{t.text(t.bug.wrong_old).strip()}`.",
            "revert_wrong": f"Revert the earlier change in {t.module_path} (`{t.text(t.bug.wrong_new).strip()}`).",
            "edit_miss": f"Edit {t.module_path} line {t.bad_line_no}: replace `{bad}` with `{fix}`.",
            "edit_fix": f"Edit {t.module_path} line {t.bad_line_no}: replace `{bad}` with `{fix}`.",
            "run_failing": f"Run `{t.test_command}` to check the change.",
            "add_test": f"Add a regression test for #{t.issue_number} to {t.test_path}.",
            "run_file": f"Run `python -m pytest {t.test_path}`.",
            "run_all": "Run the full test suite with `python -m pytest`.",
            "diff": "Review the change with `git diff`, then call `submit`.",
            "submit": "Call `submit` to submit the change.",
            "ramble": "Recap what was tried and decide how to proceed.",
        }[intent]

    # -- proposals a judge would replace (never executed) ------------------------------------
    def propose(self, kind: str) -> Step:
        """An action the policy might have proposed instead: ``redo`` (search again for what
        is known), ``drift`` (an off-task side trip), ``skip`` (run the whole suite instead
        of the next step)."""
        if kind == "redo":
            return grep_symbol(self)
        if kind == "drift":
            return wander(self)
        return run_tests(self, "all")
