"""What the tools print: ``cat -n`` views, grep hits, pytest sessions, tracebacks, diffs.

The formats copy the real tools closely (pytest's banner, progress line, FAILURES
section with ``>``/``E`` lines and the short summary; SWE-agent's ``str_replace``
messages; unified diffs), because the judge and the summary audit look for exactly
these signatures — a test id, an ``E   SomeError: ...`` line, a ``path:line:`` hit.
"""

from __future__ import annotations

import random

from pipeline.simulate.bugs import Failure

PYTEST_BANNER = (
    "============================= test session starts ==============================\n"
    "platform linux -- Python 3.11.9, pytest-8.2.2, pluggy-1.5.0\nrootdir: /repo\n"
    "configfile: pyproject.toml\n"
)


def cat_n(lines: list[str], start: int, end: int) -> str:
    """Lines ``start..end`` (1-based, inclusive) numbered like ``cat -n``."""
    start = max(1, start)
    end = min(len(lines), end)
    return "\n".join(f"{i:>6}\t{lines[i - 1]}" for i in range(start, end + 1))


def grep_output(hits: list[tuple[str, int, str]]) -> str:
    return "\n".join(f"{path}:{line}:{text}" for path, line, text in hits) if hits else ""


def _rule(title: str, char: str = "_") -> str:
    width = 80
    inner = f" {title} "
    left = (width - len(inner)) // 2
    return char * left + inner + char * (width - left - len(inner))


def failure_block(
    test_name: str,
    test_path: str,
    test_lines: list[str],
    test_def_line: int,
    failure: Failure,
    module_path: str,
    module_lines: list[str],
    func_def_line: int,
) -> str:
    """pytest's FAILURES entry for one test: the test frame, and the source frame when it raised there."""
    body = _function_lines(test_lines, test_def_line)
    mark = len(body) - 1
    first = [f"    {line}" if i != mark else f">   {line}" for i, line in enumerate(body)]
    out = [_rule(test_name), ""]
    if not failure.in_source:
        out += first + [f"E       {failure.error}"] + [f"E       {d}" for d in failure.detail]
        out += ["", f"{test_path}:{test_def_line + mark}: {failure.error.split(':')[0]}"]
        return "\n".join(out)
    out += first + ["", f"{test_path}:{test_def_line + mark}: ", "_ " * 39 + "_", ""]
    if failure.frame_locals:
        out += [failure.frame_locals, ""]
    src = _function_lines(module_lines, func_def_line)
    raise_at = next((i for i, line in enumerate(src) if line == failure.at), len(src) - 1)
    out += [
        f"    {line}" if i != raise_at else f">   {line}"
        for i, line in enumerate(src[: raise_at + 1])
    ]
    out += [f"E       {failure.error}"] + [f"E       {d}" for d in failure.detail]
    out += ["", f"{module_path}:{func_def_line + raise_at}: {failure.error.split(':')[0]}"]
    return "\n".join(out)


def _function_lines(lines: list[str], def_line: int) -> list[str]:
    """The definition starting at ``def_line`` up to the next blank-line gap."""
    out: list[str] = []
    for line in lines[def_line - 1 :]:
        if out and not line.strip() and (not out[-1].strip()):
            break
        if out and line and not line.startswith((" ", "\t")) and not line.startswith(")"):
            break
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return out


def pytest_report(
    files: list[tuple[str, list[str]]], failures: list[tuple[str, str, str, str]], duration: float
) -> str:
    """A whole pytest session. files: (path, test names) in run order;
    failures: (path, test name, FAILURES block, one-line error)."""
    failed = {(p, n) for p, n, _, _ in failures}
    total = sum(len(t) for _, t in files)
    out = [PYTEST_BANNER + f"collected {total} item{'s' if total != 1 else ''}", ""]
    done = 0
    for path, tests in files:
        done += len(tests)
        marks = "".join("F" if (path, t) in failed else "." for t in tests)
        pct = f"[{100 * done // max(total, 1):>3}%]"
        out.append(f"{path} {marks}".ljust(80 - len(pct)) + pct)
    out.append("")
    if failures:
        out.append(_rule("FAILURES", "="))
        out += [block for _, _, block, _ in failures]
        out.append(_rule("short test summary info", "="))
        out += [f"FAILED {p}::{n} - {err}" for p, n, _, err in failures]
    n_failed = len(failures)
    tally = (
        f"{n_failed} failed, {total - n_failed} passed" if n_failed else f"{total} passed"
    ) + f" in {duration:.2f}s"
    out.append(_rule(tally, "="))
    return "\n".join(out)


def edit_result(path: str, lines: list[str], line: int) -> str:
    snippet = cat_n(lines, line - 4, line + 5)
    return (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n"
        f"{snippet}\nReview the changes and make sure they are as expected. Edit the file again if necessary."
    )


def edit_failed(path: str, old: str) -> str:
    return f"No replacement was performed, old_str `{old}` did not appear verbatim in {path}."


def unified_diff(path: str, before: list[str], after: list[str]) -> str:
    """A one-hunk ``git diff`` of ``path`` (context: 3 lines)."""
    first = next(
        (i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after))
    )
    tail = 0
    while (
        tail < min(len(before), len(after)) - first
        and before[len(before) - 1 - tail] == after[len(after) - 1 - tail]
    ):
        tail += 1
    lo = max(0, first - 3)
    old_hi, new_hi = len(before) - tail, len(after) - tail
    old_end, new_end = min(len(before), old_hi + 3), min(len(after), new_hi + 3)
    body = [f" {x}" for x in before[lo:first]] + [f"-{x}" for x in before[first:old_hi]]
    body += [f"+{x}" for x in after[first:new_hi]] + [f" {x}" for x in before[old_hi:old_end]]
    h = random.Random(path).getrandbits(28)
    return "\n".join(
        [
            f"diff --git a/{path} b/{path}",
            f"index {h:07x}..{h ^ 0x5A5A5A5:07x} 100644",
            f"--- a/{path}",
            f"+++ b/{path}",
            f"@@ -{lo + 1},{old_end - lo} +{lo + 1},{new_end - lo} @@",
            *body,
        ]
    )
