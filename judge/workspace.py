"""What the agent did and what state its workspace is in, read from a list of messages.

``steps_in`` pairs every tool call with its result and classifies it (``facts.classify``);
``workspace_state`` folds the steps into the facts a working-state summary must keep.
AutoCompact's working state is "which files are changed, which tests exist and whether
they pass" plus what is established; docs/summaries.md lists the key state a summary must
not drop: file paths, failing commands, error signatures, test names. Here:

- key files: files the agent wrote since its last ``git commit`` (the uncommitted
  edits; a commit records the files before it), not the harness's own (Claude Code's plan
  files) nor scratch files (``/tmp/…``), files its still-failing commands run, and files it
  opened that those failures point at (traceback locations) or that the task names;
- failing commands: test, build and lint runs whose *latest* run failed (a failure fixed
  later is history), with the tests each reports failed; an exploring command that exits
  non-zero (a ``grep`` with no match) is not key state;
- error signatures: exception names in those latest failing outputs;
- key tests: tests a latest run reports failed, and tests the agent ran by name.

Files the agent only read are not key state: an exploration that read ten files is
summarized well by the two that matter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from judge.facts import (
    Op,
    classify,
    command_core,
    command_program,
    error_signatures_in,
    failed_tests_in,
    is_harness_file,
    is_temporary,
    located_paths_in,
    looks_failed,
    mentions_path,
    passed_tests_in,
    paths_in,
    same_path,
    test_names_in,
)
from schemas.rollout import MessageEvent, ToolCall


@dataclass(frozen=True)
class Step:
    """One tool call of the agent and its result."""

    message_id: str
    tool_call: ToolCall
    op: Op
    result: str | None
    result_id: str | None
    # The harness's own verdict on the result (Claude Code's ``is_error``), when it records
    # one for this rollout's results; None: judge by the result text.
    result_error: bool | None = None

    @property
    def failed(self) -> bool:
        if self.result is None:
            return False
        if self.result_error is not None:
            return self.result_error
        return looks_failed(self.result)


def steps_in(messages: Iterable[MessageEvent]) -> list[Step]:
    """Every tool call with its result. Where the harness flags failed results
    (``meta.is_error`` on any result), a result without the flag succeeded: its text may
    quote an error (a diff, a log) without the command failing."""
    messages = list(messages)
    results = {m.tool_call_id: m for m in messages if m.role == "tool"}
    flagged = any("is_error" in m.meta for m in results.values())
    steps = []
    for msg in messages:
        for call in msg.tool_calls:
            result = results.get(call.id)
            steps.append(
                Step(
                    msg.id,
                    call,
                    classify(call),
                    result.content if result else None,
                    result.id if result else None,
                    bool(result.meta.get("is_error")) if result and flagged else None,
                )
            )
    return steps


@dataclass
class WorkspaceState:
    written: list[str] = field(default_factory=list)
    key_files: list[str] = field(default_factory=list)
    failing_commands: dict[str, list[str]] = field(
        default_factory=dict
    )  # command -> tests it reports failed
    errors: list[str] = field(default_factory=list)
    key_tests: list[str] = field(default_factory=list)
    test_passed: dict[str, bool] = field(default_factory=dict)  # latest known status by test name
    verified_after_last_write: bool = False  # a test run passed after the last write
    unverified_writes: list[str] = field(default_factory=list)  # written after the last test run
    seen_paths: list[str] = field(default_factory=list)  # every path mentioned anywhere
    committed: list[str] = field(default_factory=list)  # written, then a commit, not since


def workspace_state(messages: Iterable[MessageEvent]) -> WorkspaceState:
    messages = list(messages)
    state = WorkspaceState()
    latest_run: dict[str, Step] = {}
    named_tests: list[str] = []
    writes_since_test: list[str] = []
    steps = steps_in(messages)
    uncommitted: list[str] = []
    for step in steps:
        op = step.op
        _add(state.written, op.written)
        _add(uncommitted, op.written)
        _add(writes_since_test, op.written)
        if _commits(step):
            uncommitted = []
        if op.kind == "test" and op.command:  # a failing grep or `git show` is not key state
            latest_run[_run_key(op)] = step
        if op.kind != "test" or step.result is None:
            continue
        writes_since_test = []
        named = test_names_in(op.command or step.tool_call.arguments)
        _add(named_tests, named)
        failed = failed_tests_in(step.result)
        for name in passed_tests_in(step.result):
            state.test_passed[name] = True
        for name in named:  # a run of named tests that failed without naming which: all of them
            state.test_passed[name] = name not in failed and not (step.failed and not failed)
        for name in failed:
            state.test_passed[name] = False
        state.verified_after_last_write = not step.failed
    if writes_since_test:
        state.verified_after_last_write = False
    state.unverified_writes = writes_since_test
    failing = [s for s in latest_run.values() if s.failed]
    state.failing_commands = {
        s.op.command or s.op.tool: failed_tests_in(s.result or "") for s in failing
    }
    for s in failing:
        _add(state.errors, error_signatures_in(s.result or ""))
    state.committed = [p for p in state.written if p not in uncommitted]
    state.key_files = [p for p in uncommitted if not is_harness_file(p) and not is_temporary(p)]
    _add(state.key_files, [p for s in failing for p in s.op.targets])
    opened = [p for s in steps if s.op.kind in ("read", "write") for p in s.op.targets]
    _add(
        state.key_files,
        [p for s in failing for p in located_paths_in(s.result or "") if mentions_path(opened, p)],
    )
    task = next((m.content for m in messages if m.role == "user"), "")
    _add(state.key_files, [p for p in paths_in(task) if mentions_path(opened, p)])
    state.key_tests = [t for t, ok in state.test_passed.items() if not ok]
    _add(state.key_tests, named_tests)
    for msg in messages:
        _add(state.seen_paths, paths_in(msg.content))
        for call in msg.tool_calls:
            _add(state.seen_paths, paths_in(call.arguments))
    return state


_GIT_COMMIT_RE = re.compile(r"\bgit\s+(?:-C\s+\S+\s+|-c\s+\S+\s+)*commit\b")


def _commits(step: Step) -> bool:
    """A ``git commit`` that ran and did not fail: the files written before it are in
    the commit (an approximation: ``git commit`` without ``-a`` commits what was staged,
    and agents stage what they wrote)."""
    return bool(
        step.op.command
        and _GIT_COMMIT_RE.search(step.op.command)
        and step.result is not None
        and not step.failed
    )


def _run_key(op: Op) -> str:
    """Runs of one command: a test run is its runner and what it runs (``pytest -v`` and
    ``pytest`` are one run: a later passing ``pytest`` resolves a failing ``pytest -v``)."""
    command = op.command or op.tool  # a test tool that is not a shell has no command line
    if op.kind == "test":
        return " ".join(
            [command_program(command), *sorted(op.targets), *sorted(test_names_in(command))]
        )
    return command_core(command)


def _add(into: list[str], items: Iterable[str]) -> None:
    """Append new items, keeping first-seen order; paths that name one file count once."""
    for item in items:
        if not any(item == have or ("/" in item + have and same_path(item, have)) for have in into):
            into.append(item)
