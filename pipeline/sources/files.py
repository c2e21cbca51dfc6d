"""Input resolution and work planning for builds.

Inputs are files, directories (searched recursively, sorted) and globs. Each input file
is split into *tasks*, the unit a worker process runs: a canonical JSONL file is cut
into byte ranges at line boundaries (so two workers never share a line and quarantine
entries keep exact line numbers) — for a ``.jsonl.gz``/``.jsonl.zst`` file, ranges of
the decompressed stream, found by one decompressing pass at planning time and fed to
the workers by the build as it decompresses the file once more; a canonical Parquet
file is cut into ranges of row groups; raw formats read by a reader are one task each,
except that the files of one session (a reader's ``session_key``: Claude Code snapshots,
slices and sub-agent transcripts) are one task, read together. Task order is the input
order, which makes the output independent of how many workers run them.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.errors import InputError
from pipeline.sources.canonical_io import (
    UNREADABLE,
    first_json_object,
    is_compressed,
    open_text_stream,
    read_head,
)

CANONICAL = "canonical"
UNRECOGNISED = "unrecognised"
SPLITTABLE = (".jsonl", ".jsonl.gz", ".jsonl.zst")  # canonical files cut into line ranges
INPUT_SUFFIXES = (
    ".jsonl",
    ".jsonl.gz",
    ".jsonl.zst",
    ".json",
    ".json.gz",
    ".parquet",
    ".traj",
    ".pt",
)


@dataclass(frozen=True)
class Task:
    """One unit of work: a whole file (``start=0, end=None``) or a range of it. For
    canonical JSONL, ``start``/``end`` are byte offsets of the (decompressed) data and
    ``first_line`` the line number at ``start``; for canonical Parquet they are row
    group indices and ``first_line`` the row number of the first row."""

    index: int
    path: str
    format: str
    start: int = 0
    end: int | None = None
    first_line: int = 1
    # Raw formats with sessions spread over several files (Claude Code snapshots and
    # slices, sub-agent transcripts): the session's other files, read with ``path``.
    paths: tuple[str, ...] = ()


def walked_files(specs: list[str]) -> frozenset[Path]:
    """The input files found by walking a directory (not named, nor matched by a glob)."""
    return frozenset(
        f for spec in specs if Path(spec).expanduser().is_dir() for f in resolve_inputs([spec])
    )


def resolve_inputs(specs: list[str]) -> list[Path]:
    files: list[Path] = []
    for spec in specs:
        path = Path(spec).expanduser()
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and not p.name.startswith(".") and p.name.endswith(INPUT_SUFFIXES)
            )
            if not found:
                raise InputError(
                    f"input directory {spec} holds no rollout files ({', '.join(INPUT_SUFFIXES)})"
                )
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif any(ch in spec for ch in "*?["):
            matched = sorted(
                Path(p)
                for p in glob.glob(os.path.expanduser(spec), recursive=True)
                if Path(p).is_file()
            )
            if not matched:
                raise InputError(f"input glob {spec} matches no files")
            files.extend(matched)
        else:
            raise InputError(f"input {spec} does not exist")
    seen, unique = set(), []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def looks_canonical(path: Path) -> bool:
    """A canonical rollout file: Parquet with a ``record`` column, or JSONL whose first
    JSON object (in its first MiB; lines that do not parse are passed over) has
    ``rollout_id`` and ``events``."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return "record" in pq.read_schema(path).names
        except Exception:
            return False
    if not path.name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")):
        return False
    try:
        head = read_head(path, 1 << 20)
    except UNREADABLE:
        return False
    first = first_json_object(head)
    if first is not None:
        return "rollout_id" in first[1] and "events" in first[1]
    line = head.split(b"\n", 1)[0]  # a first record longer than the head: by its text
    return line.lstrip().startswith(b"{") and b'"rollout_id"' in line and b'"events"' in line


def detect_input_format(path: Path) -> str:
    """``--format auto`` for one input file: ``canonical`` for seam's own rollout files,
    else the one raw reader that recognises it (``readers/detect.py``'s ``detect_format``,
    which knows only the raw formats)."""
    if looks_canonical(path):
        return CANONICAL
    from pipeline.readers.detect import detect_format as detect_raw

    return detect_raw(path)


def plan_tasks(
    files: list[Path],
    fmt: str,
    chunk_bytes: int = 1 << 62,
    walked: frozenset[Path] = frozenset(),
    split: bool = True,
) -> list[Task]:
    """Tasks in input order (``split=False``: canonical files are not cut into ranges, for
    commands that read their inputs in one process). A file whose format no reader recognises fails the build
    when it was named, and becomes one quarantine entry when it was found by walking a
    directory (``walked``): one stray file must not stop a build of thousands."""
    if fmt not in ("auto", CANONICAL):
        from pipeline.readers import REGISTRY

        if fmt not in REGISTRY:
            raise InputError(
                f"unknown --format {fmt!r}; use auto, {CANONICAL} or one of: {', '.join(sorted(REGISTRY))}"
            )
    tasks: list[Task] = []
    sessions: dict[tuple[str, str], int] = {}  # (format, session) → its task's index
    for path in files:
        try:
            file_format = detect_input_format(path) if fmt == "auto" else fmt
        except InputError:  # readers.detect.FormatError: no reader, or several, claim the file
            if path not in walked:
                raise
            file_format = UNRECOGNISED
        if file_format == CANONICAL and split and path.name.endswith(SPLITTABLE):
            for start, end, first_line in _byte_ranges(path, chunk_bytes):
                tasks.append(Task(len(tasks), str(path), file_format, start, end, first_line))
        elif file_format == CANONICAL and split and path.suffix == ".parquet":
            for start, end, first_row in _row_group_ranges(path, chunk_bytes):
                tasks.append(Task(len(tasks), str(path), file_format, start, end, first_row))
        elif file_format == CANONICAL:
            tasks.append(Task(len(tasks), str(path), file_format))
        else:
            key = _session_key(path, file_format)
            if key is not None and (file_format, key) in sessions:
                at = sessions[(file_format, key)]
                tasks[at] = dataclasses.replace(tasks[at], paths=(*tasks[at].paths, str(path)))
                continue
            if key is not None:
                sessions[(file_format, key)] = len(tasks)
            tasks.append(Task(len(tasks), str(path), file_format))
    return tasks


def _session_key(path: Path, file_format: str) -> str | None:
    """The session a raw file belongs to, if its reader groups files by session: the
    files of one session are one task, read together (one rollout per session)."""
    from pipeline.readers import REGISTRY

    reader = REGISTRY.get(file_format)
    if reader is None:
        return None
    from pipeline.readers.common import UNREADABLE as READ_ERRORS
    from pipeline.readers.common import read_head

    try:
        return reader.session_key(path, read_head(path))
    except READ_ERRORS:
        return None


def _row_group_ranges(path: Path, chunk_bytes: int) -> list[tuple[int, int | None, int]]:
    """(first row group, end row group, first row number) ranges of a canonical Parquet
    file, each about ``chunk_bytes`` of uncompressed data; one ``(0, None, 1)`` range for a
    small file or one whose footer cannot be read (the worker then quarantines it)."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except UNREADABLE:
        return [(0, None, 1)]
    ranges: list[tuple[int, int | None, int]] = []
    start, size, row = 0, 0, 1
    first_row = 1
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        size += group.total_byte_size
        row += group.num_rows
        if size >= chunk_bytes and i + 1 < meta.num_row_groups:
            ranges.append((start, i + 1, first_row))
            start, size, first_row = i + 1, 0, row
    if not ranges:
        return [(0, None, 1)]
    ranges.append((start, meta.num_row_groups, first_row))
    return ranges


def _byte_ranges(path: Path, chunk_bytes: int) -> list[tuple[int, int | None, int]]:
    """(start, end, first line number) ranges of the (decompressed) file, each ending
    just after the first newline at or past ``start + chunk_bytes``; the last range has
    ``end=None``. A compressed file that cannot be read to its end stays one task (the
    worker then quarantines what it cannot read, as for any unreadable file)."""
    if not is_compressed(path) and path.stat().st_size <= chunk_bytes:
        return [(0, None, 1)]
    ranges: list[tuple[int, int | None, int]] = []
    start = pos = 0  # start of the open range; stream offset of the block's first byte
    line = start_line = 1  # line number at block[offset]; of the open range's first line
    try:
        with open_text_stream(path) as fh:
            while block := fh.read(1 << 20):
                offset = 0
                while (target := start + chunk_bytes - pos) < len(block):
                    cut = block.find(b"\n", max(target, offset))
                    if cut < 0:
                        break
                    line += block.count(b"\n", offset, cut + 1)
                    offset = cut + 1
                    ranges.append((start, pos + offset, start_line))
                    start, start_line = pos + offset, line
                line += block.count(b"\n", offset)
                pos += len(block)
    except UNREADABLE:
        return [(0, None, 1)]
    if start < pos or not ranges:
        ranges.append((start, None, start_line))
    else:  # the last cut fell on the end of the file
        last_start, _, last_line = ranges.pop()
        ranges.append((last_start, None, last_line))
    return ranges
