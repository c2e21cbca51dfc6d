"""The plug-in point of a build: a stage that adds work per rollout, columns and side files.

A plain RL build has no stage. ``seam build-sft`` plugs in ``judge.sft.SftStage``
(corrections, filters, audit columns, preference pairs). A stage has two parts, because
the build runs in several processes:

- ``BuildStage``, in the process that plans and finalizes the build. It is pickled to
  every worker (keep it a small configuration object), says which extra columns its
  rows carry, what belongs in the build's fingerprint, and merges the tasks' side files
  at the end.
- ``TaskStage``, opened by ``BuildStage.open_task`` inside a worker for one task: it
  sees each rollout before and after segmentation, gives the extra column values of the
  rollout's rows, and writes its side files when the task closes.

The call order per task (``pipeline/worker.py``): ``open_task``; then per rollout
``prepare`` → (segment, mask) → ``keep_segment`` for each segment → ``accept``; then
``close``. Once all tasks are done the build calls ``finalize`` (``pipeline/build.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.mask import MaskedSegment
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

    # Extra shard columns, after the standard ones (``pipeline/shard_schema.py``).
    extra_fields: Sequence[pa.Field]

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
