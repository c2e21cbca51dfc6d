"""Reading and writing canonical rollouts: JSONL (plain, ``.gz``, ``.zst``) and Parquet.

JSONL holds one ``Rollout`` JSON object per line. The Parquet layout keeps a few
queryable scalar columns next to ``record``, the rollout's full JSON, so nothing is
lost in a round trip and DuckDB can still filter by task or reward without parsing.

``iter_raw_records`` yields the undecoded records with their locations (file, 1-based
line or Parquet row); parsing and validation happen in ``parse_rollout`` so a bad
record becomes a quarantine entry, never an exception that stops the build.
"""

from __future__ import annotations

import gzip
import io
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from pipeline.sources import limits
from pipeline.sources.read_hash import open_input
from schemas.rollout import Rollout

if sys.version_info >= (3, 14):
    from compression.zstd import ZstdError, ZstdFile
else:
    from backports.zstd import ZstdError, ZstdFile

CANONICAL_PARQUET_SCHEMA = pa.schema(
    [
        ("schema_version", pa.string()),
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("source", pa.string()),
        ("model", pa.string()),
        ("reward", pa.float64()),
        ("resolved", pa.bool_()),
        ("num_events", pa.int32()),
        ("record", pa.large_string()),
    ],
    metadata={"seam.format": "canonical-rollouts"},
)


@dataclass(frozen=True)
class RawRecord:
    file: str
    line: int  # 1-based line (JSONL) or 1-based row (Parquet)
    data: bytes  # the record; for one over a limit, its first bytes
    error: str | None = None  # over a limit (``pipeline/sources/limits.py``): quarantine it


BOM = b"\xef\xbb\xbf"


def strip_bom(data: bytes) -> bytes:
    """Text without the UTF-8 byte order mark some editors and Windows tools write first."""
    return data[3:] if data.startswith(BOM) else data


def is_parquet(path: Path) -> bool:
    return path.suffix == ".parquet"


# What reading a damaged file raises (a cut gzip or zstd: EOFError; corrupt deflate:
# zlib.error; bytes that are not zstd: OSError).
UNREADABLE = (OSError, EOFError, ValueError, zlib.error)


def is_compressed(path: Path) -> bool:
    """A file ``open_text_stream`` decompresses (by its suffix)."""
    return Path(path).suffix in (".gz", ".zst")


def open_text_stream(path: Path) -> IO[bytes]:
    """Open a file for binary line reading, decompressing ``.gz`` and ``.zst`` on the fly
    (every frame of a ``.zst`` file; a cut one raises ``EOFError``). Decompressed data is
    produced in bounded pieces and its total capped by ``max_decompressed_bytes``."""
    # The file's own bytes come through ``read_hash.open_input``: a build records what its
    # tasks read and checks it against what it hashed first.
    raw = open_input(path)
    if path.suffix in (".gz", ".zst"):
        try:
            inner = (
                gzip.GzipFile(fileobj=raw, mode="rb")
                if path.suffix == ".gz"
                else ZstdFile(cast(IO[bytes], raw), "rb")
            )
        except BaseException:
            raw.close()
            raise
        return cast(IO[bytes], io.BufferedReader(_Capped(inner, raw), 1 << 20))
    return cast(IO[bytes], io.BufferedReader(cast(io.RawIOBase, raw), 1 << 18))


class _Capped(io.RawIOBase):
    """A decompressing stream that raises ``OSError`` past ``max_decompressed_bytes`` (a
    few KB of input must not turn into an unbounded amount of work) and for bytes that
    are not zstd."""

    def __init__(self, inner, raw):
        self._inner, self._left = inner, limits.current().max_decompressed_bytes
        self._raw = raw  # the compressed file: the decompressor does not close it

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        # Up to the limit the data is served (the records before it are read), then one
        # more byte means the file is over it.
        try:  # read1: what one step of decompression gives (read() would drop the data of
            # the frames before a cut one when it raises)
            data = self._inner.read1(min(len(buffer), self._left) or 1)
        except ZstdError as exc:  # bytes that are not zstd: an OSError, as gzip raises
            raise OSError(f"not a valid zstd file: {exc}") from None
        if data and not self._left:
            raise OSError(limits.over("max_decompressed_bytes", "the decompressed data"))
        self._left -= len(data)
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._raw.close()
        super().close()


def read_head(path: Path, size: int = 1 << 16) -> bytes:
    """Up to ``size`` first bytes of a file, decompressed, without a byte order mark: what
    format detection reads (a bounded amount, whatever the file holds). A damaged file
    gives the bytes before the damage, or raises if there are none."""
    pieces: list[bytes] = []
    got = 0
    try:
        with open_text_stream(path) as fh:
            # read1: a piece at a time, so the pieces before a damaged spot are kept
            # (every stream open_text_stream returns is buffered, so it has read1)
            while got < size and (piece := fh.read1(min(1 << 16, size - got))):  # type: ignore[attr-defined]
                pieces.append(piece)
                got += len(piece)
    except UNREADABLE:
        if not pieces:
            raise
    return strip_bom(b"".join(pieces))


def read_line(fh: IO[bytes], limit: int) -> tuple[bytes, int, bool]:
    """The next line of ``fh`` (with its newline), its length, and whether it is longer
    than ``limit`` bytes: then it is read through in bounded pieces and only its first
    64 KiB are returned (an excerpt for the quarantine)."""
    line = fh.readline(limit + 1)
    if len(line) <= limit or line.endswith(b"\n"):
        return line, len(line), False
    length = len(line)
    while piece := fh.readline(1 << 20):
        length += len(piece)
        if piece.endswith(b"\n"):
            break
    return line[: 1 << 16], length, True


def iter_jsonl_lines(
    path: Path,
    start: int = 0,
    end: int | None = None,
    first_line: int = 1,
    data: bytes | None = None,
) -> Iterator[RawRecord]:
    """Lines of a JSONL file; with ``start``/``end`` only the lines that *begin* in that
    byte range of the (decompressed) file, so range tasks never split a line. ``data``:
    the range's bytes, already read by the caller (the build feeds compressed ranges)."""
    name = str(path)
    limit = limits.current().max_line_bytes
    fh = io.BytesIO(data) if data is not None else open_text_stream(path)
    with fh:
        if data is None and start:
            _skip_to(fh, path, start)
        pos, line_no = start, first_line
        while end is None or pos < end:
            raw, length, too_long = read_line(fh, limit)
            if not length:
                break
            if pos == 0:
                raw = strip_bom(raw)
            pos += length
            if too_long:
                reason = limits.over("max_line_bytes", f"line of {length:,} bytes")
                yield RawRecord(name, line_no, raw, reason)
            elif raw.strip():
                # Handed over, not kept: a 50 MB line must not stay alive in this
                # suspended frame while the consumer works on the record.
                handed, raw = [raw], b""
                yield RawRecord(name, line_no, handed.pop())
            line_no += 1


def _skip_to(fh, path: Path, offset: int) -> None:
    """Position a stream from ``open_text_stream`` at ``offset`` of the decompressed data
    (a compressed stream is read through: cost proportional to the offset)."""
    if is_compressed(path):
        while offset > 0:
            block = fh.read(min(offset, 1 << 20))
            if not block:
                raise EOFError(f"{path}: ends before byte {offset} of its decompressed data")
            offset -= len(block)
    else:
        fh.seek(offset)


# The largest range the build reads for a worker: a longer one (a range holding one huge
# line) would sit in memory once per task in flight, so the worker reads it itself.
FEED_LIMIT = 64 << 20


class RangeFeeder:
    """The bytes of range tasks over compressed JSONL files, in task order, from one
    decompressing pass per file: the build reads each range once and hands it to the
    worker, so no worker decompresses the file from its start to reach its range."""

    def __init__(self):
        self._path: str | None = None
        self._fh: IO[bytes] | None = None
        self._pos = 0

    def data_for(self, path: str, start: int, end: int | None) -> bytes | None:
        """The range's bytes, or None when this range is not fed (the worker then reads
        the file itself, and quarantines it if it cannot)."""
        if not is_compressed(Path(path)) or (start == 0 and end is None):
            return None
        try:
            fh = self._fh
            if fh is None or self._path != path or start < self._pos:
                self.close()
                fh = open_text_stream(Path(path))
                self._fh, self._path, self._pos = fh, path, 0
            _skip_to(fh, Path(path), start - self._pos)
            size = FEED_LIMIT + 1 if end is None else min(end - start, FEED_LIMIT + 1)
            data = fh.read(size)
        except UNREADABLE:
            self.close()
            return None
        if len(data) > FEED_LIMIT:  # a huge line: the worker streams it (bounded) itself
            self.close()
            return None
        self._pos = start + len(data)
        return data

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh, self._path, self._pos = None, None, 0


def iter_parquet_records(
    path: Path, row_groups: Sequence[int] | None = None
) -> Iterator[RawRecord]:
    pf = pq.ParquetFile(path)
    if "record" not in pf.schema_arrow.names:
        raise ValueError(
            f"{path}: not a canonical rollout Parquet file (no 'record' column); use --format to read raw formats"
        )
    row = 0
    groups = range(pf.num_row_groups) if row_groups is None else row_groups
    offsets = [0]
    for i in range(pf.num_row_groups):
        offsets.append(offsets[-1] + pf.metadata.row_group(i).num_rows)
    for group in groups:
        row = offsets[group]
        for value in pf.read_row_group(group, columns=["record"]).column(0).to_pylist():
            row += 1
            yield RawRecord(str(path), row, (value or "").encode())


def iter_raw_records(path: Path) -> Iterator[RawRecord]:
    return iter_parquet_records(path) if is_parquet(path) else iter_jsonl_lines(path)


def parse_rollout(data: bytes) -> Rollout:
    """Decode and validate one record. Raises ``ValueError`` with a one-line reason."""
    return validate_record(decode_record(data))


def decode_record(data: bytes) -> dict:
    """One record's JSON object (within ``max_depth``); ``ValueError`` with a one-line reason."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    limits.check_depth(obj, data)  # a DepthError is a ValueError
    return obj


def validate_record(obj: dict) -> Rollout:
    """A decoded record as a ``Rollout``; ``ValueError`` naming the first schema error."""
    try:
        return Rollout.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "rollout"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ValueError(
            f"schema: {where}: {first['msg'].removeprefix('Value error, ')}{more}"
        ) from None


def iter_canonical_records(path: Path) -> Iterator[tuple[RawRecord, Rollout | str]]:
    """Each record with its parsed rollout, or the reason it is invalid."""
    for raw in iter_raw_records(path):
        if raw.error:
            yield raw, raw.error
            continue
        try:
            yield raw, parse_rollout(raw.data)
        except ValueError as exc:
            yield raw, str(exc)


def first_json_object(head: bytes) -> tuple[bytes, dict] | None:
    """The first line of ``head`` (a file's first bytes) that is a JSON object, with the
    object: blank lines, a byte order mark and lines that do not parse (a cut first
    record, a banner) do not hide the format of the records that follow."""
    for line in strip_bom(head).split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return line, obj
    return None


def rollout_to_json(rollout: Rollout) -> bytes:
    return orjson.dumps(rollout.model_dump(mode="json", exclude_none=True))


def write_canonical_jsonl(rollouts: Iterable[Rollout], path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    n = 0
    with opener(path, "wb") as fh:
        for rollout in rollouts:
            fh.write(rollout_to_json(rollout) + b"\n")
            n += 1
    return n


def write_canonical_parquet(
    rollouts: Iterable[Rollout], path: Path, rows_per_group: int = 64
) -> int:
    """Write rollouts to a canonical Parquet file (temporary name, then rename). Row
    groups of 64 rollouts (~10 MB of JSON) are the units a build splits the file into."""
    from pipeline.common.atomic import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0

    def write(tmp: str) -> None:
        nonlocal n
        with pq.ParquetWriter(tmp, CANONICAL_PARQUET_SCHEMA, compression="zstd") as writer:
            batch: list[Rollout] = []
            for rollout in rollouts:
                batch.append(rollout)
                if len(batch) == rows_per_group:
                    writer.write_table(_canonical_table(batch))
                    n += len(batch)
                    batch = []
            if batch:
                writer.write_table(_canonical_table(batch))
                n += len(batch)

    atomic_write(path, write)
    return n


def _canonical_table(rollouts: list[Rollout]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "schema_version": r.schema_version,
                "rollout_id": r.rollout_id,
                "task_id": r.task_id,
                "source": r.source,
                "model": r.model,
                "reward": r.reward,
                "resolved": r.resolved,
                "num_events": len(r.events),
                "record": rollout_to_json(r).decode(),
            }
            for r in rollouts
        ],
        schema=CANONICAL_PARQUET_SCHEMA,
    )
