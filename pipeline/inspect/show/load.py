"""Find one rollout for ``seam show``: in a build directory (its shard rows, and the
rollout re-read from the build's inputs) or in raw inputs (segmented and masked on the
fly with the build's own functions)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from pipeline.build.manifest import Manifest, build_tokenizer
from pipeline.common.errors import SeamError
from pipeline.inspect.show.model import (
    SEGMENT_COLUMNS,
    RolloutView,
    attach_rewrites,
    call_notes,
    mark_drift,
    message_texts,
    segment_view,
)
from schemas.rollout import Rollout


class ShowError(SeamError, ValueError):
    """No such rollout, or a query that is not allowed here: one line."""


def is_build(path: str | Path) -> bool:
    return (Path(path) / "manifest.json").is_file()


def load_view(
    target: str | Path,
    rollout_id: str | None = None,
    where: str | None = None,
    tokenizer: str | None = None,
    chat_template: str | None = None,
) -> RolloutView:
    """The view of one rollout of ``target`` (a build directory or input files):
    ``rollout_id``, else the first rollout ``where`` (SQL over the ``rollouts`` view of a
    build) selects, else the first rollout."""
    if is_build(target):
        if chat_template is not None:  # the build's template is its manifest's
            raise ShowError(
                "--chat-template applies to raw inputs; a build directory is shown with the "
                "template it was built with"
            )
        return _from_build(Path(target), rollout_id, where, tokenizer)
    if where:
        raise ShowError("--where needs a build directory (SQL runs over its views)")
    return _from_inputs(str(target), rollout_id, tokenizer, chat_template)


def build_rollout_ids(build: Path, where: str | None = None, limit: int | None = None) -> list[str]:
    """Rollout ids of a build in build order, filtered by a SQL condition on ``rollouts``."""
    from pipeline.inspect.duckdb_views import connect

    manifest = Manifest.read(build)
    ordered: dict[str, None] = dict.fromkeys(
        i
        for name in manifest.shards
        for i in pq.read_table(Path(build) / name, columns=["rollout_id"])[0].to_pylist()
    )
    if where:
        sql = f"SELECT rollout_id FROM rollouts WHERE {where}"
        try:
            matching = {r[0] for r in connect(build).execute(sql).fetchall()}
        except Exception as exc:  # duckdb's parser and binder errors: one line for the user
            raise ShowError(f"--where {where!r}: {str(exc).splitlines()[0]}") from None
        return [i for i in ordered if i in matching][:limit]
    return list(ordered)[:limit]


def _from_build(build: Path, rollout_id: str | None, where: str | None, tokenizer) -> RolloutView:
    from pipeline.inspect.verify import VerifyError, rollouts_from_inputs

    manifest = Manifest.read(build)
    if rollout_id is None:
        ids = build_rollout_ids(build, where, 1)
        if not ids:
            raise ShowError(f"no rollout of {build} matches --where {where!r}")
        rollout_id = ids[0]
    rows = []
    for name in manifest.shards:
        names = pq.read_schema(build / name).names
        columns = [c for c in [*SEGMENT_COLUMNS, "context_fidelity"] if c in names]
        filters = [("rollout_id", "==", rollout_id)]  # row groups without it are not read
        rows += pq.read_table(build / name, columns=columns, filters=filters).to_pylist()
    if not rows:
        raise ShowError(
            f"{build} has no rollout {rollout_id!r} (seam sql {build} 'SELECT rollout_id FROM rollouts')"
        )
    rows = _first_rollout(rows)
    renderer = build_tokenizer(manifest, tokenizer)
    rollout, note = None, None
    try:
        found = rollouts_from_inputs(build, manifest, {rollout_id}).get(rollout_id)
        # calls numbered as the build's stage numbered them (``BuildStage.as_built``)
        rollout = manifest.stage().as_built(found[0]) if found else None
        note = None if found else "the rollout is not in the build's inputs"
    except VerifyError as exc:
        note = f"rewrite details, corrections and audit unavailable: {exc}"
    return _view(rows, renderer, rollout, str(build), note)


def _first_rollout(rows: list[dict]) -> list[dict]:
    """The rows of the first rollout with the id (ids may repeat across files)."""
    out: list[dict] = []
    for row in rows:
        if row["segment_index"] == 0 and out:
            break
        out.append(row)
    return out


def _from_inputs(target: str, rollout_id, tokenizer, chat_template) -> RolloutView:
    from pipeline.inspect.verify import iter_input_rollouts
    from pipeline.sources.files import InputError, resolve_inputs

    try:
        paths = resolve_inputs([target])
    except InputError as exc:
        raise ShowError(str(exc)) from None
    wanted = {rollout_id} if rollout_id else None
    rollout = next(iter_input_rollouts(paths, "auto", wanted), None)
    if rollout is None:
        what = f"rollout {rollout_id!r}" if rollout_id else "valid rollout"
        raise ShowError(f"{target} holds no {what} (seam ingest {target} --out DIR says why)")
    return view_of_rollout(rollout, tokenizer, chat_template, origin=target)


def view_of_rollout(
    rollout: Rollout,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    origin: str = "rollout",
) -> RolloutView:
    """Segment and mask one rollout as a build would (advantage 0: no group here)."""
    from pipeline.build.worker import segmenter_with
    from pipeline.core.advantage import trainable_tokens_after
    from pipeline.core.fidelity import segment_fidelity
    from pipeline.core.rows import RowOptions, call_span_rows, masked_segments

    segmenter = segmenter_with(tokenizer, chat_template)
    masked, _ = masked_segments(rollout, segmenter, RowOptions(require_outcome=False))
    after = trainable_tokens_after([m.num_trainable_tokens for m in masked])
    fidelity = segment_fidelity(rollout, [m.segment for m in masked])
    rows = []
    for i, m in enumerate(masked):
        seg = m.segment
        rows.append(
            {
                "rollout_id": rollout.rollout_id,
                "task_id": rollout.task_id,
                "source": rollout.source,
                "segment_index": i,
                "input_ids": seg.tokens,
                "loss_mask": m.loss_mask,
                "call_spans": call_span_rows(m),
                "seam_kind": seg.seam_kind,
                "seam_trigger": seg.seam_trigger,
                "drift_realigned": seg.drift_realigned,
                "truncated": any(s.truncated for s in seg.spans),
                "reward": rollout.reward,
                "advantage": 0.0,
                "trainable_tokens_after": after[i],
                "context_fidelity": fidelity[i],
            }
        )
    return _view(rows, segmenter.renderer, rollout, origin, None)


def _view(rows: list[dict], renderer, rollout: Rollout | None, origin: str, note) -> RolloutView:
    segments = [segment_view(r, renderer) for r in rows]
    if rollout is not None:
        attach_rewrites(segments, rollout)
    spans = [s for seg in segments for s in seg.spans]
    notes = call_notes(rollout, spans)
    if rollout is not None:
        mark_drift(notes, segments, rollout, renderer)
    first = rows[0] if rows else {}
    reward = first.get("reward")
    return RolloutView(
        rollout_id=first.get("rollout_id", rollout.rollout_id if rollout else "?"),
        task_id=first.get("task_id", ""),
        source=first.get("source", ""),
        reward=None if reward is None or reward != reward else float(reward),
        segments=segments,
        calls=notes,
        origin=origin,
        decode=renderer.decode,
        names=message_texts(rollout),
        note=note,
    )
