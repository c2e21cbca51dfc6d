"""A build's ``quarantine.jsonl``: one JSON line per quarantined record, bounded.

Each task writes its entries to ``.parts/part-NNNNNN.quarantine.jsonl`` within its share
of the build's caps (``pipeline/sources/limits.py``: ``max_quarantine_entries``,
``max_quarantine_bytes``, ``max_quarantine_raw_bytes``, each divided evenly by the
number of tasks, so the share and the output do not depend on ``--workers``);
``merge_quarantine`` concatenates the parts in task order and enforces the caps on the
whole file. An entry past a cap is not written but counted (``quarantine_not_written``),
so the file holds a sample — the first entries of every task — and the manifest the
exact count. Every quarantined record is counted in ``quarantined`` either way.

Entries hold raw session text: the files are created ``0600`` whatever the umask.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.atomic import atomic_write
from pipeline.sources.limits import Limits

NOT_WRITTEN = "quarantine_not_written"  # the count key, in the tasks' and the manifest's counts
# A task's share never drops below these, so every task keeps a few examples.
MIN_ENTRIES, MIN_BYTES = 16, 1 << 16


@dataclass(frozen=True)
class Share:
    """What one task may write into the quarantine: raw text, entries, bytes."""

    raw_bytes: int = 1 << 20
    entries: int = Limits().max_quarantine_entries
    bytes: int = Limits().max_quarantine_bytes

    @classmethod
    def of(cls, limits: Limits, tasks: int) -> Share:
        n = max(1, tasks)
        return cls(
            max(MIN_BYTES, limits.max_quarantine_raw_bytes // n),
            max(MIN_ENTRIES, limits.max_quarantine_entries // n),
            max(MIN_BYTES, limits.max_quarantine_bytes // n),
        )


class TaskQuarantine:
    """One task's entries, in memory (bounded by its share) until the task writes them."""

    def __init__(self, share: Share):
        self.lines: list[bytes] = []
        self.not_written = 0
        self._raw_room = share.raw_bytes
        self._entries_room = share.entries
        self._bytes_room = share.bytes

    def add(self, entry: dict, raw: str | None = None) -> None:
        """Add ``entry`` (file, line, format, reason...), with ``raw`` text while the
        share of raw text lasts (then ``raw_omitted``); past the share of entries or
        bytes it is only counted."""
        if not self._entries_room:  # counted before any encoding: a flood costs little
            self.not_written += 1
            return
        if raw and len(raw) <= self._raw_room:
            entry["raw"] = raw
            self._raw_room -= len(raw)
        elif raw:  # 90 KB of compressed junk lines must not become gigabytes of quarantine
            entry["raw_omitted"] = "max_quarantine_raw_bytes reached"
        self.add_line(json.dumps(entry, ensure_ascii=False).encode() + b"\n")

    def add_line(self, line: bytes) -> None:
        if not self._entries_room or len(line) > self._bytes_room:
            self.not_written += 1
            return
        self.lines.append(line)
        self._entries_room -= 1
        self._bytes_room -= len(line)

    def write(self, path: Path) -> None:
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(b"".join(self.lines)), private=True)


class StreamQuarantine(TaskQuarantine):
    """A quarantine written as it goes (``seam ingest``, one process): the whole file's
    caps are one task's share, and each kept line goes straight to ``handle``."""

    def __init__(self, handle, limits: Limits):
        super().__init__(Share.of(limits, 1))
        self._handle = handle
        self.written = 0

    def add_line(self, line: bytes) -> None:
        super().add_line(line)
        if self.lines:  # kept: write it now, hold nothing
            self._handle.write(self.lines.pop().decode())
            self.written += 1


def merge_quarantine(
    parts: Sequence[Path], dest: Path, limits: Limits, extra: Sequence[bytes] = ()
) -> tuple[int, int]:
    """Concatenate the tasks' quarantine ``parts``, in task order, then the ``extra``
    entries found when finalizing (duplicates), into ``dest`` (``quarantine.jsonl``),
    within the build's caps; returns (entries written, entries not written)."""
    room_entries, room_bytes = limits.max_quarantine_entries, limits.max_quarantine_bytes
    written = not_written = 0

    def lines():
        for part in parts:
            with open(part, "rb") as src:
                yield from src  # a part is bounded by its task's share
        yield from extra

    def write(tmp: str) -> None:
        nonlocal written, not_written, room_entries, room_bytes
        with open(tmp, "wb") as dst:
            for line in lines():
                if room_entries and len(line) <= room_bytes:
                    dst.write(line)
                    written += 1
                    room_entries -= 1
                    room_bytes -= len(line)
                else:
                    not_written += 1

    # 0600 whatever the umask: entries hold raw session text (the shards follow the umask).
    atomic_write(dest, write, private=True)
    return written, not_written
