"""``seam verify``: prove, row by row, that a build trains exactly what the policy generated.

The audit re-reads the build's inputs (their hashes must match the manifest), replays
each rollout and checks every shard row of it against the rollout itself, by a path
independent of the segmenter that wrote the row: whole contexts rendered in full by the
chat template (never from cached pieces) and token ids decoded back to text.

Per row (one segment):

- **Outputs**: each call span ``input_ids[start:start+length]`` is exactly the call's
  output — the logged ``output_ids`` compared as ids, else the template's rendering of
  the output compared as text (``decode(span) == generated text``). Its ``kind`` and
  ``truncated`` flags are the call's; logged log-probs sit at the span.
- **Mask**: ``loss_mask`` is 1 exactly on the trained spans (``trained`` as the build's
  options say: ``--mask-summaries``, ``--last-call-only``; a truncated rendered output's
  template-added end-of-turn token excluded) and 0 everywhere else; ``num_tokens`` and
  ``num_trainable_tokens`` agree.
- **Context**: every call's input is the prefix of the row up to its span — its logged
  ``prompt_ids`` as ids (as text where the segment realigned a re-tokenization drift),
  else the full rendering of the call's replayed context, as text. The segment's
  context is thereby what the canonical rollout records; ``context_fidelity`` (when the
  build has the column) must be what ``pipeline.core.fidelity`` derives from the rollout:
  ``["exact"]`` only where nothing is known to be missing, and never where the second
  witness (``pipeline/core/witness.py``: the harness's reported input tokens, re-read from
  the log, against the row's own call starts) shows a gap over the threshold;
  ``context_gap_tokens`` is the witness's, and no row names a reason the build
  excluded (``--exclude-fidelity``).
- **Coverage**: every call is trained in at most one row; in a build that drops no
  segment (no ``--drop-truncated``, no SFT length filter) every call is in a row.

Per build (``--verify all``): **every input rollout is accounted for** — it has rows, or
``quarantine.jsonl`` has an entry at its file and line, or it is one of the rollouts the
manifest counts as having left no rows (``rollouts_without_segments``: all segments
dropped by ``--drop-truncated`` or the SFT length filter), or one of the quarantined
entries counted past the quarantine's caps (``quarantine_not_written``). A rollout that
vanished without a counted reason is a mismatch naming its file and line.

Text comparisons use the tokenizer's own normalizer on the expected side (NFC for the
default tokenizer): the model received the normalized text, and decoding returns it.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.build.forked import can_fork, forked_map
from pipeline.build.manifest import InputRecord, Manifest, build_tokenizer
from pipeline.build.progress import counted
from pipeline.build.steps import (
    DAMAGED_MARK,
    DUPLICATE_REASON,
    Collect,
    DropDamaged,
    DropDuplicates,
    Item,
    Pipeline,
    ReadRecords,
    Sink,
    Step,
)
from pipeline.common.errors import SeamError
from pipeline.core.render import ChatRenderer, TemplateError, template_message
from pipeline.sources.limits import Limits
from pipeline.sources.read_context import ReadContext
from schemas.replay import CallView, replay
from schemas.rollout import Rollout

MODES = ("all", "sample", "none")
SAMPLE_MIN = 16  # rollouts a sample always covers (all of a smaller build)
SAMPLE_FRACTION = 1 / 50  # and this fraction of a larger one
# In a sample audit, calls per row whose whole context is rendered and compared (spread
# evenly, first and last included): rendering every call's context costs O(calls²) per
# segment, so a 10 k-call segment would cost ~500× a 1 k-call one instead of 10×.
SAMPLE_CONTEXTS_PER_ROW = 32
# Fewer call spans than this are checked in this process: forking the checkers costs
# ~0.1 s, about what checking 100 spans costs (~1 ms a span, most of it rendering the
# sampled contexts in full).
PARALLEL_MIN_SPANS = 200
ROW_COLUMNS = [
    "rollout_id",
    "source",
    "segment_index",
    "num_segments",
    "input_ids",
    "loss_mask",
    "logprobs",
    "call_spans",
    "drift_realigned",
    "num_tokens",
    "num_trainable_tokens",
]
FIDELITY_COLUMN = "context_fidelity"
GAP_COLUMN = "context_gap_tokens"


class VerifyError(SeamError, ValueError):
    """The build cannot be verified at all (missing manifest, changed input): one line."""


@dataclass(frozen=True)
class Mismatch:
    shard: str
    row: int  # 0-based row in the shard
    rollout_id: str
    segment_index: int | None
    what: str

    def line(self) -> str:
        seg = "" if self.segment_index is None else f" segment {self.segment_index}"
        where = self.shard if self.row < 0 else f"{self.shard} row {self.row}"
        return f"{where} (rollout {self.rollout_id}{seg}): {self.what}"


@dataclass
class VerifyResult:
    mode: str
    mismatches: list[Mismatch] = field(default_factory=list)
    by_source: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    by_rollout: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    # What verify's own reading quarantined (entries as in quarantine.jsonl): each one is
    # checked against the build's file. Not in the manifest.
    quarantined: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def totals(self) -> Counter:
        total: Counter = Counter()
        for counts in self.by_source.values():
            total.update(counts)
        return total

    def as_manifest(self) -> dict:
        """What ``manifest.json`` keeps under ``"verify"``."""
        return {
            "mode": self.mode,
            "ok": self.ok,
            "totals": dict(sorted(self.totals().items())),
            "by_source": {s: dict(sorted(c.items())) for s, c in sorted(self.by_source.items())},
            "by_rollout": {r: dict(sorted(c.items())) for r, c in sorted(self.by_rollout.items())},
            "mismatches": [m.line() for m in self.mismatches[:100]],
        }


@dataclass(frozen=True)
class _Options:
    mask_summaries: bool
    last_call_only: bool
    drops_segments: bool  # --drop-truncated, --exclude-fidelity or the SFT length filter
    excluded: frozenset[str] = frozenset()  # --exclude-fidelity: no row may carry these
    contexts_per_row: int | None = None  # None: every call's context is checked


def verify_build(
    build_dir: str | Path,
    mode: str = "all",
    tokenizer: str | None = None,
    progress: bool = False,
    workers: int | None = None,
    inputs_checked: bool = False,
) -> VerifyResult:
    """Check the rows of ``build_dir`` (every rollout, a sample, or none) against its inputs;
    ``progress`` shows a bar over the rollouts checked (on stderr). The rollouts are
    checked on ``workers`` processes (default: every core this process may use; 1: in
    this process); the result is the same either way. ``inputs_checked``: the caller has
    just established that the inputs are the ones the manifest records (the build that
    made ``build_dir``, whose every read block was the block it hashed), so their sha256
    is not computed again (0.2 s of a 2,000-rollout build's ``--verify sample``)."""
    if mode not in MODES:
        raise VerifyError(f"--verify must be one of {', '.join(MODES)}, not {mode!r}")
    out = Path(build_dir)
    manifest = Manifest.read(out)
    result = VerifyResult(mode)
    if mode == "none":
        return result
    config = manifest.config
    stage = manifest.stage()
    options = _Options(
        bool(config.get("mask_summaries")),
        bool(config.get("last_call_only")),
        bool(config.get("drop_truncated"))
        or bool(config.get("exclude_fidelity"))
        or stage.drops_segments,
        frozenset(config.get("exclude_fidelity") or ()),
        SAMPLE_CONTEXTS_PER_ROW if mode == "sample" else None,
    )
    renderer = build_tokenizer(manifest, tokenizer)
    shards = [out / name for name in manifest.shards]
    shard_ids = _shard_ids(shards)
    ids = list(dict.fromkeys(i for s in shards for i in shard_ids[s]))
    wanted = _sample(ids) if mode == "sample" else set(ids)
    rollouts: dict[str, list[Rollout]] = {}
    positions: list[tuple[str, int | None, str]] = []  # every valid input rollout, in order
    everything = None if mode == "all" else wanted  # "all" also reads rollouts without rows
    # The build's steps up to its rows: read → drop damaged → drop duplicates, with the
    # rollouts the build left out at a step verify does not replay (the stage, the rows)
    # taken out before the duplicate rule, as the build took them out (``_LeftOutByBuild``).
    built = _BuildQuarantine.of(out)
    sink = Collect()
    # The build's stage filters before its damage check (read → rewards → stage → damaged →
    # rows), so a damaged rollout the stage filtered is in quarantine.jsonl under the
    # stage's reason: verify takes the build's later-step entries out before its own damage
    # check, and leaves the damage entries to DropDamaged, which must find them there.
    steps: list[Step] = [_LeftOutByBuild(built, sink)]
    steps += [] if config.get("keep_damaged") else [DropDamaged()]
    steps += [DropDuplicates()]
    # The shards' wanted rows are read on threads (one shard each, ``workers`` at a time)
    # while this thread reads the inputs: Arrow decodes without the GIL, and reading the
    # rows (~0.6 CPU s of a 2,000-rollout sample verify) and the inputs (~0.2 s) no longer
    # wait for each other. An input error is still raised first.
    threads = max(1, min(len(shards), available_cores() if workers is None else workers))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="seam-verify-rows") as pool:
        shard_rows = [pool.submit(_wanted_rows, s, shard_ids[s], wanted) for s in shards]
        try:
            for file, line, rollout in _read_inputs(
                out, manifest, everything, sink, steps, check_sha256=not inputs_checked
            ):
                positions.append((file, line, rollout.rollout_id))
                if rollout.rollout_id in wanted:
                    rollouts.setdefault(rollout.rollout_id, []).append(rollout)
        except BaseException:
            for future in shard_rows:
                future.cancel()
            raise
        groups = _group_by_rollout(future.result() for future in shard_rows)
    result.quarantined = sink.entries()
    result.mismatches.extend(built.missing(result.quarantined, manifest))
    with_rows: Counter = Counter()  # per id, the rollouts of that id that have rows
    checks: list[_Check] = []
    for group in groups:
        rollout_id = group[0][2]["rollout_id"]
        with_rows[rollout_id] += 1
        candidates = rollouts.get(rollout_id, [])
        # Duplicate ids: the k-th group of rows of an id is the k-th accepted rollout. As
        # the build's stage turned it into rows (the SFT stage trims a dangling call and
        # may synthesize summary calls).
        checks.append(_Check(group, stage.as_built(candidates.pop(0)) if candidates else None))
    found = _run_checks(checks, renderer, options, workers, progress, mode)
    for check, mismatches in zip(checks, found):
        group = check.group
        rollout_id, source = group[0][2]["rollout_id"], group[0][2]["source"]
        counts: Counter = Counter()  # this group's (an id may name two rollouts)
        result.mismatches.extend(mismatches)
        counts["mismatches"] += len(mismatches)
        counts["rows"] += len(group)
        counts["spans"] += sum(len(r["call_spans"]) for _, _, r in group)
        counts["trained_tokens"] += sum(int(r["num_trainable_tokens"]) for _, _, r in group)
        result.by_rollout[rollout_id].update(counts)
        result.by_source[source].update(counts)
        result.by_source[source]["rollouts"] += 1
    if mode == "all":
        result.mismatches.extend(_unaccounted(out, manifest, positions, with_rows))
    return result


@dataclass(frozen=True)
class _Check:
    """One rollout's rows (``_group_by_rollout``'s group) and the rollout as the build's stage
    turned it into rows (None: no rollout of that id was read)."""

    group: list[tuple]
    rollout: Rollout | None

    @property
    def spans(self) -> int:
        return sum(len(r["call_spans"]) for _, _, r in self.group)


def _run_checks(
    checks: list[_Check],
    renderer: ChatRenderer,
    options: _Options,
    workers: int | None,
    progress: bool,
    mode: str,
) -> list[list[Mismatch]]:
    """Each check's mismatches, in the checks' order. On ``workers`` processes forked
    from this one (``pipeline/build/forked.py``: they inherit the rows, the rollouts and
    the loaded tokenizer) when there is enough to check; else here."""
    workers = available_cores() if workers is None else workers
    run = partial(_check_rollout, renderer=renderer, options=options)
    label = f"verifying ({mode})"
    spans = [c.spans for c in checks]
    if workers < 2 or len(checks) < 2 or sum(spans) < PARALLEL_MIN_SPANS or not can_fork():
        return list(counted(map(run, checks), progress, len(checks), label))
    found: list[list[Mismatch]] = [[] for _ in checks]
    longest_first = sorted(range(len(checks)), key=lambda i: -spans[i])
    done = forked_map(run, checks, workers, first=longest_first)
    for i, mismatches in counted(done, progress, len(checks), label):
        found[i] = mismatches
    return found


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _check_rollout(check: _Check, renderer: ChatRenderer, options: _Options) -> list[Mismatch]:
    """The mismatches of one rollout's rows (``_RolloutCheck``)."""
    shard, row, first = check.group[0]
    if check.rollout is None:
        return [
            Mismatch(shard, row, first["rollout_id"], None, "no rollout with this id in the inputs")
        ]
    try:
        return _RolloutCheck(check.rollout, renderer, options).run(check.group)
    except TemplateError as exc:  # the build rendered it, so this is a mismatch too
        return [Mismatch(shard, row, first["rollout_id"], None, f"cannot render: {exc}")]


def _unaccounted(
    out: Path, manifest: Manifest, positions: list[tuple[str, int | None, str]], with_rows: Counter
) -> list[Mismatch]:
    """Input rollouts with no rows, no quarantine entry at their place, and beyond the
    manifest's count of rollouts that left no rows (module docstring)."""
    quarantined = set()
    path = out / "quarantine.jsonl"
    if path.is_file():
        with open(path, encoding="utf-8") as fh:
            for text in fh:
                entry = json.loads(text)
                quarantined.add((str(entry.get("file")), entry.get("line")))
    left = with_rows.copy()
    missing = []
    for file, line, rollout_id in positions:
        if left[rollout_id] > 0:
            left[rollout_id] -= 1
        elif (file, line) not in quarantined:
            missing.append((file, line, rollout_id))
    rowless = manifest.count("rollouts_without_segments")
    if len(missing) == rowless:
        return []
    # Entries past the quarantine's caps are counted, not written: that many quarantined
    # rollouts may have no entry (the count is exact, the places are not kept).
    not_written = manifest.count("quarantine_not_written")
    if rowless < len(missing) <= rowless + not_written:
        return []
    if len(missing) < rowless:
        what = (
            f"the manifest counts {rowless} rollout(s) without rows, the inputs and shards "
            f"show {len(missing)}"
        )
        return [Mismatch("manifest.json", -1, "-", None, what)]
    what = (
        "no rows and no quarantine entry: the build lost it without a counted reason "
        f"({len(missing)} such input rollouts, the manifest counts {rowless} without rows)"
    )
    return [
        Mismatch(f"{file}:{line}" if line is not None else file, -1, rollout_id, None, what)
        for file, line, rollout_id in missing[rowless:]
    ]


def _shard_ids(shards: list[Path]) -> dict[Path, list[str]]:
    """Each shard's ``rollout_id`` column, row by row."""
    ids = {}
    for shard in shards:
        with pq.ParquetFile(shard) as f:
            ids[shard] = f.read(columns=["rollout_id"])["rollout_id"].to_pylist()
    return ids


def _sample(ids: list[str]) -> set[str]:
    """A deterministic sample: the rollouts whose id hashes lowest (same build, same sample)."""
    n = max(SAMPLE_MIN, int(len(ids) * SAMPLE_FRACTION))
    return set(sorted(ids, key=lambda i: hashlib.sha256(i.encode()).digest())[:n])


TOKEN_COLUMNS = ("input_ids", "loss_mask", "logprobs")
# numpy's dtype of each primitive Arrow type a per-token column holds.
NUMPY_TYPES = {
    pa.int8(): np.int8,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}


def _rows(table: pa.Table) -> list[dict]:
    """The table's rows as dicts, the per-token columns as numpy arrays (as Python lists a
    row of 4 M tokens would take ~400 MB per column)."""
    per_token = [c for c in TOKEN_COLUMNS if c in table.column_names]
    rows = table.drop_columns(per_token).to_pylist()
    for name in per_token:
        column = table[name]
        for i, row in enumerate(rows):
            value = column[i]
            row[name] = list_values(value.values) if value.is_valid else None
    return rows


def list_values(values: pa.Array) -> np.ndarray:
    """A list cell's values as a read-only numpy view of its Arrow buffer. Not
    ``Array.to_numpy``: its first call imports pandas (0.3-0.9 s, a third of a sample
    audit), which nothing else in a build process imports. Nulls, or a type without a
    fixed-width numpy twin, go through ``to_numpy``."""
    dtype = NUMPY_TYPES.get(values.type)
    if dtype is None or values.null_count:
        return values.to_numpy(zero_copy_only=False)
    size = np.dtype(dtype).itemsize
    return np.frombuffer(
        values.buffers()[1], dtype=dtype, count=len(values), offset=values.offset * size
    )


def _group_by_rollout(shard_rows: Iterable[list[tuple]]) -> list[list[tuple]]:
    """Rows of the shards in order (``_wanted_rows`` of each), one group per rollout: a
    group starts at segment 0 or at another id (a rollout's rows may span two shards)."""
    groups: list[list[tuple]] = []
    for rows in shard_rows:
        for name, row_index, row in rows:
            previous = groups[-1][-1][2] if groups else None
            if (
                previous is None
                or row["segment_index"] == 0
                or previous["rollout_id"] != row["rollout_id"]
            ):
                groups.append([])
            groups[-1].append((name, row_index, row))
    return groups


def _wanted_rows(shard: Path, ids: list[str], wanted: set[str]) -> list[tuple]:
    """The rows of ``shard`` whose rollout is wanted, in row order, as (shard name, row,
    row dict). Only the row groups holding one are read (``ParquetFile``, not a filtered
    ``read_table``: that imports ``pyarrow.dataset`` and pandas, 0.4-1 s)."""
    rows_at = [i for i, rollout_id in enumerate(ids) if rollout_id in wanted]
    if not rows_at:
        return []
    found: list[tuple] = []
    with pq.ParquetFile(shard) as f:
        names = f.schema_arrow.names
        columns = ROW_COLUMNS + [c for c in (FIDELITY_COLUMN, GAP_COLUMN) if c in names]
        sizes = [f.metadata.row_group(g).num_rows for g in range(f.num_row_groups)]
        starts = np.cumsum([0, *sizes]).tolist()
        in_group: dict[int, list[int]] = defaultdict(list)  # in row order
        for i in rows_at:
            in_group[bisect.bisect_right(starts, i) - 1].append(i)
        for g, at in in_group.items():
            table = _read_rows_to(f, g, at[-1] - starts[g], columns)
            picked = pa.concat_tables([table.slice(i - starts[g], 1) for i in at])
            for row_index, row in zip(at, _rows(picked)):
                if row["rollout_id"] != ids[row_index]:
                    raise VerifyError(f"{shard}: row {row_index} changed while verify read it")
                found.append((shard.name, row_index, row))
    return found


ROWS_PER_BATCH = 16  # rows decoded at a time when reading a row group up to a wanted row


def _read_rows_to(f: pq.ParquetFile, group: int, last: int, columns: list[str]) -> pa.Table:
    """Rows ``0..last`` (at least) of row group ``group``: decoded a batch at a time and no
    further than the batch holding row ``last``. A sample's wanted rows are spread over
    nearly every row group (40 rollouts of 2,000 touch 22 of 24), so reading each group
    whole decoded about every token of the build; up to its last wanted row it is about
    half (and ``read_row_group``'s threads cost more CPU than they saved here)."""
    batches, rows = [], 0
    for batch in f.iter_batches(
        batch_size=ROWS_PER_BATCH, row_groups=[group], columns=columns, use_threads=False
    ):
        batches.append(batch)
        rows += batch.num_rows
        if rows > last:
            break
    return pa.Table.from_batches(batches)  # a wanted row: never empty


def rollouts_from_inputs(
    build_dir: Path, manifest: Manifest | dict, wanted: set[str]
) -> dict[str, list[Rollout]]:
    """The wanted rollouts from the build's inputs, per id in input order."""
    found: dict[str, list[Rollout]] = {}
    for _, _, rollout in _read_inputs(build_dir, Manifest.of(manifest), wanted):
        found.setdefault(rollout.rollout_id, []).append(rollout)
    return found


def input_path(build_dir: Path, entry: InputRecord) -> Path:
    """Where a manifest input is now: its path as given when that resolves from here (the
    directory the build ran in), else its place relative to the build directory."""
    given = Path(entry.path)
    if given.is_file() or given.is_absolute() or entry.from_out is None:
        return given
    beside = Path(build_dir) / entry.from_out
    return beside if beside.is_file() else given


def _read_inputs(
    build_dir: Path,
    manifest: Manifest,
    wanted: set[str] | None,
    sink: Sink | None = None,
    steps: Sequence[Step] = (),
    check_sha256: bool = True,
) -> Iterator[tuple[str, int | None, Rollout]]:
    """``iter_input_records`` over the build's inputs, each named as the build named it;
    each input's sha256 first checked against the manifest's (``check_sha256``)."""
    from pipeline.common.hashing import file_sha256

    paths, names = [], {}
    for entry in manifest.inputs:
        path = input_path(build_dir, entry)
        if not path.is_file():
            raise VerifyError(
                f"input {entry.path} of the build is gone (looked from here and from "
                f"{build_dir}); verify where the inputs are"
            )
        if check_sha256 and file_sha256(path) != entry.sha256:
            raise VerifyError(f"input {path} changed since the build (sha256 differs); rebuild")
        paths.append(path)
        names[str(path)] = entry.path
    config = manifest.config
    # read as the build read them: its record limits and its --group-by
    context = ReadContext.of(Limits(**config.get("limits", {})), config.get("group_by"))
    yield from iter_input_records(
        paths, config.get("format", "auto"), wanted, context, sink, steps, names
    )


def iter_input_rollouts(
    paths: list[Path],
    fmt: str = "auto",
    wanted: set[str] | None = None,
    context: ReadContext | None = None,
) -> Iterator[Rollout]:
    """The valid rollouts of input files (any reader, through ``pipeline.sources.intake``), in
    input order; only those with an id in ``wanted`` when given (canonical records of
    other ids are not even parsed)."""
    for _, _, rollout in iter_input_records(paths, fmt, wanted, context):
        yield rollout


def iter_input_records(
    paths: list[Path],
    fmt: str = "auto",
    wanted: set[str] | None = None,
    context: ReadContext | None = None,
    sink: Sink | None = None,
    steps: Sequence[Step] = (),
    names: dict[str, str] | None = None,
) -> Iterator[tuple[str, int | None, Rollout]]:
    """``iter_input_rollouts`` with each rollout's file and line, named as the build's
    quarantine names them (``names``: a file's name in the build, when it differs), read by
    the shared steps (``pipeline/build/steps.py``): ``ReadRecords``, then ``steps``; what they
    quarantine goes to ``sink`` (else nowhere: the build counted it)."""
    from pipeline.sources.files import plan_tasks

    keep = None if wanted is None else (lambda data: _names_one_of(data, wanted))
    # Planned as the build planned them: the files of one session are one task (one
    # rollout per session); whole files (no ranges); a stray file is quarantined, as the
    # build quarantined it.
    context = context or ReadContext()
    with context.active():  # detection reads under the build's limits too
        tasks = plan_tasks(list(paths), fmt, 1 << 62, walked=frozenset(paths))
    read = ReadRecords(tasks, context, keep=keep, names=names)
    for item in Pipeline(read, list(steps), sink or Collect()):
        if wanted is None or item.rollout.rollout_id in wanted:
            yield item.file, item.line, item.rollout


class _BuildQuarantine:
    """The build's ``quarantine.jsonl``, by place (file, line): what verify's own steps
    quarantine must be there with the same reason."""

    def __init__(self, entries: list[dict]):
        self.at: dict[tuple[str, int | None], list[str]] = defaultdict(list)
        for entry in entries:
            self.at[(str(entry.get("file")), entry.get("line"))].append(str(entry.get("reason")))

    @classmethod
    def of(cls, out: Path) -> _BuildQuarantine:
        path = out / "quarantine.jsonl"
        if not path.is_file():
            return cls([])
        with open(path, encoding="utf-8") as fh:
            return cls([json.loads(text) for text in fh])

    def take_later_step(self, place: tuple[str, int | None], own: list[str]) -> bool:
        """Take out (once) an entry at ``place`` for a reason found after reading, at a
        step verify does not replay (the stage's filter, the rows): not a duplicate, which
        verify decides itself, nor one of ``own``, the reasons verify's steps gave records
        at the same place (a reader may reject a record at a rollout's line)."""
        reasons = self.at.get(place, [])
        mine = Counter(own)
        for i, reason in enumerate(reasons):
            if reason.startswith(DUPLICATE_REASON) or DAMAGED_MARK in reason:
                continue  # verify's own steps decide these (DropDuplicates, DropDamaged)
            if mine[reason] > 0:
                mine[reason] -= 1
                continue
            del reasons[i]
            return True
        return False

    def missing(self, entries: list[dict], manifest: Manifest) -> list[Mismatch]:
        """Verify's quarantine entries that the build's file lacks (beyond the entries the
        build counted past its caps, ``quarantine_not_written``)."""
        have = Counter((k[0], k[1], r) for k, reasons in self.at.items() for r in reasons)
        lacking = []
        for entry in entries:
            key = (entry["file"], entry["line"], entry["reason"])
            if have[key] > 0:
                have[key] -= 1
            else:
                lacking.append(entry)
        not_written = int(manifest.counts.get("quarantine_not_written", 0))
        if len(lacking) <= not_written:
            return []
        return [
            Mismatch(
                f"{e['file']}:{e['line']}" if e["line"] is not None else e["file"],
                -1,
                "-",
                None,
                f"read as the build reads it, this record is quarantined ({e['reason']}), "
                "but the build's quarantine.jsonl has no such entry",
            )
            for e in lacking
        ]


class _LeftOutByBuild(Step):
    """A rollout the build quarantined at a step verify does not replay (an entry at its
    place in ``quarantine.jsonl``) leaves verify's steps here, unrecorded: the build's
    entry is the record of it, and it must not take a later copy's place as the first of
    its id."""

    name = "left_out_by_build"

    def __init__(self, built: _BuildQuarantine, sink: Collect):
        super().__init__()
        self.built = built
        self.sink = sink  # verify's own rejections so far
        self.own: dict[tuple[str, int | None], list[str]] = defaultdict(list)
        self.indexed = 0

    def process(self, item: Item) -> Item | None:
        for rejection in self.sink.rejections[self.indexed :]:
            self.own[(rejection.file, rejection.line)].append(rejection.reason)
        self.indexed = len(self.sink.rejections)
        place = (item.file, item.line)
        if self.built.take_later_step(place, self.own.get(place, [])):
            self.stats.counts["left_out_by_build"] += 1
            return None
        return item


# A "rollout_id" key and its JSON string value (a parent_rollout_id never matches: the
# key must start right after its quote).
ROLLOUT_ID_KEY = b'"rollout_id"'
ROLLOUT_ID_FIELD = re.compile(re.escape(ROLLOUT_ID_KEY) + rb'\s*:\s*("(?:[^"\\]|\\.)*")')


def _names_one_of(record: bytes, ids: set[str]) -> bool:
    """Whether a canonical JSON record may be one of ``ids``: some ``"rollout_id"`` field
    in it holds one (cheaper than parsing every record for a sample).

    The key is found with ``bytes.find`` and the field matched there: the same matches,
    in order, as ``ROLLOUT_ID_FIELD.findall`` (a match resumes the search at its end),
    but a record is scanned at memchr speed, not by the regex engine (which tried the
    pattern at every byte: a tenth of a sample verify's reading, at 2,000 rollouts)."""
    at = record.find(ROLLOUT_ID_KEY)
    while at >= 0:
        field = ROLLOUT_ID_FIELD.match(record, at)
        if field is None:
            at = record.find(ROLLOUT_ID_KEY, at + 1)
            continue
        try:
            if json.loads(field.group(1)) in ids:
                return True
        except ValueError:
            return True  # let the parser decide
        at = record.find(ROLLOUT_ID_KEY, field.end())
    return False


class _RolloutCheck:
    """The checks of one rollout's rows (module docstring)."""

    def __init__(self, rollout: Rollout, renderer: ChatRenderer, options: _Options):
        self.rollout = rollout
        self.r = renderer
        self.options = options
        self.calls: list[CallView] = replay(rollout)
        self.tools = rollout.tools or None
        normalizer = renderer.backend.normalizer
        self.normalize = normalizer.normalize_str if normalizer is not None else (lambda t: t)

    def run(self, group: list[tuple]) -> list[Mismatch]:
        found: list[Mismatch] = []
        covered: set[int] = set()
        for position, (shard, row_index, row) in enumerate(group):
            for what in self._row(row, position, len(group), covered):
                found.append(
                    Mismatch(shard, row_index, row["rollout_id"], row["segment_index"], what)
                )
        missing = [c.index for c in self.calls if c.index not in covered]
        if missing and not self.options.drops_segments:
            shard, row_index, row = group[-1]
            found.append(
                Mismatch(
                    shard,
                    row_index,
                    row["rollout_id"],
                    None,
                    f"call(s) {missing[:5]} of the rollout are in no row",
                )
            )
        if FIDELITY_COLUMN in group[0][2]:
            found += self._fidelity(group)
        return found

    def _row(self, row: dict, position: int, rows: int, covered: set[int]) -> Iterator[str]:
        tokens = np.asarray(row["input_ids"], dtype=np.int64)
        mask = np.asarray(row["loss_mask"], dtype=np.int64)
        if row["segment_index"] != position or row["num_segments"] != rows:
            yield f"segment_index {row['segment_index']} of {row['num_segments']}, expected {position} of {rows}"
        if len(tokens) != row["num_tokens"] or len(mask) != len(tokens):
            yield f"{len(tokens)} input_ids, {len(mask)} loss_mask values, num_tokens {row['num_tokens']}"
            return
        spans = row["call_spans"]
        if not spans:
            yield "a row without call spans"
            return
        expected = np.zeros(len(tokens), dtype=np.int64)
        text = _RowText(self.r, tokens, spans)
        last = len(spans) - 1
        with_context = spread(len(spans), self.options.contexts_per_row)
        for j, span in enumerate(spans):
            index = span["call_index"]
            if not 0 <= index < len(self.calls):
                yield f"call span {j} names call {index}; the rollout has {len(self.calls)} calls"
                continue
            if index in covered:
                yield f"call {index} is in more than one row"
            covered.add(index)
            yield from self._span(tokens, text, span, j == last, j in with_context, row, expected)
        end = spans[-1]["start"] + spans[-1]["length"]
        if end != len(tokens):
            yield f"the last call's output ends at token {end}, the row has {len(tokens)} tokens"
        if not np.array_equal(mask, expected):
            at = int(np.flatnonzero(mask != expected)[0])
            yield (
                f"loss_mask[{at}] = {mask[at]}, should be {expected[at]} "
                f"(token {tokens[at]} {self.r.decode([tokens[at]])!r})"
            )
        if int(mask.sum()) != row["num_trainable_tokens"]:
            yield f"num_trainable_tokens {row['num_trainable_tokens']}, loss_mask sums to {int(mask.sum())}"

    def _span(
        self,
        tokens: np.ndarray,
        text: _RowText,
        span: dict,
        is_last: bool,
        check_context: bool,
        row: dict,
        expected: np.ndarray,
    ) -> Iterator[str]:
        call = self.calls[span["call_index"]]
        m = call.message
        start, length = span["start"], span["length"]
        name = f"call {call.index}"
        if span["kind"] != m.call_kind:
            yield f"{name}: span kind {span['kind']}, the call is a {m.call_kind}"
        if span["truncated"] != (m.finish_reason == "length"):
            yield f"{name}: span truncated={span['truncated']}, finish_reason {m.finish_reason}"
        if start < 0 or length <= 0 or start + length > len(tokens):
            yield f"{name}: span [{start}, {start + length}) outside the row's {len(tokens)} tokens"
            return
        out = tokens[start : start + length]
        # The whole context as the template sees it: O(context) per call, built only
        # where it is compared or the template needs it to render the output.
        needed = check_context or (m.output_ids is None and not self.r.incremental)
        context = [template_message(c) for c in call.context] if needed else []
        if m.output_ids is not None:
            if not np.array_equal(out, m.output_ids):
                yield f"{name}: trained span ids differ from the logged output_ids{_first_diff(out, m.output_ids)}"
        else:
            generated = self.r.output_text(template_message(m), self.tools, context)[0]
            have = text.between(start, start + length)
            if not self._same_text(have, generated):
                yield (
                    f"{name}: trained span decodes to {_excerpt(have, generated)}, "
                    f"the call generated {_excerpt(generated, have)}"
                )
        if check_context:
            yield from self._context(tokens[:start], text, call, context, row["drift_realigned"])
        train = not (self.options.mask_summaries and m.call_kind == "summary") and not (
            self.options.last_call_only and not is_last
        )
        if span["trained"] != train:
            yield f"{name}: trained={span['trained']}, the build's options say {train}"
        if train:
            end = start + length
            if span["truncated"] and m.output_ids is None and tokens[end - 1] == self.r.eos_id:
                end -= 1  # the template's end-of-turn token: never sampled
            expected[start:end] = 1
        if m.logprobs is not None and row["logprobs"] is not None and train:
            stored = np.asarray(row["logprobs"][start : start + length], dtype=np.float32)
            if not np.array_equal(stored, np.asarray(m.logprobs, dtype=np.float32)):
                yield f"{name}: logprobs at the span differ from the logged ones"

    def _same_text(self, have: str, want: str) -> bool:
        return have == want or have == self.normalize(want)

    def _context(
        self, prefix: np.ndarray, text: _RowText, call: CallView, context: list[dict], drift: int
    ) -> Iterator[str]:
        m = call.message
        name = f"call {call.index}"
        if m.prompt_ids is not None:
            logged = np.asarray(m.prompt_ids)
            if np.array_equal(prefix, logged):
                return
            if drift == 0:  # only a realigned drift may make the ids differ
                yield f"{name}: the context differs from the logged prompt_ids{_first_diff(prefix, logged)}"
                return
            want = self.r.decode(logged)
        elif context:
            want = self.r.render(context, self.tools, True)
        else:  # a call on an empty context (a rewrite emptied it): the prompt alone
            want = self.r.generation_prompt()
        have = text.between(0, len(prefix))
        if not self._same_text(have, want):
            want = self.normalize(want)
            at = next(
                (i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want))
            )
            yield (
                f"{name}: the context differs from the rollout's at character {at}: "
                f"{have[max(0, at - 20) : at + 40]!r} instead of {want[max(0, at - 20) : at + 40]!r}"
            )

    def _fidelity(self, group: list[tuple]) -> list[Mismatch]:
        """``context_fidelity`` (and ``context_gap_tokens``) as the rollout and the second
        witness say: the harness's reported input counts, re-read from the log, against
        the row's own call starts (``pipeline/core/witness.py``). A row that says ``exact``
        where the witness shows a gap over the threshold fails by name."""
        from pipeline.core.fidelity import EXACT, segment_fidelity, segment_witnesses

        segments = [
            _SpansOnly([_CallIndex(s["call_index"], s["start"]) for s in r["call_spans"]])
            for _, _, r in group
        ]
        wanted = segment_fidelity(self.rollout, segments)
        seen = segment_witnesses(self.rollout, segments)
        found = []
        for (shard, i, row), want, witnessed in zip(group, wanted, seen):
            have = list(row[FIDELITY_COLUMN] or [])
            whats = []
            if have == [EXACT] and witnessed.gap:
                whats.append(
                    f"context_fidelity says exact, but the harness's reported input tokens "
                    f"depart from the rebuilt context by {witnessed.gap_tokens} tokens "
                    f"({witnessed.flagged} of {witnessed.witnessed} witnessed calls over the "
                    "threshold)"
                )
            elif have != want:
                whats.append(f"context_fidelity {have}, the rollout says {want}")
            if GAP_COLUMN in row and row[GAP_COLUMN] != witnessed.gap_tokens:
                whats.append(
                    f"context_gap_tokens {row[GAP_COLUMN]}, the witness says {witnessed.gap_tokens}"
                )
            if self.options.excluded.intersection(have):
                whats.append(
                    f"context_fidelity {have} names a reason the build excluded "
                    f"(--exclude-fidelity {','.join(sorted(self.options.excluded))})"
                )
            found += [Mismatch(shard, i, row["rollout_id"], row["segment_index"], w) for w in whats]
        return found


def spread(n: int, limit: int | None) -> set[int] | range:
    """Indices of ``n`` items to check: all, or ``limit`` spread evenly (first and last
    included) when there are more."""
    if limit is None or n <= limit:
        return range(n)
    return {round(k * (n - 1) / (limit - 1)) for k in range(limit)}


class _RowText:
    """The decoded text of a row, cut at its call spans' boundaries: each piece decoded
    once, so the text before every call costs one decode of the row, not one per call."""

    def __init__(self, renderer: ChatRenderer, tokens: np.ndarray, spans: list[dict]):
        self.r = renderer
        self.tokens = tokens
        cuts = {0, len(tokens)}
        for s in spans:
            cuts.update(c for c in (s["start"], s["start"] + s["length"]) if 0 <= c <= len(tokens))
        self.cuts = sorted(cuts)
        ids = tokens.tolist()  # decoded as Python ints (the ids ``decode`` makes of them)
        pieces = [renderer.decode(ids[a:b]) for a, b in zip(self.cuts, self.cuts[1:])]
        self.full = "".join(pieces)
        # A cut inside a multi-byte character decodes its halves to U+FFFD: then the
        # pieces do not add up to the row's text and every slice is decoded on its own.
        self.exact = _pieces_add_up(renderer, self.full) or self.full == renderer.decode(ids)
        self.at = dict(zip(self.cuts, np.cumsum([0, *map(len, pieces)]).tolist()))

    def between(self, start: int, end: int) -> str:
        if self.exact and start in self.at and end in self.at:
            return self.full[self.at[start] : self.at[end]]
        return self.r.decode(self.tokens[start:end])


def _pieces_add_up(renderer: ChatRenderer, joined: str) -> bool:
    """Whether the row's pieces, decoded one by one and ``joined``, are provably the row
    decoded whole, without decoding it again (a third of a sample verify's decoding).

    Under a byte-level decoder alone, decoding is per token: each token's bytes (an
    added token's text), joined, then read as UTF-8 with U+FFFD for what is not valid
    (a run between added tokens at a time, in newer ``tokenizers``). A piece whose bytes
    are valid UTF-8 decodes to the same characters alone as inside the row, and a piece
    whose are not shows a U+FFFD; so with no U+FFFD in ``joined`` the pieces add up to
    the row's text. Otherwise (another decoder, a U+FFFD anywhere) the caller decodes."""
    try:
        from tokenizers.decoders import ByteLevel
    except ImportError:  # pragma: no cover - the build tokenizer needs tokenizers
        return False
    decoder = getattr(renderer.backend, "decoder", None)
    return type(decoder) is ByteLevel and "\ufffd" not in joined


@dataclass(frozen=True)
class _CallIndex:
    call_index: int
    start: int


@dataclass(frozen=True)
class _SpansOnly:
    """What ``segment_fidelity`` reads of a segment: its spans' call indices and starts."""

    spans: list[_CallIndex]


def _first_diff(have: np.ndarray, want) -> str:
    want = np.asarray(want)
    n = min(len(have), len(want))
    diff = np.flatnonzero(have[:n] != want[:n])
    at = int(diff[0]) if len(diff) else n
    return f" at token {at} (lengths {len(have)} and {len(want)})"


def _excerpt(text: str, other: str) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(text, other)) if a != b), min(len(text), len(other))
    )
    return repr(text[max(0, at - 20) : at + 40])
