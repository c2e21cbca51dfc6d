"""Side trips: the plausible detours that make up much of a real agent's trajectory.

Usages of the symbol, neighbouring modules, project files, history, other test files,
the full suite (sometimes verbose), a whole large module dumped with ``cat``. They pad
a plan to its target length, give compaction something stale to drop, and produce the
occasional large observation that makes CompactionRL keep fewer than k steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.simulate import outputs
from pipeline.simulate.actions import run_tests
from pipeline.simulate.state import Step, ToolUse

if TYPE_CHECKING:
    from pipeline.simulate.agent import Agent


def wander(a: Agent) -> Step:
    """A plausible side trip (usages, neighbouring modules, project files, history); an
    exact repeat of an earlier side trip is redrawn a few times, as agents mostly avoid them."""
    for _ in range(4):
        step = a.rng.choice(_SIDE_TRIPS)(a)
        key = (step.uses[0].name, str(step.uses[0].args))
        if key not in a.side_trips:
            break
    a.side_trips.add(key)
    return step


def _read(
    a: Agent, path: str, say: str, action: str, start: int = 1, end: int | None = None
) -> Step:
    lines = a.lines(path)
    end = min(len(lines), end or len(lines))
    start = max(1, min(start, end))
    return Step(
        "wander",
        say,
        "",
        [
            ToolUse(
                "read_file",
                {"path": path, "start_line": start, "end_line": end},
                outputs.cat_n(lines, start, end),
            )
        ],
        action=action,
    )


def _grep_usage(a: Agent) -> Step:
    t = a.task
    where = a.rng.choice([".", "src", "tests"])
    hits = [(t.module_path, t.func_line, a.lines(t.module_path)[t.func_line - 1])] + t.callers
    hits += [
        (t.test_path, i, line) for i, line in enumerate(a.lines(t.test_path), 1) if t.symbol in line
    ]
    hits = sorted(h for h in hits if where == "." or h[0].startswith(where))
    return Step(
        "wander",
        f"Checking where `{t.symbol}` is used.",
        "",
        [ToolUse("grep", {"pattern": t.symbol, "path": where}, outputs.grep_output(hits))],
        action=f"Grepped usages of `{t.symbol}` in {'the repository' if where == '.' else where + '/'}.",
    )


def _read_other(a: Agent) -> Step:
    t = a.task
    path = a.rng.choice([p for p in t.tree if p.startswith("src/") and p != t.module_path])
    start = a.rng.choice([1, 1, a.rng.randint(10, 60)])
    return _read(
        a,
        path,
        f"Let me look at {path} for context.",
        f"Read {path} (not related).",
        start,
        start + a.rng.randint(40, 90),
    )


def _read_caller(a: Agent) -> Step:
    t = a.task
    if not t.callers:
        return _read_other(a)
    path, line, _ = a.rng.choice(t.callers)
    return _read(
        a,
        path,
        f"Let me see how {path} calls `{t.symbol}`.",
        f"Read the caller in {path}.",
        line - 15,
        line + 25,
    )


def _read_project(a: Agent) -> Step:
    path = a.rng.choice(
        [p for p in a.task.tree if not p.endswith(".py") or p.endswith("conftest.py")]
    )
    return _read(a, path, f"Checking {path}.", f"Read {path}.")


def _read_module_elsewhere(a: Agent) -> Step:
    t = a.task
    n = len(a.lines(t.module_path))
    start = a.rng.choice([1, max(1, n - 40), a.rng.randint(1, max(1, n - 20))])
    return _read(
        a,
        t.module_path,
        f"Let me read more of {t.module_path}.",
        f"Read other parts of {t.module_path}.",
        start,
        start + a.rng.randint(30, 60),
    )


def _git_log(a: Agent) -> Step:
    path = a.rng.choice([a.task.module_path, a.task.test_path, "."])
    log = "\n".join(f"{a.rng.getrandbits(28):07x} {m}" for m in a.rng.sample(_COMMITS, 5))
    return Step(
        "wander",
        "Checking recent history.",
        "",
        [ToolUse("bash", {"command": f"git log --oneline -5 -- {path}"}, log)],
        action=f"Checked `git log` of {'the repository' if path == '.' else path}.",
    )


def _grep_marker(a: Agent) -> Step:
    marker = a.rng.choice(["TODO", "FIXME", "deprecated", "warnings.warn"])
    where = a.rng.choice(["src", "."])
    pool = [p for p in a.task.tree if p.endswith(".py") and (where == "." or p.startswith(where))]
    hits = sorted(
        (a.rng.choice(pool), a.rng.randint(2, 90), f"    # {marker}: revisit this")
        for _ in range(a.rng.randint(0, 3))
    )
    return Step(
        "wander",
        f"Searching for `{marker}` markers.",
        "",
        [ToolUse("grep", {"pattern": marker, "path": where}, outputs.grep_output(hits))],
        action=f"Grepped `{marker}`.",
    )


def _python_check(a: Agent) -> Step:
    t = a.task
    cmd = f'python -c "import {t.repo.name}, sys; print({t.repo.name}.__version__, sys.version.split()[0])"'
    return Step(
        "wander",
        "Confirming the installed version.",
        "",
        [ToolUse("bash", {"command": cmd}, f"{t.version} 3.11.9")],
        action=f"Confirmed {t.repo.name} {t.version} on Python 3.11.9.",
    )


def _run_other_tests(a: Agent) -> Step:
    t = a.task
    path = a.rng.choice([p for p in t.tree if p.startswith("tests/test_") and p != t.test_path])
    names = a.other_tests(path)
    result = outputs.pytest_report([(path, names)], [], a.rng.uniform(0.05, 0.9))
    return Step(
        "wander",
        f"Running {path} to see that the rest is green.",
        "",
        [ToolUse("bash", {"command": f"python -m pytest {path}"}, result)],
        action=f"Ran {path}: all passed.",
    )


def _run_verbose(a: Agent) -> Step:
    """``pytest -v`` over the whole suite: one line per test, the big outputs agents do meet."""
    t = a.task
    files = sorted(
        [(t.test_path, a.test_names())]
        + [
            (p, a.other_tests(p))
            for p in t.tree
            if p.startswith("tests/test_") and p != t.test_path
        ]
    )
    total = sum(len(n) for _, n in files)
    failure = a.failure_now()
    lines, done = (
        [
            outputs.PYTEST_BANNER.rstrip("\n").replace(
                "configfile", "cachedir: .pytest_cache\nconfigfile"
            ),
            f"collecting ... collected {total} items",
            "",
        ],
        0,
    )
    for path, names in files:
        for name in names:
            done += 1
            failed = failure is not None and path == t.test_path and name == t.failing_test
            lines.append(
                f"{path}::{name} {'FAILED' if failed else 'PASSED'}".ljust(72)
                + f"[{100 * done // total:>3}%]"
            )
    tally = f"1 failed, {total - 1} passed" if failure is not None else f"{total} passed"
    lines += ["", f"{'=' * 20} {tally} in {a.rng.uniform(1.0, 4.0):.2f}s {'=' * 20}"]
    return Step(
        "wander",
        "Running the whole suite verbosely to see what is covered.",
        "",
        [ToolUse("bash", {"command": "python -m pytest -v"}, "\n".join(lines))],
        action="Ran `python -m pytest -v` over the whole suite.",
    )


def _cat_module(a: Agent) -> Step:
    """The whole module with ``cat``: a large observation without line numbers."""
    pool = [p for p in a.task.tree if p.startswith("src/") and not p.endswith("__init__.py")]
    path = a.rng.choice([p for p in pool if p.endswith("_compat.py")] * len(pool) + pool)
    return Step(
        "wander",
        f"Dumping {path} in full.",
        "",
        [ToolUse("bash", {"command": f"cat {path}"}, "\n".join(a.lines(path)))],
        action=f"Printed all of {path}.",
    )


def _run_all(a: Agent) -> Step:
    step = run_tests(a, "all")
    step.intent = "wander"
    return step


_SIDE_TRIPS = (
    _grep_usage,
    _read_other,
    _read_caller,
    _read_project,
    _read_module_elsewhere,
    _git_log,
    _grep_marker,
    _python_check,
    _run_other_tests,
    _read_other,
    _read_module_elsewhere,
    _run_all,
    _run_verbose,
    _cat_module,
)


_COMMITS = (
    "Fix typo in docstring",
    "Bump version",
    "Add py3.12 to CI matrix",
    "Refactor helpers into _compat",
    "Speed up parsing of large inputs",
    "Document public API",
    "Drop Python 3.8",
    "Add type hints",
    "Merge pull request #311 from contributor/patch-1",
    "Handle empty input gracefully",
)
