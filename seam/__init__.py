"""seam from Python: read rollouts, segment and mask them, look at them, open builds.

Everything public is in ``__all__``; examples (executed by the tests) are in
docs/python.md and the README::

    import seam

    rollout = next(seam.read("data/sample/rollouts.jsonl.zst"))
    for s in seam.segment(rollout):
        print(s.segment.seam_kind, len(s.segment.tokens), s.num_trainable_tokens)
    print(seam.render(rollout, segment=0))  # the text, trained outputs marked
    seam.show(rollout)  # in Jupyter: the `seam show --html` page

    ds = seam.dataset("out/rl")  # datasets.Dataset
    df = seam.frame("out/rl")  # polars.LazyFrame over the shards
    rel = seam.sql("out/rl", "SELECT * FROM rollouts WHERE num_compactions > 1")
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

from pipeline import __version__ as __version__  # the one version (pyproject reads it)
from pipeline.core.mask import MaskedSegment, MaskOptions
from pipeline.inspect.show.audits import register_call_audit
from pipeline.inspect.show.model import RolloutView
from schemas.rollout import Rollout

# The judge library's summary audit under each summary call of ``seam.show``, as the
# command line plugs it in (pipeline/cli/__init__.py; the inspect layer imports no judge).
register_call_audit("summary", "judge.audit:call_findings")

__all__ = [
    "MaskedSegment",
    "Rollout",
    "RolloutView",
    "dataset",
    "frame",
    "read",
    "render",
    "segment",
    "show",
    "sql",
    "verify",
]


def read(
    path: str | Path, format: str = "auto", quarantine: list[dict] | None = None
) -> Iterator[Rollout]:
    """The valid canonical rollouts in ``path`` (a file, directory or glob of any input
    format seam reads), in order, read by the build's steps (``pipeline/build/steps.py``: read
    → drop duplicates, the first rollout of an id kept). Records a build would quarantine
    are left out; pass a list as ``quarantine`` to receive their entries (file, line,
    format, reason), as a build's ``quarantine.jsonl`` holds them."""
    from pipeline.build.steps import DropDuplicates, Pipeline, ReadRecords, plan_reading

    _files, tasks = plan_reading([str(path)], format)
    sink = _ListSink([] if quarantine is None else quarantine)
    return Pipeline(ReadRecords(tasks), [DropDuplicates()], sink).rollouts()


class _ListSink:
    """``seam.read``'s quarantine: entries appended to the caller's list."""

    def __init__(self, entries: list[dict]):
        self.entries = entries

    def reject(self, rejection) -> None:
        self.entries.append(rejection.entry())


def segment(
    rollout: Rollout,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    mask_summaries: bool = False,
    last_call_only: bool = False,
) -> list[MaskedSegment]:
    """Cut one rollout at its seams and mask it, exactly as ``seam build-rl`` does: each
    ``MaskedSegment`` has ``.segment`` (``tokens``, ``spans``, ``seam_kind``, ...),
    ``.loss_mask`` and ``.num_trainable_tokens``."""
    from pipeline.build.worker import segmenter_with
    from pipeline.core.rows import RowOptions, masked_segments

    options = RowOptions(MaskOptions(mask_summaries, last_call_only), require_outcome=False)
    return masked_segments(rollout, segmenter_with(tokenizer, chat_template), options)[0]


def show(
    rollout: Rollout | str | Path,
    rollout_id: str | None = None,
    where: str | None = None,
    tokenizer: str | None = None,
    chat_template: str | None = None,
) -> RolloutView:
    """The ``seam show`` view of a rollout object, or of one rollout of a build directory
    or input file (``rollout_id``, or the first matching the SQL ``where``). Jupyter
    displays it as the HTML page (``_repr_html_``)."""
    from pipeline.inspect.show.load import load_view, view_of_rollout

    if isinstance(rollout, Rollout):
        return view_of_rollout(rollout, tokenizer, chat_template)
    return load_view(rollout, rollout_id, where, tokenizer, chat_template)


def render(
    rollout: Rollout | RolloutView | str | Path,
    segment: int | None = None,
    tokens: bool = False,
    rollout_id: str | None = None,
) -> str:
    """The terminal rendering of ``seam show`` without colour, as a string: each call's
    output between ``┌─ call N · kind · trained`` and ``└─ call N``, seams as banners."""
    from rich.console import Console

    from pipeline.inspect.show.terminal import print_view

    view = rollout if isinstance(rollout, RolloutView) else show(rollout, rollout_id)
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, color_system=None, highlight=False)
    print_view(view, console, segment, tokens)
    return buffer.getvalue()


def dataset(build_dir: str | Path, split: str = "train"):
    """The build's shards as a Hugging Face ``datasets.Dataset``."""
    from datasets import load_dataset

    return load_dataset("parquet", data_dir=str(build_dir), split=split)


def frame(build_dir: str | Path):
    """The build's shards as a ``polars.LazyFrame`` (one row per segment)."""
    import polars as pl

    return pl.scan_parquet(str(Path(build_dir) / "train-*.parquet"))


def sql(build_dir: str | Path, query: str = "SELECT * FROM segments"):
    """A DuckDB relation: ``query`` over the build's views (segments, calls, rollouts,
    quarantine, ...; see ``seam sql``). ``.pl()``, ``.df()``, ``.fetchall()`` read it."""
    from pipeline.inspect.duckdb_views import connect

    return connect(build_dir).sql(query)


def verify(build_dir: str | Path, mode: str = "all", tokenizer: str | None = None):
    """``seam verify`` without printing: a ``VerifyResult`` (``.ok``, ``.mismatches``,
    ``.by_source``, ``.by_rollout``)."""
    from pipeline.inspect.verify import verify_build

    return verify_build(build_dir, mode, tokenizer)
