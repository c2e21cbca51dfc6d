"""Mutation testing of seam's core arithmetic: does some test fail for each small bug?

Each mutant changes one operator or constant in one target module (``<`` → ``<=``,
``+`` → ``-``, ``and`` → ``or``, ``not x`` → ``x``, ``n`` → ``n + 1``, ``True`` →
``False``, ...). The target's fast tests then run against it in a forked child of one
process that has imported everything once (the tokenizers and the test modules stay
loaded), with the mutated functions and classes swapped into every module that holds
them. A mutant the tests do not kill *survives*; ``docs/mutation.md`` lists each
survivor of the last run with the test that now kills it or why it is equivalent.

    python tools/mutate.py [--only pipeline/core/mask.py] [--list] [--timeout 120]

Exit status 1 when a mutant survives that ``docs/mutation.md`` does not explain
(keyed by file, line and mutation).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import os
import re
import signal
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Target module → its fast tests (hand-checked first: most mutants die there quickly).
PROPS = "tests/core/test_properties.py::"
TARGETS: dict[str, list[str]] = {
    "pipeline/core/mask.py": [
        "tests/core/test_segments_hand_checked.py",
        "tests/core/test_mask_options.py",
        PROPS + "test_decoding_the_masked_spans_gives_every_generated_output_exactly_once",
    ],
    "pipeline/core/seams.py": [
        "tests/core/test_segment_ids.py",
        "tests/core/test_segments_hand_checked.py",
        "tests/core/test_properties.py",
    ],
    "pipeline/core/segment.py": [
        "tests/core/test_segments_hand_checked.py",
        # The drift realignment's own tests (logged ids against rendered ones).
        "tests/core/test_segment_ids.py",
        # The message-level shortcut is an optimization: without it the token-level
        # comparison gives the same segments, in quadratic time.
        "tests/core/test_segment_scaling.py::test_ten_times_the_calls_in_one_segment_cost_about_ten_times_the_work",
        "tests/core/test_mask_options.py",
        "tests/core/test_properties.py",
        "tests/core/test_incremental_rendering.py::test_a_template_that_renders_history_differently_is_rendered_in_full",
    ],
    "pipeline/core/rows.py": [
        "tests/core/test_rows_columns.py",
        "tests/core/test_rows_outcomes.py",
        "tests/core/test_mask_options.py",
        "tests/test_build.py::test_trainable_tokens_after_and_loss_weights_are_consistent",
        "tests/test_build.py::test_shards_load_unchanged_in_datasets_polars_and_duckdb",
        "tests/core/test_witness.py::test_excluded_segments_are_counted_and_their_rollout_keeps_its_vote",
        "tests/core/test_witness.py::test_excluding_one_segment_keeps_the_rollouts_other_segments_and_its_advantage",
        "tests/core/test_witness.py::test_a_session_whose_usage_agrees_stays_exact",
        "tests/core/test_witness.py::test_a_record_the_model_saw_and_seam_did_not_is_flagged_counted_and_verified",
        "tests/core/test_fidelity_vocabulary.py::test_a_rollout_naming_an_unknown_reason_is_quarantined_with_the_reason",
    ],
    "pipeline/core/witness.py": ["tests/core/test_witness.py"],
    "pipeline/core/advantage.py": [
        PROPS + "test_group_advantage_hand_computed",
        PROPS + "test_group_advantage_with_the_sample_std_hand_computed",
        PROPS + "test_epsilon_bounds_the_advantage_of_a_group_whose_rewards_barely_differ",
        PROPS + "test_group_advantages_sum_to_zero_over_rollouts_of_each_task",
        PROPS + "test_trainable_tokens_after_counts_later_segments_only",
        PROPS + "test_rollouts_without_outcome_get_zero_and_do_not_move_their_group",
        "tests/test_build.py::test_advantages_are_per_rollout_and_sum_to_zero_per_task",
        "tests/test_build.py::test_trainable_tokens_after_and_loss_weights_are_consistent",
    ],
    "trainer/gae.py": ["tests/trainer/test_gae.py"],
}

_COMPARE: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BINARY: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Pow: ast.Mult,
    ast.Mod: ast.FloorDiv,
}
_BOOL: dict[type[ast.boolop], type[ast.boolop]] = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutant:
    path: str
    index: int  # the index-th mutable site of the file, in ast.walk order
    line: int
    description: str

    @property
    def key(self) -> str:
        """How docs/mutation.md names the mutant."""
        return f"{self.path}:{self.line} {self.description}"


def _op(node) -> str:
    return type(node).__name__


def _sites(tree: ast.Module) -> list[tuple[Any, str, tuple[Any, ...]]]:
    """Every mutable site: (node, description, how to mutate it)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        # Docstrings and annotations are not executed (``from __future__ import annotations``).
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        for ann in _annotations(node):
            skip.update(id(n) for n in ast.walk(ann))
    sites: list[tuple[Any, str, tuple[Any, ...]]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _COMPARE:
                    swapped = _COMPARE[type(op)]
                    sites.append((node, f"{_op(op)} -> {swapped.__name__}", ("cmp", i, swapped)))
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINARY:
            arith = _BINARY[type(node.op)]
            sites.append((node, f"{_op(node.op)} -> {arith.__name__}", ("op", arith)))
        elif isinstance(node, ast.BoolOp):
            logic = _BOOL[type(node.op)]
            sites.append((node, f"{_op(node.op)} -> {logic.__name__}", ("op", logic)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            sites.append((node, f"drop {_op(node.op)}", ("unary",)))
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                sites.append((node, f"{v} -> {not v}", ("const", not v)))
            elif isinstance(v, int):
                sites.append((node, f"{v} -> {v + 1}", ("const", v + 1)))
            elif isinstance(v, float):
                new_v = 0.0 if v else 1.0
                sites.append((node, f"{v!r} -> {new_v!r}", ("const", new_v)))
    return sites


def _annotations(node: ast.AST):
    if isinstance(node, ast.AnnAssign):
        yield node.annotation
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if node.returns is not None:
            yield node.returns
        args = node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None and a.annotation is not None:
                yield a.annotation


_SOURCES: dict[str, str] = {}


def _source(path: str) -> str:
    """The target's text as first read: a file edited during a run keeps its mutants valid."""
    if path not in _SOURCES:
        _SOURCES[path] = (ROOT / path).read_text()
    return _SOURCES[path]


def mutants(path: str) -> list[Mutant]:
    tree = ast.parse(_source(path))
    return [
        Mutant(path, i, getattr(node, "lineno", 0), desc)
        for i, (node, desc, _) in enumerate(_sites(tree))
    ]


class _Unary(ast.NodeTransformer):
    def __init__(self, target):
        self.target = target

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        return node.operand if node is self.target else node


def mutated_code(mutant: Mutant):
    tree = ast.parse(_source(mutant.path))
    node, _, how = _sites(tree)[mutant.index]
    kind = how[0]
    if kind == "cmp":
        node.ops[how[1]] = how[2]()
    elif kind == "op":
        node.op = how[1]()
    elif kind == "const":
        node.value = how[1]
    elif kind == "unary":
        tree = _Unary(node).visit(tree)
    ast.fix_missing_locations(tree)
    return compile(tree, str(ROOT / mutant.path), "exec")


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def install(mutant: Mutant) -> None:
    """Swap the mutated definitions into the loaded module, and its functions and classes
    into every module that imported them by name (``from pipeline.core.mask import mask_segment``)."""
    module = sys.modules[_module_name(mutant.path)]
    fresh = dict(module.__dict__)
    exec(mutated_code(mutant), fresh)
    swaps = {
        id(old): new
        for name, new in fresh.items()
        if (old := module.__dict__.get(name)) is not None
        and old is not new
        and (inspect.isfunction(old) or inspect.isclass(old))
    }
    for mod in list(sys.modules.values()):
        namespace = getattr(mod, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if id(value) in swaps:
                namespace[name] = swaps[id(value)]
    module.__dict__.update(fresh)


def run(mutant: Mutant, tests: list[str], timeout: int) -> str:
    """'killed', 'survived' or 'timeout' (undecided: a mutant that makes the code hang,
    or a loaded machine): the tests run in a forked child that installs the mutant (the
    parent stays clean for the next one)."""
    pid = os.fork()
    if pid == 0:
        import pytest

        signal.alarm(timeout)
        sink = io.StringIO()
        try:
            with redirect_stdout(sink), redirect_stderr(sink):
                install(mutant)
                code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests])
        except BaseException:  # the mutant does not even load: killed
            os._exit(1)
        os._exit(0 if code == 0 else 1)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "timeout" if os.WTERMSIG(status) == signal.SIGALRM else "killed"
    return "survived" if os.WEXITSTATUS(status) == 0 else "killed"


def explained(doc: Path) -> set[str]:
    """Mutant keys docs/mutation.md's survivor table explains (status equivalent or open;
    a mutant listed as killed that survives again is reported)."""
    if not doc.exists():
        return set()
    return set(re.findall(r"^\| `([^`]+)` \| (?:equivalent|open) \|", doc.read_text(), flags=re.M))


def warm_up(tests: list[str]) -> None:
    """Import the targets, the test modules and the tokenizers once, before forking."""
    import pytest

    for path in TARGETS:
        __import__(_module_name(path))
    from tests import conftest

    conftest.load_shared()
    sink = io.StringIO()
    with redirect_stdout(sink), redirect_stderr(sink):
        code = pytest.main(["-q", "-p", "no:cacheprovider", "--collect-only", *tests])
    if code != 0:
        sys.exit(f"collecting the tests failed:\n{sink.getvalue()[-3000:]}")


def tests_of(path: str) -> list[str]:
    """The tests run against ``path``'s mutants; a test file that is gone is an error, not
    skipped (a wrong name once left the rows' mutants without their main test file, silently)."""
    missing = [t for t in TARGETS[path] if not (ROOT / t.split("::")[0]).exists()]
    if missing:
        sys.exit(f"tools/mutate.py: TARGETS names test files that do not exist: {missing}")
    return list(TARGETS[path])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(TARGETS), help="target file")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--mutant", action="append", help="run only this mutant (as listed)")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per mutant")
    args = parser.parse_args()
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    targets = args.only or list(TARGETS)
    if args.list:
        for path in targets:
            for m in mutants(path):
                print(m.key)
        return 0
    all_tests = sorted({t for p in targets for t in tests_of(p)})
    warm_up(all_tests)
    known = explained(ROOT / "docs" / "mutation.md")
    survivors: list[Mutant] = []
    undecided: list[Mutant] = []  # the tests did not finish within --timeout
    total, started = 0, time.monotonic()
    for path in targets:
        found = [m for m in mutants(path) if not args.mutant or m.key in args.mutant]
        killed = 0
        for n, m in enumerate(found, 1):
            outcome = run(m, tests_of(path), args.timeout)
            if outcome == "survived":
                survivors.append(m)
            elif outcome == "timeout":
                undecided.append(m)
            else:
                killed += 1
            print(f"[{n}/{len(found)}] {outcome:8} {m.key}", flush=True)
        total += len(found)
        print(f"{path}: {killed}/{len(found)} killed", flush=True)
    unexplained = [m for m in survivors if m.key not in known]
    minutes = (time.monotonic() - started) / 60
    killed_all = total - len(survivors) - len(undecided)
    print(f"\n{killed_all}/{total} mutants killed, {len(survivors)} survived, ", end="")
    print(f"{len(undecided)} timed out (a hang, or a slow machine) in {minutes:.1f} min")
    for m in undecided:
        print(f"timed out: {m.key}")
    for m in unexplained:
        print(f"not explained in docs/mutation.md: {m.key}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
