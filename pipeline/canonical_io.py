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
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from schemas.rollout import Rollout

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
    data: bytes


def is_parquet(path: Path) -> bool:
    return path.suffix == ".parquet"


# What reading a damaged file raises (a cut gzip: EOFError; corrupt deflate: zlib.error).
UNREADABLE = (OSError, EOFError, ValueError, zlib.error)


def is_compressed(path: Path) -> bool:
    """A file ``open_text_stream`` decompresses (by its suffix)."""
    return Path(path).suffix in (".gz", ".zst")


def open_text_stream(path: Path) -> IO[bytes]:
    """Open a file for binary line reading, decompressing ``.gz`` and ``.zst`` on the fly."""
    if path.suffix == ".gz":
        return cast(IO[bytes], gzip.open(path, "rb"))
    if path.suffix == ".zst":
        return io.BufferedReader(_ZstdStream(path), buffer_size=1 << 20)
    return open(path, "rb")


class _ZstdStream(io.RawIOBase):
    """Every frame of a ``.zst`` file, decompressed. zstandard's ``stream_reader`` stops
    silently after the first frame and yields nothing from a cut one; this reads all
    frames, raises ``EOFError`` when the file ends inside one and ``OSError`` for bytes
    that are not zstd, like ``gzip`` does."""

    def __init__(self, path: Path):
        import zstandard

        self._error = zstandard.ZstdError
        self._decompressor = zstandard.ZstdDecompressor()
        self._raw = open(path, "rb")  # noqa: SIM115 (closed by close(); lives as long as the reader)
        self._frame: Any = None  # decompressor of the frame being read, None between frames
        self._pending, self._offset = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._offset == len(self._pending):
            data = self._raw.read(1 << 17)
            if not data:
                if self._frame is not None:
                    raise EOFError("the zstd file ends inside a frame (truncated?)")
                return 0
            self._pending, self._offset = self._decompress(data), 0
        n = min(len(buffer), len(self._pending) - self._offset)
        buffer[:n] = self._pending[self._offset : self._offset + n]
        self._offset += n
        return n

    def _decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._frame is None:
                self._frame = self._decompressor.decompressobj()
            try:
                out.append(self._frame.decompress(data))
            except self._error as exc:
                raise OSError(f"not a valid zstd file: {exc}") from None
            if not self._frame.eof:
                break
            data, self._frame = self._frame.unused_data, None
        return b"".join(out)

    def close(self) -> None:
        self._raw.close()
        super().close()


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
    if start or end is not None or data is not None:
        fh = io.BytesIO(data) if data is not None else open_text_stream(path)
        with fh:
            if data is None:
                _skip_to(fh, path, start)
            pos, line_no = start, first_line
            while end is None or pos < end:
                raw = fh.readline()
                if not raw:
                    break
                pos += len(raw)
                if raw.strip():
                    yield RawRecord(name, line_no, raw)
                line_no += 1
        return
    with open_text_stream(path) as fh:
        for line_no, raw in enumerate(fh, start=1):
            if raw.strip():
                yield RawRecord(name, line_no, raw)


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
            data = fh.read() if end is None else fh.read(end - start)
        except UNREADABLE:
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
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
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
        try:
            yield raw, parse_rollout(raw.data)
        except ValueError as exc:
            yield raw, str(exc)


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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
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
    tmp.replace(path)
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
