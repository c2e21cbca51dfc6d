"""Bug templates: the buggy function, its fix, the failing test and what pytest prints.

Each template is the kind of one-line-to-three-line defect SWE-style benchmarks are
full of (off-by-one, missing None guard, wrong exception type, case sensitivity,
boundary comparison, mutable default, integer division, ASCII encoding, mutation
during iteration, naive vs aware datetimes). A template also carries a *plausible
wrong fix* and the error it leads to, so unresolved rollouts fail the way agents
really fail: an edit that moves the error instead of removing it.

Placeholders: ``{noun}`` / ``{Noun}`` (the repository's domain word), ``{pkg}``,
``{mod}``. Literal braces in code are doubled.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Failure:
    """What pytest reports for one failing test."""

    error: str  # one-line signature, e.g. "AssertionError: assert 2 == 2.5"
    detail: tuple[str, ...]  # extra "E" lines after the first
    in_source: bool  # raised inside the function (two traceback frames) or in the assert
    frame_locals: str = ""  # pytest's "name = value" line for the inner frame
    at: str = ""  # the source line that raises (default: the template's bad_line)


@dataclass(frozen=True)
class BugTemplate:
    kind: str
    func: str
    code: str  # buggy definition
    old: str  # exact text replaced by the fix (str_replace old_str)
    new: str  # the fix
    bad_line: str  # the line that is wrong (what the agent points at)
    test_name: str
    test_code: str
    failure: Failure
    wrong_old: str  # a tempting but wrong edit...
    wrong_new: str
    wrong_failure: Failure  # ...and what it leads to
    issue_title: str
    issue_body: str
    cause: str  # the root cause in one sentence
    imports: tuple[str, ...] = ()


BUGS: tuple[BugTemplate, ...] = (
    BugTemplate(
        "off_by_one",
        "chunk_{noun}s",
        'def chunk_{noun}s({noun}s, size):\n    """Split ``{noun}s`` into lists of at most ``size`` items, keeping order."""\n'
        '    if size <= 0:\n        raise ValueError(f"size must be positive, got {{size}}")\n    chunks = []\n'
        "    for start in range(0, len({noun}s) - 1, size):\n        chunks.append(list({noun}s[start:start + size]))\n"
        "    return chunks",
        "    for start in range(0, len({noun}s) - 1, size):",
        "    for start in range(0, len({noun}s), size):",
        "    for start in range(0, len({noun}s) - 1, size):",
        "test_chunk_{noun}s_keeps_last_item",
        "    assert chunk_{noun}s([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]",
        Failure(
            "AssertionError: assert [[1, 2], [3, 4]] == [[1, 2], [3, 4], [5]]",
            ("  ", "  Right contains one more item: [5]", "  Use -v to get more diff"),
            False,
        ),
        "        chunks.append(list({noun}s[start:start + size]))",
        "        chunks.append(list({noun}s[start:start + size + 1]))",
        Failure(
            "AssertionError: assert [[1, 2, 3], [3, 4, 5]] == [[1, 2], [3, 4], [5]]",
            ("  ", "  At index 0 diff: [1, 2, 3] != [1, 2]", "  Right contains one more item: [5]"),
            False,
        ),
        "chunk_{noun}s drops the last {noun} when the length is not a multiple of size",
        "```python\n>>> from {pkg}.{mod} import chunk_{noun}s\n>>> chunk_{noun}s([1, 2, 3, 4, 5], 2)\n[[1, 2], [3, 4]]\n```\n"
        "Expected `[[1, 2], [3, 4], [5]]`. The trailing partial chunk is silently lost, which corrupts "
        "batched writes downstream.",
        "the loop bound `len({noun}s) - 1` stops one item early, so the last partial chunk is never emitted",
    ),
    BugTemplate(
        "none_guard",
        "parse_{noun}",
        'def parse_{noun}(raw, default=None):\n    """Parse a ``name=value`` {noun}; ``raw`` may be None for a missing {noun}."""\n'
        '    text = raw.strip()\n    if not text:\n        return default\n    name, _, value = text.partition("=")\n'
        "    return name.strip().lower(), value.strip()",
        "    text = raw.strip()",
        '    text = (raw or "").strip()',
        "    text = raw.strip()",
        "test_parse_{noun}_accepts_none",
        '    assert parse_{noun}(None, default=("x", "1")) == ("x", "1")',
        Failure(
            "AttributeError: 'NoneType' object has no attribute 'strip'",
            (),
            True,
            "raw = None, default = ('x', '1')",
        ),
        "    text = raw.strip()",
        "    text = str(raw).strip()",
        Failure(
            "AssertionError: assert ('none', '') == ('x', '1')",
            ("  ", "  At index 0 diff: 'none' != 'x'", "  Use -v to get more diff"),
            False,
        ),
        "parse_{noun}(None) raises AttributeError instead of returning the default",
        "The docstring says `raw` may be None, but:\n```\n>>> {pkg}.{mod}.parse_{noun}(None, default=('x', '1'))\n"
        "Traceback (most recent call last):\n  ...\nAttributeError: 'NoneType' object has no attribute 'strip'\n```\n"
        "This breaks loading files where the {noun} is optional.",
        "`raw.strip()` is called before checking for None, so a missing {noun} crashes instead of returning `default`",
    ),
    BugTemplate(
        "wrong_exception",
        "lookup_{noun}",
        'def lookup_{noun}(table, name):\n    """Return the {noun} called ``name``; unknown names raise ValueError."""\n'
        "    key = name.strip().lower()\n    return table[key]",
        "    return table[key]",
        '    if key not in table:\n        raise ValueError(f"unknown {noun}: {{name!r}}")\n    return table[key]',
        "    return table[key]",
        "test_lookup_{noun}_unknown_raises_value_error",
        '    with pytest.raises(ValueError, match="unknown {noun}"):\n        lookup_{noun}({{"a": 1}}, "missing")',
        Failure("KeyError: 'missing'", (), True, "table = {{'a': 1}}, name = 'missing'"),
        "    return table[key]",
        "    return table.get(key)",
        Failure("Failed: DID NOT RAISE <class 'ValueError'>", (), False),
        "lookup_{noun} raises a bare KeyError for unknown names (documented: ValueError)",
        "Callers catch `ValueError` as documented, but an unknown name escapes as `KeyError: 'missing'` and "
        "crashes the CLI with a traceback instead of the friendly message.",
        "`table[key]` lets the KeyError escape; the documented contract is a ValueError naming the {noun}",
    ),
    BugTemplate(
        "case_sensitivity",
        "{Noun}Map.get",
        'class {Noun}Map:\n    """Mapping of {noun} names to values; names compare case-insensitively."""\n\n'
        "    def __init__(self, items=()):\n        self._data = {{}}\n        for name, value in items:\n"
        "            self._data[name.lower()] = value\n\n    def get(self, name, default=None):\n"
        "        return self._data.get(name, default)",
        "        return self._data.get(name, default)",
        "        return self._data.get(name.lower(), default)",
        "        return self._data.get(name, default)",
        "test_{noun}_map_get_is_case_insensitive",
        '    m = {Noun}Map([("Content-Type", "text/plain")])\n    assert m.get("Content-Type") == "text/plain"',
        Failure(
            "AssertionError: assert None == 'text/plain'",
            (
                " +  where None = <bound method {Noun}Map.get of <{pkg}.{mod}.{Noun}Map object at 0x7f3a2c1d9e50>>('Content-Type')",
                " +    where <bound method {Noun}Map.get of <{pkg}.{mod}.{Noun}Map object at 0x7f3a2c1d9e50>> = "
                "<{pkg}.{mod}.{Noun}Map object at 0x7f3a2c1d9e50>.get",
            ),
            False,
        ),
        "            self._data[name.lower()] = value",
        "            self._data[name] = value",
        Failure(
            "AssertionError: assert None == 'text/plain'",
            (
                " +  where None = <bound method {Noun}Map.get of <{pkg}.{mod}.{Noun}Map object at 0x7f9b0e4c2a10>>('content-type')",
            ),
            False,
        ),
        "{Noun}Map.get is case-sensitive although names are documented as case-insensitive",
        "`{Noun}Map([('Content-Type', 'text/plain')]).get('Content-Type')` returns `None`. Only the all-lowercase "
        "spelling works, which contradicts the class docstring.",
        "`__init__` lower-cases the stored names but `get` looks the name up unchanged",
    ),
    BugTemplate(
        "boundary",
        "is_expired_{noun}",
        'def is_expired_{noun}(created_at, ttl, now):\n    """True once ``ttl`` seconds have passed since ``created_at`` (inclusive)."""\n'
        "    if ttl is None:\n        return False\n    return now - created_at > ttl",
        "    return now - created_at > ttl",
        "    return now - created_at >= ttl",
        "    return now - created_at > ttl",
        "test_is_expired_{noun}_at_exact_ttl",
        "    assert is_expired_{noun}(100.0, 30, now=130.0) is True",
        Failure(
            "AssertionError: assert False is True",
            (" +  where False = is_expired_{noun}(100.0, 30, now=130.0)",),
            False,
        ),
        "    return now - created_at > ttl",
        "    return now - created_at > ttl - 1",
        Failure(
            "AssertionError: assert True is False",
            (" +  where True = is_expired_{noun}(100.0, 30, now=129.5)",),
            False,
        ),
        "{noun}s with ttl=N are still served at exactly N seconds",
        "The docstring says expiry is inclusive, but {a_noun} created at t=100 with ttl=30 is reported live at "
        "t=130. We see stale values served for one extra tick under load.",
        "the comparison `> ttl` is exclusive; the documented behaviour needs `>= ttl`",
    ),
    BugTemplate(
        "mutable_default",
        "collect_{noun}s",
        'def collect_{noun}s(values, seen=[]):\n    """Return the {noun}s in ``values`` without duplicates, in first-seen order."""\n'
        "    out = []\n    for value in values:\n        if value not in seen:\n            seen.append(value)\n"
        "            out.append(value)\n    return out",
        'def collect_{noun}s(values, seen=[]):\n    """Return the {noun}s in ``values`` without duplicates, in first-seen order."""\n',
        'def collect_{noun}s(values, seen=None):\n    """Return the {noun}s in ``values`` without duplicates, in first-seen order."""\n'
        "    seen = [] if seen is None else seen\n",
        "def collect_{noun}s(values, seen=[]):",
        "test_collect_{noun}s_is_independent_between_calls",
        '    assert collect_{noun}s(["a", "b"]) == ["a", "b"]\n    assert collect_{noun}s(["a", "c"]) == ["a", "c"]',
        Failure(
            "AssertionError: assert ['c'] == ['a', 'c']",
            ("  ", "  At index 0 diff: 'c' != 'a'", "  Right contains one more item: 'c'"),
            False,
        ),
        "def collect_{noun}s(values, seen=[]):",
        "def collect_{noun}s(values, seen=()):",
        Failure(
            "AttributeError: 'tuple' object has no attribute 'append'",
            (),
            True,
            "values = ['a', 'b'], seen = ()",
            "            seen.append(value)",
        ),
        "collect_{noun}s remembers {noun}s from previous calls",
        "Calling `collect_{noun}s(['a', 'b'])` and then `collect_{noun}s(['a', 'c'])` returns `['c']` the second "
        "time. State leaks between unrelated calls (we hit it in a long-running worker).",
        "the default `seen=[]` is created once and shared by every call, so earlier {noun}s count as seen",
    ),
    BugTemplate(
        "integer_division",
        "mean_{noun}_size",
        'def mean_{noun}_size(sizes):\n    """Average size of the {noun}s, as a float; 0.0 for no {noun}s."""\n'
        "    if not sizes:\n        return 0.0\n    return sum(sizes) // len(sizes)",
        "    return sum(sizes) // len(sizes)",
        "    return sum(sizes) / len(sizes)",
        "    return sum(sizes) // len(sizes)",
        "test_mean_{noun}_size_is_fractional",
        "    assert mean_{noun}_size([1, 2, 3, 4]) == 2.5",
        Failure(
            "AssertionError: assert 2 == 2.5",
            (" +  where 2 = mean_{noun}_size([1, 2, 3, 4])",),
            False,
        ),
        "    return sum(sizes) // len(sizes)",
        "    return float(sum(sizes) // len(sizes))",
        Failure(
            "AssertionError: assert 2.0 == 2.5",
            (" +  where 2.0 = mean_{noun}_size([1, 2, 3, 4])",),
            False,
        ),
        "mean_{noun}_size truncates to an integer",
        "`mean_{noun}_size([1, 2, 3, 4])` returns `2`, not `2.5`. The stats page shows rounded-down averages.",
        "floor division `//` truncates the average; true division is needed",
    ),
    BugTemplate(
        "ascii_encoding",
        "encode_{noun}",
        'def encode_{noun}(value):\n    """Encode {a_noun} for the wire; non-ASCII text is sent as UTF-8."""\n'
        '    text = str(value)\n    return text.encode("ascii")',
        '    return text.encode("ascii")',
        '    return text.encode("utf-8")',
        '    return text.encode("ascii")',
        "test_encode_{noun}_non_ascii",
        '    assert encode_{noun}("café") == "café".encode("utf-8")',
        Failure(
            "UnicodeEncodeError: 'ascii' codec can't encode character '\\xe9' in position 3: ordinal not in range(128)",
            (),
            True,
            "value = 'café', text = 'café'",
        ),
        '    return text.encode("ascii")',
        '    return text.encode("ascii", errors="ignore")',
        Failure(
            "AssertionError: assert b'caf' == b'caf\\xc3\\xa9'",
            ("  ", "  Use -v to get more diff"),
            False,
        ),
        "encode_{noun} crashes on non-ASCII input",
        "Sending {a_noun} with an accented character fails:\n```\nUnicodeEncodeError: 'ascii' codec can't encode "
        "character '\\xe9' in position 3: ordinal not in range(128)\n```\nThe docstring promises UTF-8.",
        "the value is encoded with the ASCII codec although the contract is UTF-8",
    ),
    BugTemplate(
        "mutation_during_iteration",
        "prune_{noun}s",
        'def prune_{noun}s(registry, keep):\n    """Remove every {noun} whose name is not in ``keep``; returns the removed names."""\n'
        "    removed = []\n    for name in registry:\n        if name not in keep:\n            del registry[name]\n"
        "            removed.append(name)\n    return removed",
        "    for name in registry:",
        "    for name in list(registry):",
        "    for name in registry:",
        "test_prune_{noun}s_removes_unlisted",
        '    registry = {{"a": 1, "b": 2, "c": 3}}\n    assert prune_{noun}s(registry, keep={{"a"}}) == ["b", "c"]',
        Failure(
            "RuntimeError: dictionary changed size during iteration",
            (),
            True,
            "registry = {{'a': 1, 'c': 3}}, keep = {{'a'}}, removed = ['b']",
        ),
        "    for name in registry:",
        "    for name in registry.keys():",
        Failure(
            "RuntimeError: dictionary changed size during iteration",
            (),
            True,
            "registry = {{'a': 1, 'c': 3}}, keep = {{'a'}}, removed = ['b']",
            "    for name in registry.keys():",
        ),
        "prune_{noun}s raises RuntimeError when more than one {noun} is removed",
        "```\n>>> prune_{noun}s({{'a': 1, 'b': 2, 'c': 3}}, keep={{'a'}})\nRuntimeError: dictionary changed size during iteration\n```",
        "the loop deletes from the dict it is iterating over",
    ),
    BugTemplate(
        "naive_datetime",
        "{noun}_is_past",
        'def {noun}_is_past(when, now=None):\n    """True when ``when`` (aware, or naive meaning UTC) lies before ``now``."""\n'
        "    now = now or datetime.now(timezone.utc)\n    return when < now",
        "    return when < now",
        "    if when.tzinfo is None:\n        when = when.replace(tzinfo=timezone.utc)\n    return when < now",
        "    return when < now",
        "test_{noun}_is_past_accepts_naive",
        "    assert {noun}_is_past(datetime(2020, 1, 1)) is True",
        Failure(
            "TypeError: can't compare offset-naive and offset-aware datetimes",
            (),
            True,
            "when = datetime.datetime(2020, 1, 1, 0, 0), now = datetime.datetime(2024, 5, 2, 9, 13, 41, tzinfo=datetime.timezone.utc)",
        ),
        "    now = now or datetime.now(timezone.utc)",
        "    now = now or datetime.now()",
        Failure(
            "TypeError: can't compare offset-naive and offset-aware datetimes",
            (),
            True,
            "when = datetime.datetime(2020, 1, 1, 0, 0, tzinfo=datetime.timezone.utc), now = datetime.datetime(2024, 5, 2, 9, 13, 41)",
        ),
        "{noun}_is_past fails for naive datetimes",
        "The docstring says naive datetimes mean UTC, but `{noun}_is_past(datetime(2020, 1, 1))` raises "
        "`TypeError: can't compare offset-naive and offset-aware datetimes`.",
        "a naive `when` is compared with an aware `now`; it must be made UTC-aware first",
        ("from datetime import datetime, timezone",),
    ),
)


def fill(text: str, names: dict[str, str]) -> str:
    """Fill a template's placeholders (and turn doubled braces into single ones)."""
    return text.format(**names)
