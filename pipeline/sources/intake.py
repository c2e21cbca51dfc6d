"""One way in: any input file (or range of one) → a stream of accepted, quarantined and
skipped records. The builds, ``seam ingest``, ``seam judge`` and ``seam audit`` all read
their inputs through ``iter_records``, so they agree on every record.

Per-record isolation: a bad record becomes one ``quarantined`` item with its line and a
one-line reason, and the records around it are read on. Canonical records are parsed one
by one; raw formats are read by their reader (``pipeline/readers``), which isolates its
records the same way. What is isolated here too:

- a byte order mark and a first line that does not parse (detection reads past them);
- a record over a limit (``pipeline/sources/limits.py``: line, document, decompressed and
  message size, JSON depth): quarantined with the limit named, never held whole in memory;
- a file that cannot be read past some point: the records before the damage, then one
  entry for the rest;
- a reader that fails on a file anyway (a bug): one entry naming the reader and the error,
  after the records it had already produced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.step_times import StepTimes
from pipeline.sources import limits
from pipeline.sources.canonical_io import (
    UNREADABLE,
    decode_record,
    iter_jsonl_lines,
    iter_parquet_records,
    validate_record,
)
from pipeline.sources.files import CANONICAL, UNRECOGNISED, Task
from pipeline.sources.read_context import ReadContext
from schemas.rollout import MessageEvent, Rollout

RAW_EXCERPT_LIMIT = 1 << 20  # quarantined raw text kept per record (file + line point to the rest)
ACCEPTED, QUARANTINED, SKIPPED = "accepted", "quarantined", "skipped"


@dataclass(frozen=True)
class Record:
    """One item of an input: an accepted rollout, a quarantined record (with its reason
    and raw text) or a skipped one (not a model call; counted by reason)."""

    kind: str
    line: int | None
    rollout: Rollout | None = None
    reason: str | None = None
    raw: str | None = None
    records: int = 1  # raw records (lines, steps) it stands for; 0 for a whole-file failure
    file: str | None = None  # the file it comes from, when a task reads several (else None)


def iter_records(
    task: Task,
    data: bytes | None = None,
    context: ReadContext | None = None,
    keep: Callable[[bytes], bool] | None = None,
    times: StepTimes | None = None,
) -> Iterator[Record]:
    """The records of one task, in file order, read under ``context`` (its limits and
    reader options, e.g. ``--group-by``; None: the defaults). ``data``: the task's bytes
    when the build fed them (a range of a compressed file); ``keep``: a cheap test of a
    canonical record's raw bytes, records it rejects are passed over unparsed and
    unreported (``seam verify`` reads only the rollouts of its sample); ``times``: where
    the schema validation's seconds go (step ``validate``; the rest is the caller's
    ``read``)."""
    context = context or ReadContext()
    if task.format == CANONICAL:
        yield from context.read(_canonical(task, data, keep, times or StepTimes()))
    else:
        yield from context.read(_raw(task, context.set_options()))


def _canonical(
    task: Task, data: bytes | None, keep: Callable[[bytes], bool] | None, times: StepTimes
) -> Iterator[Record]:
    path = Path(task.path)
    try:
        groups = None if task.end is None else range(task.start, task.end)
        records = (
            iter_parquet_records(path, groups)
            if path.suffix == ".parquet"
            else iter_jsonl_lines(path, task.start, task.end, task.first_line, data)
        )
        for raw in records:
            if keep is not None and not raw.error and not keep(raw.data):
                continue
            if raw.error:
                yield Record(QUARANTINED, raw.line, reason=raw.error, raw=_excerpt(raw.data))
                continue
            line = raw.line
            try:
                obj = decode_record(raw.data)
                with times.step("validate"):
                    rollout = validate_record(obj)
                    if could_hold_a_message_over_the_limit(raw.data):
                        check_message_sizes(rollout)
            except (ValueError, RecursionError) as exc:
                yield Record(QUARANTINED, line, reason=_reason(exc), raw=_excerpt(raw.data))
                continue
            # The record's bytes (as large as the rollout's text) are not held while the
            # consumer tokenizes the rollout.
            raw = None  # type: ignore[assignment]
            yield Record(ACCEPTED, line, rollout=rollout)
    except UNREADABLE as exc:  # unreadable/corrupt file: one quarantine entry
        yield Record(
            QUARANTINED, None, reason=f"cannot read file: {type(exc).__name__}: {exc}", records=0
        )


def _raw(task: Task, options: dict) -> Iterator[Record]:
    from pipeline.readers import REGISTRY, Accepted, Rejected

    path = Path(task.path)
    reader = REGISTRY.get(task.format)
    if reader is None:
        reason = (
            _why_unrecognised(path)
            if task.format == UNRECOGNISED
            else f"unknown format {task.format!r}"
        )
        yield Record(QUARANTINED, None, reason=reason)
        return
    reader = reader.configure(**options)
    try:
        # The files of one session (planned as one task) are read together.
        items = (
            reader.read_files([path, *map(Path, task.paths)]) if task.paths else reader.read(path)
        )
        for item in items:
            if isinstance(item, Accepted):
                try:
                    check_message_sizes(item.rollout)
                except ValueError as exc:
                    yield Record(
                        QUARANTINED,
                        item.line,
                        reason=str(exc),
                        records=item.records,
                        file=item.file,
                    )
                    continue
                yield Record(
                    ACCEPTED, item.line, rollout=item.rollout, records=item.records, file=item.file
                )
            elif isinstance(item, Rejected):
                raw = (item.raw or "")[:RAW_EXCERPT_LIMIT]
                yield Record(
                    QUARANTINED,
                    item.line,
                    reason=item.reason,
                    raw=raw,
                    records=item.records,
                    file=item.file,
                )
            else:
                yield Record(SKIPPED, item.line, reason=item.reason, file=item.file)
    except Exception as exc:  # a reader bug must not lose the file silently
        yield Record(
            QUARANTINED,
            None,
            reason=f"reader {task.format} failed: {type(exc).__name__}: {_reason(exc)}",
            records=0,
        )


def could_hold_a_message_over_the_limit(record: bytes) -> bool:
    """Whether a canonical record's JSON text is long enough to hold a message over
    ``max_message_bytes``; if not, ``check_message_sizes`` cannot fail and is skipped (a
    tenth of a canonical record's validation). A message's size is counted in characters
    of its strings (content, reasoning, tool-call arguments), each decoded from its own
    string literal in the record, and every character takes at least one byte of its
    literal (an ASCII character one, others two to four in UTF-8 or six as a ``\\u``
    escape); so no message's size exceeds the record's length in bytes."""
    return len(record) > limits.current().max_message_bytes


def check_message_sizes(rollout: Rollout) -> None:
    """Raise ``ValueError`` naming ``max_message_bytes`` if a message of the rollout (in an
    event or in a rewrite's new context) holds more text than the limit."""
    cap = limits.current().max_message_bytes
    for event in rollout.events:
        messages = [event] if event.type == "message" else event.context
        for m in messages:
            if not isinstance(m, MessageEvent):
                continue
            size = len(m.content) + len(m.reasoning or "")
            size += sum(len(c.arguments) for c in m.tool_calls)
            if size > cap:
                raise ValueError(
                    f"rollout {rollout.rollout_id}: "
                    + limits.over("max_message_bytes", f"message {m.id} ({size:,} characters)")
                )


def _excerpt(data: bytes) -> str:
    """The raw text a quarantine entry keeps of a record (file and line point to the rest)."""
    return data[:RAW_EXCERPT_LIMIT].decode("utf-8", "replace")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply to process (Python's recursion limit); lower --max-depth"
    return str(exc)


def _why_unrecognised(path: Path) -> str:
    from pipeline.sources.files import detect_input_format

    try:
        detect_input_format(path)
    except ValueError as exc:
        return str(exc)
    return f"{path}: format not recognised when the build was planned"
