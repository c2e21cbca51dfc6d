"""``make mutate`` runs each core file's mutants against the tests ``tools/mutate.py`` names
for it; a test file renamed without updating that table once left the rows' mutants
without their main test file, and nothing said so. Every named test must exist."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tools import mutate

ROOT = Path(__file__).resolve().parents[1]


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("target", sorted(mutate.TARGETS))
def test_every_test_the_mutation_run_names_exists(target):
    assert (ROOT / target).exists(), target
    for test in mutate.TARGETS[target]:
        file, _, name = test.partition("::")
        assert (ROOT / file).exists(), f"{target}: {file} does not exist"
        if name:
            assert name in _functions(ROOT / file), f"{target}: no test {name} in {file}"
    assert mutate.tests_of(target) == mutate.TARGETS[target]


def test_a_missing_test_file_stops_the_run(monkeypatch):
    monkeypatch.setitem(mutate.TARGETS, "pipeline/core/mask.py", ["tests/no_such_test.py"])
    with pytest.raises(SystemExit, match="no_such_test"):
        mutate.tests_of("pipeline/core/mask.py")
