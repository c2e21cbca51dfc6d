"""A simulated SWE task: a repository, one bug, the issue that reports it, and its tests.

A task is fully determined by its own random generator, so every rollout of a group
(same ``task_id``) sees the same repository, file contents, line numbers and failing
test. Files other than the buggy module and its test file are generated on first read
from a generator keyed by their path, which keeps them identical across the group too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pipeline.simulate.bugs import BUGS, BugTemplate, Failure, fill
from pipeline.simulate.repos import REPOS, RepoSpec, filler_blocks, module_header, repo_tree

_FILLER_TESTS = {
    "is_valid_{noun}": '    assert is_valid_{noun}("x")\n    assert not is_valid_{noun}("   ")',
    "_normalize_{noun}": '    assert _normalize_{noun}(b"  A  b ") == "a b"',
    "{Noun}Error": '    err = {Noun}Error("bad", {noun}="x")\n    assert err.{noun} == "x"',
    "iter_{noun}s": '    assert list(iter_{noun}s(["a\\n", "\\n", "b"])) == [(1, "a"), (3, "b")]',
    "format_{noun}": '    assert format_{noun}("ab", width=4) == "ab  "',
    "{Noun}Registry": '    reg = {Noun}Registry(strict=True)\n    reg.register("a", 1)\n    with pytest.raises(KeyError):\n'
    '        reg.register("a", 2)',
    "merge_{noun}s": '    assert merge_{noun}s({{"a": 1}}, {{"a": 2, "b": 3}}) == {{"a": 2, "b": 3}}',
    "count_{noun}s": "    assert count_{noun}s([1, 2, 3], lambda x: x > 1) == 2",
    "{Noun}Spec": '    spec = {Noun}Spec("a", aliases=("b",))\n    assert spec.matches("b")\n    assert not spec.matches("c")',
    "split_{noun}": '    assert split_{noun}("a = 1") == ("a", "1")\n    assert split_{noun}("no separator") is None',
    "load_{noun}s": '    path = tmp_path / "items.txt"\n    path.write_text("a\\n# comment\\nb  # trailing\\n")\n'
    '    assert load_{noun}s(path) == ["a", "b"]',
    "sort_{noun}s": '    assert sort_{noun}s(["b", "a"]) == ["b", "a"]',
    "{Noun}Set": '    items = {Noun}Set(["a", "b", "a"])\n    assert list(items) == ["a", "b"]\n    assert len(items) == 2',
}


@dataclass
class CodingTask:
    """A simulated coding task: a repository, an issue and the test that shows it."""

    task_id: str
    seed: str
    repo: RepoSpec
    names: dict[str, str]
    bug: BugTemplate
    module_path: str
    test_path: str
    func: str  # e.g. "chunk_rows" or "HeaderMap.get"
    symbol: str  # what one greps for, e.g. "HeaderMap"
    issue_number: int
    version: str
    tree: list[str]
    files: dict[str, list[str]]
    test_names: list[str]
    callers: list[tuple[str, int, str]]
    _extra: dict[str, list[str]] = field(default_factory=dict)

    def text(self, template: str) -> str:
        return fill(template, self.names)

    # -- facts the agent discovers ------------------------------------------------------
    @property
    def failing_test(self) -> str:
        return self.text(self.bug.test_name)

    @property
    def failing_test_id(self) -> str:
        return f"{self.test_path}::{self.failing_test}"

    @property
    def test_command(self) -> str:
        return f"python -m pytest {self.failing_test_id}"

    def failure(self, wrong: bool = False) -> Failure:
        f = self.bug.wrong_failure if wrong else self.bug.failure
        return Failure(
            self.text(f.error),
            tuple(self.text(d) for d in f.detail),
            f.in_source,
            self.text(f.frame_locals),
            self.text(f.at or self.bug.bad_line),
        )

    @property
    def error(self) -> str:
        return self.failure().error

    @property
    def cause(self) -> str:
        return self.text(self.bug.cause)

    def line_of(self, path: str, needle: str) -> int:
        """1-based line number of the first line of ``needle`` in the original file."""
        lines = self.file(path)
        first = needle.split("\n")[0]
        for i, line in enumerate(lines, start=1):
            if line == first:
                return i
        return 1

    @property
    def func_line(self) -> int:
        head = self.text(self.bug.code).split("\n")[0]
        return self.line_of(self.module_path, head)

    @property
    def bad_line_no(self) -> int:
        return self.line_of(self.module_path, self.text(self.bug.bad_line))

    def file(self, path: str) -> list[str]:
        """Contents of ``path`` (generated on first use for files nobody edits)."""
        if path in self.files:
            return self.files[path]
        if path not in self._extra:
            self._extra[path] = _other_file(self, path)
        return self._extra[path]

    @property
    def issue(self) -> str:
        title = self.text(self.bug.issue_title)
        body = self.text(self.bug.issue_body)
        return f"{title} (#{self.issue_number})\n\n{body}\n\nSeen with {self.repo.name} {self.version} on Python 3.11."


def make_task(seed: str, index: int) -> CodingTask:
    """The ``index``-th task of a simulation run seeded with ``seed``. Its id is
    SWE-bench-like (``org__repo-ISSUE``) plus seed and index, so ids never collide
    within a run or across runs with different seeds."""
    task_seed = f"{seed}:task:{index}"
    rng = random.Random(task_seed)
    repo = rng.choice(REPOS)
    bug = rng.choice(BUGS)
    mod = rng.choice(repo.modules)
    noun = rng.choice(repo.nouns)
    names = {
        "noun": noun,
        "Noun": noun.capitalize(),
        "a_noun": ("an " if noun[0] in "aeiou" else "a ") + noun,
        "pkg": repo.name,
        "mod": mod,
    }
    func = fill(bug.func, names)
    number = rng.randint(120, 4800)
    module_path = f"src/{repo.name}/{mod}.py"
    test_path = f"tests/test_{mod}.py"
    module_lines, helpers = _module_lines(repo, mod, noun, bug, names, rng)
    test_lines, test_names = _test_lines(repo, mod, bug, names, helpers, rng)
    tree = repo_tree(repo, rng)
    callers = _callers(repo, mod, func.split(".")[0], rng)
    return CodingTask(
        task_id=f"{repo.org}__{repo.name}-{number}.{seed}.{index}",
        seed=task_seed,
        repo=repo,
        names=names,
        bug=bug,
        module_path=module_path,
        test_path=test_path,
        func=func,
        symbol=func.split(".")[0],
        issue_number=number,
        version=f"{rng.randint(0, 3)}.{rng.randint(1, 19)}.{rng.randint(0, 9)}",
        tree=tree,
        files={module_path: module_lines, test_path: test_lines},
        test_names=test_names,
        callers=callers,
    )


def _module_lines(
    repo: RepoSpec, mod: str, noun: str, bug: BugTemplate, names: dict, rng: random.Random
) -> tuple[list[str], list[str]]:
    """The buggy module's lines, and the templates of the helpers it defines (for its tests)."""
    fillers = filler_blocks(noun, rng, rng.randint(5, 9))
    blocks = [lines for _, _, lines in fillers]
    blocks.insert(rng.randint(1, len(blocks) - 1), fill(bug.code, names).split("\n"))
    lines = module_header(repo.name, mod, rng, bug.imports)
    for i, block in enumerate(blocks):
        lines += block + (["", ""] if i < len(blocks) - 1 else [])
    return lines, [key for key, _, _ in fillers]


def _test_lines(
    repo: RepoSpec, mod: str, bug: BugTemplate, names: dict, helpers: list[str], rng: random.Random
):
    """The test module: tests of the module's helpers plus the test the bug fails."""
    picked = rng.sample(helpers, rng.randint(3, len(helpers)))
    symbol = fill(bug.func, names).split(".")[0]
    imports = ", ".join(sorted({symbol, *(fill(k, names) for k in picked)}))
    lines = (["from datetime import datetime", ""] if bug.imports else []) + ["import pytest", ""]
    lines += [f"from {repo.name}.{mod} import {imports}", "", ""]
    tests: list[tuple[str, str]] = []
    for key in picked:
        suffix = rng.choice(["basic", "edge_cases", "roundtrip", "rejects_bad_input", "defaults"])
        tests.append(
            (
                f"test_{fill(key, names).lstrip('_').lower()}_{suffix}",
                fill(_FILLER_TESTS[key], names),
            )
        )
    tests.insert(
        rng.randint(0, len(tests)), (fill(bug.test_name, names), fill(bug.test_code, names))
    )
    for i, (name, body) in enumerate(tests):
        signature = f"def {name}({'tmp_path' if 'tmp_path' in body else ''}):"
        lines += [signature] + body.split("\n") + (["", ""] if i < len(tests) - 1 else [])
    return lines, [n for n, _ in tests]


def _callers(
    repo: RepoSpec, mod: str, symbol: str, rng: random.Random
) -> list[tuple[str, int, str]]:
    """Where other modules use the buggy symbol (grep hits besides the definition)."""
    others = [m for m in repo.modules if m != mod]
    hits = []
    for other in rng.sample(others, rng.randint(0, 2)):
        path = f"src/{repo.name}/{other}.py"
        hits.append((path, rng.randint(3, 12), f"from .{mod} import {symbol}"))
        hits.append(
            (
                path,
                rng.randint(40, 180),
                f"        result = {symbol}(value)"
                if symbol[0].islower()
                else f"        table = {symbol}(pairs)",
            )
        )
    return hits


def _other_file(task: CodingTask, path: str) -> list[str]:
    """Contents of a file nobody edits, generated from a generator keyed by its path."""
    rng = random.Random(f"{task.seed}:{path}")
    repo = task.repo
    if path.endswith(".py"):
        mod = path.rsplit("/", 1)[-1][:-3]
        lines = module_header(repo.name, mod, rng)
        # _compat.py collects helpers for every noun: the one large file of the repository.
        nouns = repo.nouns if mod == "_compat" else [rng.choice(repo.nouns)]
        blocks = [
            block for noun in nouns for _, _, block in filler_blocks(noun, rng, rng.randint(3, 8))
        ]
        for i, block in enumerate(blocks):
            lines += ([""] * 2 if i else []) + block
        return lines
    name = path.rsplit("/", 1)[-1]
    if name == "pyproject.toml":
        return [
            "[build-system]",
            'requires = ["setuptools>=68"]',
            'build-backend = "setuptools.build_meta"',
            "",
            "[project]",
            f'name = "{repo.name}"',
            f'version = "{task.version}"',
            f'description = "{repo.description}"',
            'requires-python = ">=3.9"',
            "",
            "[project.optional-dependencies]",
            'test = ["pytest>=7", "pytest-cov"]',
            "",
            "[tool.pytest.ini_options]",
            'testpaths = ["tests"]',
            'addopts = "-ra"',
        ]
    if name == "CHANGELOG.md":
        out = ["# Changelog", ""]
        major, minor = task.version.split(".")[:2]
        for patch in range(
            int(task.version.split(".")[2]), max(-1, int(task.version.split(".")[2]) - 4), -1
        ):
            out += [
                f"## {major}.{minor}.{patch}",
                "",
                f"- {rng.choice(_CHANGES)}",
                f"- {rng.choice(_CHANGES)}",
                "",
            ]
        return out
    if name in ("tox.ini", "setup.cfg"):
        return (
            [
                "[tox]",
                "envlist = py39, py310, py311, py312",
                "",
                "[testenv]",
                "extras = test",
                "commands = pytest {posargs}",
            ]
            if name == "tox.ini"
            else [
                "[metadata]",
                f"name = {repo.name}",
                "",
                "[flake8]",
                "max-line-length = 100",
                "exclude = .git,build,dist",
            ]
        )
    if name == "ci.yml":
        return [
            "name: CI",
            "on: [push, pull_request]",
            "jobs:",
            "  test:",
            "    runs-on: ubuntu-latest",
            "    strategy:",
            "      matrix:",
            '        python: ["3.9", "3.10", "3.11", "3.12"]',
            "    steps:",
            "      - uses: actions/checkout@v4",
            "      - uses: actions/setup-python@v5",
            "        with: {python-version: ${{ matrix.python }}}",
            "      - run: pip install -e .[test]",
            "      - run: pytest",
        ]
    if name == "conftest.py":
        return [
            "import pytest",
            "",
            "",
            "@pytest.fixture",
            "def sample_items():",
            '    return ["alpha", "beta", "gamma"]',
            "",
            "",
            "@pytest.fixture(autouse=True)",
            "def _no_network(monkeypatch):",
            '    monkeypatch.setenv("NO_NETWORK", "1")',
        ]
    return [
        f"# {repo.name}",
        "",
        f"{repo.name.capitalize()} is {repo.description}.",
        "",
        "## Installation",
        "",
        f"    pip install {repo.name}",
        "",
        "## Development",
        "",
        "    pip install -e .[test]",
        "    python -m pytest",
    ]


_CHANGES = (
    "Fix handling of empty input.",
    "Add type hints to the public API.",
    "Drop support for Python 3.8.",
    "Speed up parsing of large files.",
    "Document the configuration options.",
    "Fix a crash on Windows paths.",
    "Deprecate the `strict` keyword.",
    "Add `py.typed` marker.",
)
