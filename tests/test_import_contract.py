"""The import contract of seam's layout (issue 24, "Done when"; README, "Layout").

Every first-party module belongs to one group (a package such as ``pipeline.core``), and
the groups are stacked in layers, lowest first. A module may import from its own layer
or a lower one, never a higher one; so

- the core and the build (and the inputs and common helpers under them) import nothing
  from the SFT stage (``pipeline.sft``) or the judge library (``judge``);
- no module outside ``pipeline.cli`` imports a command module;
- the groups import each other in no cycle, except the two halves of the input layer (the
  format readers use ``sources``' low-level readers and limits; the planner and intake in
  ``sources`` use the reader registry).

The imports are read with ``ast`` from the sources (every ``import`` statement, at module
level or inside a function, which is where the lazy ones are), plus import strings such
as a registry's ``"pipeline.sft.stage:SftStage"``: a registered default is an arrow too.
An arrow the contract does not allow yet must be in ``ALLOWED`` with the reason and who
removes it; an entry that no longer matches an import fails, so the list only shrinks.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "judge", "trainer", "schemas", "seam")

# Lowest first. Groups in one tuple share a layer and may import each other.
LAYERS: list[tuple[str, ...]] = [
    ("schemas",),  # the record formats
    ("pipeline", "pipeline.common"),  # version; errors, atomic writes, extras, timers
    ("pipeline.core",),  # render/tokenize, seams, segment, mask, rows, advantages
    ("pipeline.sources", "pipeline.readers"),  # inputs: planning, intake, format readers
    ("pipeline.build",),  # the build and its executors, writing, manifest, card
    ("pipeline.gateway",),  # the recording proxy; a judge plugs into its LoopJudge protocol
    ("judge",),  # the judge library: rules, LLM judge, summary checks, calibration
    ("pipeline.sft",),  # the SFT build stage: corrections, filters, synthesized calls
    (  # what runs on a build or beside it
        "pipeline.inspect",
        "pipeline.export",
        "pipeline.hooks",
        "pipeline.simulate",
        "trainer",
    ),
    ("pipeline.cli",),  # the command line
    ("seam",),  # the Python face
]
INPUT_LAYER = ("pipeline.sources", "pipeline.readers")

# (importing module, imported module or prefix): why it is still here, and who removes it.
ALLOWED: dict[tuple[str, str], str] = {
    ("pipeline.build.stage", "pipeline.sft.stage"): (
        "SHIPPED_ENTRY_POINTS: pyproject's seam.stages entry point for the SFT stage, "
        "copied for an install whose metadata predates it; an import string resolved only "
        "when a manifest names the stage. Goes when every install has the entry point "
        "(the stage-registry work of issue 24 item 2)"
    ),
    ("pipeline.hooks.claude_code", "pipeline.cli"): (
        "not an import: an installed hook's command is recognised as seam's when it runs "
        "'python -m pipeline.cli' (a string compared); permanent"
    ),
}


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


@cache
def first_party_modules() -> frozenset[str]:
    return frozenset(module_name(p) for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


# A module kept beside its package, counted as part of it: the export registry imports no
# writer, so ``seam export --help`` lists the targets without importing pipeline.export.
PART_OF = {"pipeline.export_targets": "pipeline.export"}


def group_of(module: str) -> str:
    for name, group in PART_OF.items():
        if module == name or module.startswith(name + "."):
            return group
    parts = module.split(".")
    if parts[0] == "pipeline" and len(parts) > 1:
        return f"pipeline.{parts[1]}"
    return parts[0]


def layer_of(group: str) -> int:
    for i, layer in enumerate(LAYERS):
        if group in layer:
            return i
    raise KeyError(group)


def _target(name: str) -> str | None:
    """The first-party module an import names: ``a.b.c`` if it is a module, else its
    longest module prefix (``from pipeline.core.rows import RowOptions`` names rows)."""
    parts = name.split(".")
    if parts[0] not in PACKAGES:
        return None
    modules = first_party_modules()
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in modules:
            return ".".join(parts[:k])
    return None


def _import_string(value: str) -> str | None:
    """``"pkg.mod:Attr"`` or a dotted module path held in a string (a registry's lazy
    default, an ``import_module`` argument)."""
    head = value.split(":", 1)[0]
    if "." not in head or head.split(".")[0] not in PACKAGES:
        return None
    return head if head in first_party_modules() else None  # not "seam.format", a key


@cache
def arrows() -> tuple[tuple[str, str, int, str], ...]:
    """(importer, imported module, line, how) for every first-party import."""
    found = []
    for module in sorted(first_party_modules()):
        path = ROOT / Path(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[tuple[str | None, str]] = []
            if isinstance(node, ast.Import):
                targets = [(_target(a.name), "import") for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [(_target(f"{node.module}.{a.name}"), "import") for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                targets = [(_import_string(node.value), "import string")]
            for target, how in targets:
                if target is not None and target != module:
                    found.append((module, target, node.lineno, how))
    return tuple(found)


def _allowed(importer: str, target: str) -> bool:
    return any(importer == a and (target == b or target.startswith(b + ".")) for a, b in ALLOWED)


def _show(bad) -> str:
    return "\n".join(f"  {m}:{line} -> {t} ({how})" for m, t, line, how in bad)


def test_every_module_has_a_layer():
    groups = {group_of(m) for m in first_party_modules()}
    placed = {g for layer in LAYERS for g in layer}
    assert groups - placed == set(), "a new package: place it in LAYERS (and the README)"
    assert placed - groups == set(), "LAYERS names a package that is gone"


def test_no_import_reaches_up_a_layer():
    bad = [
        (m, t, line, how)
        for m, t, line, how in arrows()
        if layer_of(group_of(t)) > layer_of(group_of(m)) and not _allowed(m, t)
    ]
    assert not bad, "imports of a higher layer:\n" + _show(bad)


def test_core_and_build_import_neither_the_sft_stage_nor_the_judge():
    low = {g for layer in LAYERS[: layer_of("pipeline.build") + 1] for g in layer}
    bad = [
        (m, t, line, how)
        for m, t, line, how in arrows()
        if group_of(m) in low and group_of(t) in ("pipeline.sft", "judge") and not _allowed(m, t)
    ]
    assert not bad, "the core or the build imports the SFT stage or the judge:\n" + _show(bad)


def test_only_the_sft_stage_and_the_cli_import_the_judge():
    """The judge library is the SFT stage's (built on its rules and audit) and the command
    line's (which plugs the summary audit into ``seam show`` and a judge into the gateway);
    every other part of ``pipeline`` reaches it through those plug-in points."""
    bad = [
        (m, t, line, how)
        for m, t, line, how in arrows()
        if m.startswith("pipeline")
        and group_of(t) == "judge"
        and group_of(m) not in ("pipeline.sft", "pipeline.cli")
        and not _allowed(m, t)
    ]
    assert not bad, "pipeline imports the judge library outside its plug-in points:\n" + _show(bad)


def test_only_the_cli_imports_command_modules():
    bad = [
        (m, t, line, how)
        for m, t, line, how in arrows()
        if group_of(t) == "pipeline.cli" and group_of(m) != "pipeline.cli" and not _allowed(m, t)
    ]
    assert not bad, "a command module imported outside pipeline/cli:\n" + _show(bad)


def test_groups_import_each_other_in_no_cycle():
    edges: dict[str, set[str]] = {}
    for m, t, _, _ in arrows():
        a, b = group_of(m), group_of(t)
        if a != b and not _allowed(m, t) and not {a, b} <= set(INPUT_LAYER):
            edges.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (cycle := walk(nxt, [*path, node])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            cycle = walk(start, [])
            assert cycle is None, "groups import each other in a cycle: " + " -> ".join(cycle)


def test_every_allowed_arrow_is_still_there():
    seen = {(m, t) for m, t, _, _ in arrows()}
    stale = [
        pair
        for pair in ALLOWED
        if not any(m == pair[0] and (t == pair[1] or t.startswith(pair[1] + ".")) for m, t in seen)
    ]
    assert not stale, f"ALLOWED entries that match no import any more, remove them: {stale}"
