"""Facts read from agent text with plain regular expressions: file paths, test names,
error signatures, failure markers, and what a tool call does.

The rule judge and the summary audit stand on these. docs/summaries.md warns that checks
which only grep are "a floor, not a ceiling": every fact here is a regex match, so
each finding can be traced back to the characters that produced it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

import orjson

from schemas.rollout import ToolCall

_EXTENSIONS = (
    "py|pyi|pyx|ipynb|js|jsx|mjs|cjs|ts|tsx|go|rs|java|kt|scala|c|h|cc|cpp|cxx|hpp|cs|rb|php|swift|"
    "sh|bash|sql|json|jsonl|yaml|yml|toml|cfg|ini|conf|md|rst|txt|html|css|scss|xml|lock|proto|csv"
)
_URL_RE = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
# A path ends with a known extension and is not glued to a longer word or path.
# Directories and file names may start with a dot (``.github/``, ``.claude/``, ``.worktrees/``,
# ``.eslintrc.json``); a dot glued to a word before it is part of that word, not a path.
# A name that goes on with another dot-word (``root.html.heex``, ``HOOK.md.tmpl``) has an
# extension this list does not know: it is not cut short to a path it does not name.
_PATH_RE = re.compile(
    rf"(?<![\w/.@-])((?:\.{{1,2}}/|~/|/)?(?:\.?[\w@+-][\w.@+-]*/)*\.?[\w+-][\w.+-]*\.(?:{_EXTENSIONS}))(?![\w/]|\.\w)"
)
# What comes right before the ``/`` of a template's tail (``<session-id>/prompt.txt``,
# ``${DIR}/x.json``, ``*/x.go``): the path is a pattern, not a file anyone saw.
_TEMPLATE_BEFORE = (">", "}", "*", "]")
# A location in a directory (``src/x.py:33``, ``./cmd/x.go:12:3``) or a Python traceback
# frame; a bare ``hooks_test.go:196:`` is a test log line, not where a failure lives.
_LOCATION_RE = re.compile(r'([\w.~-]*/[\w./~-]+):\d+\b|File "([^"]+)", line \d+')
_NODEID_RE = re.compile(r"[\w/.-]+\.py::([\w.\[\]-]+(?:::[\w.\[\]-]+)*)")
_TEST_FN_RE = re.compile(r"\b(test_\w+)\b(?!\.\w|[\w/])")  # not a file or module named test_x
_ERROR_RE = re.compile(r"\b([A-Z]\w*(?:Error|Exception))\b")
_ERROR_LINE_RE = re.compile(
    r"^(?:E\s+.*|FAILED .* - .*|[\w.]*(?:Error|Exception)\b.*|.*:\d+: \w+(?:Error|Exception))$",
    re.M,
)
# Lines a test runner prints for a failed test: pytest (FAILED/ERROR nodeid), unittest (FAIL: name).
_FAILED_TEST_LINE_RE = re.compile(r"^(?:FAILED|ERROR|FAIL:|ERROR:)\s+(\S+)", re.M)
_PASSED_NODE_RE = re.compile(r"\S+\.py::([\w.\[\]:-]+)\s+PASSED")
_PASSED_UNITTEST_RE = re.compile(r"^(test_\w+) \(.*\) \.\.\. ok$", re.M)
# What a failed run prints. An exception name counts only where a line states it as raised
# (``KeyError: 'x'`` at the start of a line): output that merely *shows* one — a ``git diff``
# of code defining ``ShadowBranchConflictError``, a file listing — is not a failure.
_FAILURE_RE = re.compile(
    r"Traceback \(most recent call last\)|^(?:FAILED|ERROR|FAIL|--- FAIL)\b"
    r"|\b[1-9]\d* (?:failed|errors?)\b"
    r"|^[\w.]*(?:Error|Exception)\b(?::|$)|exit (?:code|status):? *[1-9]|returncode[=:] *[1-9]"
    r"|command not found|No such file or directory|^panic:",
    re.M,
)

OpKind = Literal["read", "search", "write", "test", "run", "compact", "submit", "other"]

_SUBMIT_TOOLS = {"submit", "finish", "task_complete", "done", "attempt_completion", "final_answer"}
_SHELL_TOOLS = ("bash", "shell", "terminal", "execute", "exec", "run", "cmd", "command")
_EDITOR_READ = {"view", "read"}
_EDITOR_WRITE = {"create", "str_replace", "insert", "undo_edit", "write", "edit", "append"}
_PATH_KEYS = (
    "path",
    "file",
    "file_path",
    "filepath",
    "filename",
    "target_file",
    "dir",
    "directory",
)
# Runs that verify the code ("test" ops): test runners, compilers and linters, and task
# runners running such a task (``mise run test``, ``just lint``, ``npm run test:unit``).
_TEST_RUNNERS = re.compile(
    r"\b(?:pytest|py\.test|unittest|tox|nox|go test|cargo test|jest|mocha|vitest|rspec|phpunit"
    r"|ctest|mvn test|gradle test|go (?:build|vet)|cargo (?:build|check|clippy)|golangci-lint"
    r"|ruff check|mypy|eslint|tsc"
    r"|(?:npm|yarn|pnpm|bun|mise|just|task|make|rake|hatch|poetry|uv)(?: run)?"
    r" (?:test|check|lint|build)[\w:-]*)\b"
)
_READERS = {"cat", "head", "tail", "less", "more", "nl", "bat", "view"}
_SEARCHERS = {
    "grep",
    "rg",
    "ag",
    "ack",
    "find",
    "ls",
    "tree",
    "fd",
    "locate",
    "git grep",
    "git ls-files",
}
_WRITE_SHELL = re.compile(
    r"\bsed\s+-i|\btee\b|\bgit apply\b|\bpatch\b|(?<![0-9&])>>?\s*(?!/dev/null|&)[\w./~-]"
)


# Texts already scanned for paths, while one rollout is judged (``paths_memo``).
_PATHS_MEMO: ContextVar[dict[str, tuple[str, ...]] | None] = ContextVar("paths_memo", default=None)


@contextmanager
def paths_memo() -> Iterator[None]:
    """Within the block, ``paths_in`` scans each distinct text once. Judging a rollout
    rebuilds the workspace state of every compaction's history and prior, which repeat
    the same messages (69,068 calls on the embedded sample: its audit and SFT filters took
    6.7 and 7.4 s of CPU, 4.8 and 5.6 s with the memo, two interleaved pairs). The memo
    holds only texts of the rollout being judged, in memory anyway, and ends with the block."""
    token = _PATHS_MEMO.set({})
    try:
        yield
    finally:
        _PATHS_MEMO.reset(token)


def paths_in(text: str) -> list[str]:
    """File paths in ``text`` in order of first appearance (URLs are not paths; nor is the
    tail of a templated path such as ``.entire/<session-id>/prompt.txt``)."""
    memo = _PATHS_MEMO.get()
    if memo is None:
        return _scan_paths(text)
    found = memo.get(text)
    if found is None:
        found = memo[text] = tuple(_scan_paths(text))
    return list(found)  # a list of its own: callers extend what they are given


def _scan_paths(text: str) -> list[str]:
    text = _URL_RE.sub(" ", text)
    found = (
        m.group(1)
        for m in _PATH_RE.finditer(text)
        if not (m.group(1).startswith("/") and text[m.start() - 1 : m.start()] in _TEMPLATE_BEFORE)
    )
    return list(dict.fromkeys(normalize_path(m) for m in found))


def normalize_path(path: str) -> str:
    return path[2:] if path.startswith("./") else path


def located_paths_in(text: str) -> list[str]:
    """Paths given with a line number (``src/x.py:33``, ``File "src/x.py", line 33``):
    where a traceback points, not a config file a tool's banner names."""
    return paths_in(" ".join(a or b for a, b in _LOCATION_RE.findall(text)))


def same_path(a: str, b: str) -> bool:
    """Two mentions name the same file when one is the other or a ``/``-suffix of it
    (``/repo/src/x.py``, ``src/x.py`` and ``x.py`` all name one file)."""
    a, b = normalize_path(a), normalize_path(b)
    if a == b or a.endswith("/" + b) or b.endswith("/" + a):
        return True
    # Summaries write repository paths with a leading slash (``/cmd/x/a_test.go`` for
    # ``/home/u/repo/cmd/x/a_test.go``): such a path may be the tail of the other.
    short, long = sorted((a, b), key=len)
    return short.startswith("/") and short.count("/") > 1 and long.endswith(short)


def mentions_path(text_paths: list[str], path: str) -> bool:
    return any(same_path(p, path) for p in text_paths)


def abbreviates(short: str, path: str) -> bool:
    """A bare file name that shortens a path's name to its last words: summaries write
    ``condensation.go`` for ``strategy/manual_commit_condensation.go``."""
    name = path.rsplit("/", 1)[-1]
    return "/" not in short and (name.endswith("_" + short) or name.endswith("-" + short))


_HARNESS_FILE_RE = re.compile(r"(?:^|/)\.claude/(?:plans|todos|projects|shell-snapshots|statsig)/")


_TEMPORARY_RE = re.compile(
    r"^(?:/tmp/|/private/tmp/|/var/tmp/|/var/folders/|/private/var/folders/|/dev/shm/)"
    r"|(?:^|/)(?:tmp|temp)/"
)


def is_temporary(path: str) -> bool:
    """A scratch file outside the work (``/tmp/check.go``, a ``tmp/`` dir, macOS's
    ``/var/folders/…``): agents write them to try something, summaries rightly skip them."""
    return bool(_TEMPORARY_RE.search(path))


def names_file(text: str, path: str) -> bool:
    """``text`` names the file by its base name as a word of its own (``annotation.ex``,
    whose extension ``paths_in`` does not know; not ``annotation.exs``)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return (
        bool(name) and re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", text) is not None
    )


def is_harness_file(path: str) -> bool:
    """A file the agent harness keeps for itself (Claude Code's plans and todos under
    ``~/.claude/``), not one of the workspace the task is about (a project's own
    ``.claude/settings.json`` is)."""
    return bool(_HARNESS_FILE_RE.search(path))


def test_names_in(text: str) -> list[str]:
    """Test function names (``test_x``; a pytest node id counts as its last part)."""
    names = [_bare_test_name(m) for m in _NODEID_RE.findall(text)]
    names += _TEST_FN_RE.findall(text)
    return list(dict.fromkeys(n for n in names if n))


def _bare_test_name(node: str) -> str:
    return node.split("::")[-1].split("[")[0]


def failed_tests_in(output: str) -> list[str]:
    """Tests a runner reports as failed in ``output``."""
    names = []
    for token in _FAILED_TEST_LINE_RE.findall(output):
        names += test_names_in(token) or [_bare_test_name(token)]
    return list(dict.fromkeys(n for n in names if n.startswith(("test", "Test"))))


def passed_tests_in(output: str) -> list[str]:
    """Tests a runner reports by name as passed (pytest ``-v``, unittest ``-v``)."""
    names = [_bare_test_name(m) for m in _PASSED_NODE_RE.findall(output)]
    names += _PASSED_UNITTEST_RE.findall(output)
    return list(dict.fromkeys(names))


def error_signatures_in(text: str) -> list[str]:
    """Exception names a failure reports: from the lines that state the error (pytest's
    ``E   KeyError``, its ``FAILED ... - KeyError`` summary, a traceback's last line), else
    any exception name in the text (test code quoted in a traceback names others)."""
    stated = [m for line in _ERROR_LINE_RE.findall(text) for m in _ERROR_RE.findall(line)]
    return list(dict.fromkeys(stated or _ERROR_RE.findall(text)))


def looks_failed(output: str) -> bool:
    """A tool result that reports a failure: a traceback, failed tests, an exception, a
    non-zero exit status, or a missing command or file."""
    return bool(_FAILURE_RE.search(output))


@dataclass(frozen=True)
class Op:
    """What one tool call does, as far as its name and arguments tell."""

    kind: OpKind
    tool: str
    targets: tuple[str, ...]  # file paths the call reads, writes or runs
    written: tuple[str, ...]  # the subset it writes
    command: str | None  # the shell command, for shell tools
    signature: str  # tool name + canonical arguments: equal signatures = same request


def parse_arguments(call: ToolCall) -> dict | None:
    """The call's arguments as a JSON object, or None when the model wrote something else."""
    try:
        args = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return None
    return args if isinstance(args, dict) else None


def classify(call: ToolCall) -> Op:
    args = parse_arguments(call) or {}
    name = call.name.lower()
    signature = call.name + " " + orjson.dumps(args, option=orjson.OPT_SORT_KEYS).decode()
    paths = [normalize_path(v) for k in _PATH_KEYS if isinstance(v := args.get(k), str) and v]
    editor_cmd = args.get("command") if isinstance(args.get("command"), str) else None
    if "compact" in name or name in ("summarize", "condense"):
        return Op("compact", call.name, (), (), None, signature)
    if name in _SUBMIT_TOOLS:
        return Op("submit", call.name, tuple(paths), (), None, signature)
    if paths and editor_cmd in _EDITOR_READ | _EDITOR_WRITE:  # str_replace_editor style
        kind: OpKind = "read" if editor_cmd in _EDITOR_READ else "write"
        return Op(
            kind, call.name, tuple(paths), tuple(paths) if kind == "write" else (), None, signature
        )
    command = next(
        (v for k in ("command", "cmd", "script", "code") if isinstance(v := args.get(k), str)), None
    )
    if command is not None and any(s in name for s in _SHELL_TOOLS):
        return _classify_shell(call.name, command, signature)
    words_of_kind: tuple[tuple[OpKind, tuple[str, ...]], ...] = (
        ("write", ("write", "edit", "patch", "replace", "create", "insert", "apply")),
        ("read", ("read", "view", "open", "cat", "get_file")),
        ("search", ("grep", "search", "find", "glob", "list", "ls")),
        ("test", ("test",)),
    )
    for kind, words in words_of_kind:
        if any(w in name for w in words):
            return Op(
                kind,
                call.name,
                tuple(paths),
                tuple(paths) if kind == "write" else (),
                None,
                signature,
            )
    return Op("other", call.name, tuple(paths), (), None, signature)


def _classify_shell(tool: str, command: str, signature: str) -> Op:
    parts = [p.strip() for p in re.split(r"&&|\|\||;|\n", command) if p.strip()]
    targets = tuple(paths_in(command))
    written = tuple(p for part in parts if _WRITE_SHELL.search(part) for p in paths_in(part))
    if _TEST_RUNNERS.search(command):
        kind: OpKind = "test"
    elif written:
        kind = "write"
    else:
        programs = [_program(p) for p in parts]
        programs = [p for p in programs if p != "cd"]
        if programs and (programs[0] in _READERS or programs[0] == "sed"):  # sed without -i prints
            kind = "read"
        elif programs and programs[0] in _SEARCHERS:
            kind = "search"
        else:
            kind = "run"
    return Op(kind, tool, targets, written, command.strip(), signature)


def _program(part: str) -> str:
    """The program a shell command part runs (``git grep`` is one program; so is
    ``python -m pytest``, which runs ``pytest``)."""
    try:
        words = shlex.split(part)
    except ValueError:
        words = part.split()
    if not words:
        return ""
    if words[0] == "git" and len(words) > 1:
        return f"git {words[1]}"
    if words[0].startswith("python") and len(words) > 2 and words[1] == "-m":
        return words[2]
    return words[0]


def command_core(command: str) -> str:
    """The command without ``cd DIR &&`` prefixes: what a summary would quote."""
    parts = [p.strip() for p in re.split(r"&&|;|\n", command) if p.strip()]
    kept = [p for p in parts if _program(p) != "cd"]
    return " && ".join(kept) if kept else command.strip()


def command_program(command: str) -> str:
    return _program(command_core(command).split("&&")[0])
