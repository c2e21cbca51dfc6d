"""Small, plausible Python repositories for simulated SWE tasks.

A task needs a repository that reads like a real one: a package under ``src/`` with a
handful of modules, tests next to them, project files, and module bodies made of
ordinary helper functions around the one that holds the bug. Everything here is data
plus tiny format strings, so a task's files cost microseconds to produce and are fully
determined by the task's random generator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RepoSpec:
    """One repository archetype: its package, modules and the nouns its code talks about."""

    org: str
    name: str
    description: str
    modules: tuple[str, ...]
    nouns: tuple[str, ...]


REPOS: tuple[RepoSpec, ...] = (
    RepoSpec(
        "tinyhttp-dev",
        "tinyhttp",
        "a small synchronous HTTP client",
        ("client", "headers", "retry", "url", "cookies", "auth"),
        ("header", "cookie", "request", "param"),
    ),
    RepoSpec(
        "tabkit",
        "tabkit",
        "typed CSV and TSV readers",
        ("reader", "schema", "dialect", "writer", "coerce", "infer"),
        ("row", "column", "cell", "field"),
    ),
    RepoSpec(
        "cfgtree",
        "cfgtree",
        "layered configuration from files and the environment",
        ("loader", "merge", "env", "validate", "paths", "layers"),
        ("option", "section", "layer", "key"),
    ),
    RepoSpec(
        "timewarp-py",
        "timewarp",
        "parsing and humanizing dates and durations",
        ("parse", "tz", "humanize", "ranges", "calendar", "duration"),
        ("interval", "span", "offset", "date"),
    ),
    RepoSpec(
        "mdlite",
        "mdlite",
        "a fast CommonMark subset renderer",
        ("lexer", "inline", "blocks", "html", "escape", "links"),
        ("token", "block", "link", "span"),
    ),
    RepoSpec(
        "cachebox",
        "cachebox",
        "LRU and TTL caches with decorators",
        ("lru", "ttl", "keys", "decorators", "stats", "backends"),
        ("entry", "key", "slot", "item"),
    ),
    RepoSpec(
        "clikit-org",
        "clikit",
        "declarative command-line parsing",
        ("parser", "options", "help", "completion", "types", "commands"),
        ("option", "argument", "flag", "command"),
    ),
    RepoSpec(
        "geomath",
        "geomath",
        "2-D geometry and unit conversion",
        ("vector", "polygon", "bbox", "distance", "units", "transform"),
        ("point", "edge", "vertex", "segment"),
    ),
    RepoSpec(
        "logsift",
        "logsift",
        "structured log parsing and filtering",
        ("parse", "filters", "levels", "fields", "sinks", "rotate"),
        ("record", "field", "line", "level"),
    ),
    RepoSpec(
        "pkgmeta",
        "pkgmeta",
        "reading and validating package metadata",
        ("version", "markers", "requirements", "wheel", "metadata", "specifiers"),
        ("requirement", "marker", "version", "specifier"),
    ),
)

PROJECT_FILES = (
    "pyproject.toml",
    "README.md",
    "CHANGELOG.md",
    "tox.ini",
    ".github/workflows/ci.yml",
    "docs/index.md",
    "docs/usage.md",
    "setup.cfg",
    "LICENSE",
)

# Helper definitions that surround the buggy one: (name, code); {noun}/{Noun} are filled per module.
FILLERS: tuple[tuple[str, str], ...] = (
    (
        "is_valid_{noun}",
        '''def is_valid_{noun}(value):
    """Return True when ``value`` can be used as {a_noun}."""
    if value is None:
        return False
    text = str(value).strip()
    return bool(text) and not text.startswith("#")''',
    ),
    (
        "_normalize_{noun}",
        '''def _normalize_{noun}(value):
    """Canonical form used for comparisons and cache keys."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return " ".join(str(value).split()).lower()''',
    ),
    (
        "{Noun}Error",
        '''class {Noun}Error(ValueError):
    """Raised when {a_noun} cannot be parsed or validated."""

    def __init__(self, message, {noun}=None):
        super().__init__(message)
        self.{noun} = {noun}''',
    ),
    (
        "iter_{noun}s",
        '''def iter_{noun}s(source, *, skip_blank=True):
    """Yield {noun}s from an iterable of lines, optionally skipping blanks."""
    for lineno, raw in enumerate(source, start=1):
        line = raw.rstrip("\\n")
        if skip_blank and not line.strip():
            continue
        yield lineno, line''',
    ),
    (
        "format_{noun}",
        '''def format_{noun}({noun}, width=None):
    """Human-readable form, padded to ``width`` when given."""
    text = repr({noun}) if not isinstance({noun}, str) else {noun}
    if width is not None and len(text) < width:
        text = text.ljust(width)
    return text''',
    ),
    (
        "{Noun}Registry",
        '''class {Noun}Registry:
    """Keeps {noun}s by name; later registrations win unless ``strict``."""

    def __init__(self, strict=False):
        self._items = {{}}
        self.strict = strict

    def register(self, name, {noun}):
        if self.strict and name in self._items:
            raise KeyError(f"duplicate {noun}: {{name}}")
        self._items[name] = {noun}
        return {noun}

    def get(self, name, default=None):
        return self._items.get(name, default)''',
    ),
    (
        "merge_{noun}s",
        '''def merge_{noun}s(first, second):
    """Merge two mappings of {noun}s; values from ``second`` win."""
    merged = dict(first)
    for name, value in second.items():
        merged[name] = value
    return merged''',
    ),
    (
        "count_{noun}s",
        '''def count_{noun}s(items, predicate=None):
    """Number of {noun}s in ``items`` that satisfy ``predicate`` (all when None)."""
    if predicate is None:
        return sum(1 for _ in items)
    return sum(1 for item in items if predicate(item))''',
    ),
    (
        "{Noun}Spec",
        '''@dataclass
class {Noun}Spec:
    """Declarative description of {a_noun}."""

    name: str
    required: bool = False
    default: object = None
    aliases: tuple = ()

    def matches(self, name):
        return name == self.name or name in self.aliases''',
    ),
    (
        "split_{noun}",
        '''_{NOUN}_RE = re.compile(r"^(?P<name>[A-Za-z_][\\w.-]*)\\s*[=:]\\s*(?P<value>.*)$")


def split_{noun}(line):
    """Split ``name=value`` or ``name: value``; None for anything else."""
    match = _{NOUN}_RE.match(line.strip())
    if match is None:
        return None
    return match.group("name"), match.group("value").strip()''',
    ),
    (
        "load_{noun}s",
        '''def load_{noun}s(path, encoding="utf-8"):
    """Read {noun}s from ``path``, one per line; ``#`` starts a comment."""
    {noun}s = []
    with open(path, encoding=encoding) as handle:
        for raw in handle:
            line = raw.split("#", 1)[0].strip()
            if line:
                {noun}s.append(line)
    log.debug("loaded %d {noun}s from %s", len({noun}s), path)
    return {noun}s''',
    ),
    (
        "sort_{noun}s",
        '''def sort_{noun}s({noun}s, *, reverse=False):
    """Stable sort by name, then position; items without a name sort last."""

    def key(pair):
        index, item = pair
        name = getattr(item, "name", None)
        return (name is None, name or "", index)

    ordered = sorted(enumerate({noun}s), key=key, reverse=reverse)
    return [item for _, item in ordered]''',
    ),
    (
        "{Noun}Set",
        '''class {Noun}Set:
    """An ordered set of {noun}s with O(1) membership tests."""

    def __init__(self, items=()):
        self._order = []
        self._seen = set()
        for item in items:
            self.add(item)

    def add(self, item):
        if item not in self._seen:
            self._seen.add(item)
            self._order.append(item)

    def __contains__(self, item):
        return item in self._seen

    def __iter__(self):
        return iter(self._order)

    def __len__(self):
        return len(self._order)

    def __repr__(self):
        return f"{{type(self).__name__}}({{self._order!r}})"''',
    ),
)

IMPORTS = (
    "from __future__ import annotations",
    "import itertools",
    "import os",
    "from collections import OrderedDict",
    "from typing import Iterable, Iterator, Mapping",
)


def module_header(
    pkg: str, mod: str, rng: random.Random, extra_imports: tuple[str, ...] = ()
) -> list[str]:
    """Docstring and imports at the top of a module (isort order)."""
    extra = rng.sample(IMPORTS[1:], rng.randint(1, 3)) + list(extra_imports)
    lines = [f'"""{pkg}.{mod}: {rng.choice(_MODULE_BLURBS)}."""', "", IMPORTS[0], ""]
    lines += sorted(["import logging", "import re", *[i for i in extra if i.startswith("import")]])
    lines += sorted(
        ["from dataclasses import dataclass", *[i for i in extra if i.startswith("from")]]
    )
    return lines + ["", "log = logging.getLogger(__name__)", "", ""]


_MODULE_BLURBS = (
    "helpers shared by the public API",
    "the core implementation",
    "internal utilities",
    "parsing and validation",
    "conversion helpers",
    "the public entry points",
)


def filler_blocks(noun: str, rng: random.Random, count: int) -> list[tuple[str, str, list[str]]]:
    """``count`` helper definitions about ``noun``: (name template, name, source lines)."""
    picks = rng.sample(FILLERS, min(count, len(FILLERS)))
    names = {
        "noun": noun,
        "Noun": noun.capitalize(),
        "NOUN": noun.upper(),
        "a_noun": ("an " if noun[0] in "aeiou" else "a ") + noun,
    }
    return [(key, key.format(**names), code.format(**names).split("\n")) for key, code in picks]


def repo_tree(repo: RepoSpec, rng: random.Random) -> list[str]:
    """Every path of the repository, sorted as ``find . -type f`` would print after sorting."""
    paths = [f"src/{repo.name}/__init__.py", f"src/{repo.name}/_compat.py"]
    paths += [f"src/{repo.name}/{m}.py" for m in repo.modules]
    paths += ["tests/__init__.py", "tests/conftest.py"] + [
        f"tests/test_{m}.py" for m in repo.modules
    ]
    paths += list(rng.sample(PROJECT_FILES, 6))
    return sorted(paths)
