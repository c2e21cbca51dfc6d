"""The plug-in point of a build: a stage that adds work per rollout, columns and side files.

A plain RL build has no stage. ``seam build-sft`` plugs in ``pipeline.sft.stage.SftStage``
(corrections, filters, audit columns, preference pairs). A stage has two parts, because
the build runs in several processes:

- ``BuildStage``, in the process that plans and finalizes the build. It is pickled to
  every worker (keep it a small configuration object), says which extra columns its
  rows carry, what belongs in the build's fingerprint, and merges the tasks' side files
  at the end.
- ``TaskStage``, opened by ``BuildStage.open_task`` inside a worker for one task: it
  sees each rollout before and after segmentation, gives the extra column values of the
  rollout's rows, and writes its side files when the task closes.

The call order per task (``pipeline/build/worker.py``): ``open_task``; then per rollout
``prepare`` → (segment, mask) → ``keep_segment`` for each segment → ``accept``; then
``close``. Once all tasks are done the build calls ``finalize`` (``pipeline/build/run.py``).

**The registry.** A build's ``manifest.json`` names its stage by registered name
(``"kind"``: ``"rl"`` for a plain build, ``"sft"`` for ``build-sft``) and records the
stage's ``fingerprint()`` under ``config.stage``. ``seam verify``, ``show``, ``export``
and the dataset card resolve the stage from those two (``stage_of_manifest``) and ask it
what they need — the rollout as the stage built it (``as_built``), whether it drops
segments, which counts are quarantine entries that are not rollouts, its trainer mode and
its side datasets — so no command branches on a stage's name and none imports a stage's
code. A stage is registered by a ``seam.stages`` entry point of an installed package
(seam's SFT stage is one: the build and readers never import it by name), or in a
process by ``register_stage(name, cls)`` (a class, or its ``"package.module:Class"``
import string, imported only when a build of that kind is read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pipeline.common.errors import SeamError
from pipeline.common.registry import resolve

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.core.mask import MaskedSegment
    from schemas.rollout import Rollout


class TaskStage(Protocol):
    """A stage's per-task side, in a build worker."""

    def prepare(self, rollout: Rollout) -> tuple[Rollout | None, str | None, list[dict]]:
        """Before segmentation: ``(rollout to build, or None to leave it out; the reason it
        is left out; quarantine entries for records attached to it)``. A rollout left out
        is counted under its reason, never dropped silently."""
        ...

    def keep_segment(self, num_tokens: int) -> bool:
        """Whether a segment of this many tokens becomes a row (dropped ones are counted)."""
        ...

    def accept(self, rollout: Rollout, segments: Sequence[MaskedSegment]) -> dict[str, list]:
        """The rollout became rows: the values of the stage's extra columns, one list per
        column with one value per segment. Raising ``ValueError`` quarantines the rollout
        (before any of its rows is written)."""
        ...

    def close(self) -> dict[str, Any]:
        """Write the task's side files; counts to add to the task's statistics."""
        ...


class BuildStage(Protocol):
    """A stage's build-wide side: configuration, columns, fingerprint, final merge."""

    # Extra shard columns, after the standard ones (``pipeline/core/shard_schema.py``).
    extra_fields: Sequence[pa.Field]
    # What readers of the build ask of it (``PlainStage`` has the defaults).
    requires_outcome: ClassVar[bool]
    drops_segments: ClassVar[bool]
    quarantine_counts: ClassVar[tuple[str, ...]]
    trl_mode: ClassVar[str]
    side_datasets: ClassVar[Mapping[str, str]]

    def as_built(self, rollout: Rollout) -> Rollout:
        """The rollout as the stage turned it into rows (``PlainStage.as_built``)."""
        ...

    def fingerprint(self) -> dict[str, Any]:
        """Everything of the stage that changes the output bytes (for the manifest and the
        up-to-date check): options and hashes of the files it reads."""
        ...

    def open_task(self, out: str, task_index: int) -> TaskStage:
        """The stage for one task of the build writing to ``out``."""
        ...

    def finalize(
        self,
        out: str,
        task_indices: list[int],
        dest: Path | None = None,
        excluded: dict[int, set[int]] | None = None,
    ) -> dict[str, Any]:
        """Merge the tasks' side files into the build's outputs, written into ``dest`` (the
        build's staging directory, published with the shards); counts for the manifest.
        ``excluded``: per task index, the ordinals (in ``accept`` order) of rollouts the
        build took back out after their task ran (later copies of a duplicate id); nothing
        of theirs may reach the outputs."""
        ...


class PlainStage:
    """The build without a stage (``seam build-rl``), and the defaults of every stage: a
    stage class may inherit these and override what it changes."""

    # Every rollout needs an outcome (GRPO advantages need a reward).
    requires_outcome: ClassVar[bool] = True
    # The stage may leave out segments of an accepted rollout (verify then does not
    # demand that every call is in a row).
    drops_segments: ClassVar[bool] = False
    # Counts (in ``manifest.json``) of quarantine entries that are not rollouts.
    quarantine_counts: ClassVar[tuple[str, ...]] = ()
    # ``seam export --to trl``'s mode when none is given.
    trl_mode: ClassVar[str] = "grpo"
    # Side datasets the stage writes as ``NAME/NAME-*.parquet`` (a card config each),
    # with what each holds (a comment in the card's example).
    side_datasets: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def from_manifest(cls, recorded: Mapping[str, Any]) -> PlainStage:
        """The stage as a build recorded it (``manifest["config"]["stage"]``, the stage's
        ``fingerprint()``; empty when the build recorded none), for reading the build."""
        return cls()

    def as_built(self, rollout: Rollout) -> Rollout:
        """The rollout as this stage turned it into rows (calls numbered as in the
        shards' ``call_spans``), from the rollout as the build's inputs hold it."""
        return rollout


# A registered stage class derives from PlainStage (its defaults, overridden as needed).
StageClass = type[PlainStage]
PLAIN = "rl"
# Stages registered in this process (``register_stage``); the plain build always is.
_REGISTERED: dict[str, StageClass | str] = {PLAIN: PlainStage}
# Installed packages register stages as entry points of this group; seam's own SFT stage
# is one (pyproject.toml, [project.entry-points."seam.stages"]).
ENTRY_POINT_GROUP = "seam.stages"
# seam's own entry points as pyproject.toml declares them, for an install whose package
# metadata predates them (an editable install made before they existed): used only when
# the installed metadata has no entry point of that name. tests/test_stage_registry.py
# checks that the two agree.
SHIPPED_ENTRY_POINTS: dict[str, str] = {"sft": "pipeline.sft.stage:SftStage"}


class UnknownStageError(SeamError, ValueError):
    """A build names a stage no registry entry resolves: one line."""


def register_stage(name: str, stage: StageClass | str) -> None:
    """Register a stage class (or its ``"module:Class"`` import string) under ``name``,
    the ``kind`` its builds' manifests record."""
    _REGISTERED[name] = stage


def stage_class(name: str) -> StageClass:
    """The stage class registered as ``name``: registered in this process, else a
    ``seam.stages`` entry point of an installed package (seam's own included), else one of
    ``SHIPPED_ENTRY_POINTS``. Resolving a name imports its module; nothing else does."""
    found = _REGISTERED.get(name)
    if found is None:
        points = [p for p in entry_points(group=ENTRY_POINT_GROUP) if p.name == name]
        found = points[0].value if points else SHIPPED_ENTRY_POINTS.get(name)
        if found is None:
            known = ", ".join(sorted({*_REGISTERED, *SHIPPED_ENTRY_POINTS}))
            raise UnknownStageError(
                f"no seam stage is registered as {name!r} (known: {known}); install the "
                f"package that provides it (entry point group {ENTRY_POINT_GROUP!r})"
            )
    if isinstance(found, str):
        found = resolve(found)
        _REGISTERED[name] = found
    return found


def stage_of_manifest(manifest: Mapping[str, Any]) -> PlainStage:
    """The stage of a finished build, from its ``manifest.json`` (a dict or a
    ``pipeline.build.manifest.Manifest``): the class registered as its ``kind``, configured from
    its recorded ``config.stage``."""
    kind = manifest.get("kind") or PLAIN
    recorded = (manifest.get("config") or {}).get("stage") or {}
    return stage_class(kind).from_manifest(recorded)
