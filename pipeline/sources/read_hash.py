"""What a build read is what it hashed: block digests taken while reading, compared
with the ones taken when the build hashed its inputs, before anything is published.

A build hashes every input once, first (the manifest's ``sha256``, the fingerprint).
The tasks read the inputs again, later, maybe much later. An input edited in place in
between — same size, mtime put back — would be built from other bytes than the
manifest describes; ``seam verify`` would find it only after the shards are out, and
``--verify none`` never. So both reads hash the file in fixed blocks of ``BLOCK``
bytes (aligned at multiples of ``BLOCK`` from the start of the file):

- the first pass (``file_digests``): the file's sha256 and the sha256 of each block;
- every later read through ``open_input`` while ``recording()`` is on (a task in a
  worker; the build's feeder of compressed ranges): the sha256 of each block the read
  touched, from the very bytes handed to the reader. A read that starts or ends inside
  a block hashes the rest of that block too (``os.pread``; at most two blocks per
  read), so every digest covers a whole block.

``changed_blocks`` compares the two; the build fails on any difference, before it
publishes. A block read twice with different bytes is recorded as ``CHANGED``. The cost
is one more sha256 of every byte hashed first and of every byte read (both run at
hardware speed and release the GIL; measured in docs/robustness.md); no input is read
a second time for it.

Reads that do not go through ``open_input`` (Parquet through Arrow, a reader's plain
``open``) are not recorded: an input whose blocks were not all recorded (those, or a
read that stopped early) is hashed again at the end instead.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BLOCK = 1 << 20
CHANGED = "changed-while-read"  # a block read twice with different bytes

# {input path as opened: {block index: sha256 hex}}, per thread while recording
ReadLog = dict[str, dict[int, str]]
_recording = threading.local()


def file_digests(path: Path, stop: threading.Event | None = None) -> tuple[str, list[str]]:
    """The file's sha256 and the sha256 of each of its ``BLOCK``-byte blocks, in one pass;
    ``stop`` ends it early (the result is then meaningless: the build already failed)."""
    whole = hashlib.sha256()
    blocks: list[str] = []
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(BLOCK), b""):
            whole.update(block)
            blocks.append(hashlib.sha256(block).hexdigest())
            if stop is not None and stop.is_set():
                break
    return whole.hexdigest(), blocks


@contextmanager
def recording() -> Iterator[ReadLog]:
    """Record, on this thread, the block digests of every read through ``open_input``."""
    log: ReadLog = {}
    previous = getattr(_recording, "log", None)
    _recording.log = log
    try:
        yield log
    finally:
        _recording.log = previous


def open_input(path: Path) -> io.RawIOBase | io.BufferedReader:
    """``open(path, "rb")``, unbuffered; hashed in blocks while ``recording()`` is on."""
    log = getattr(_recording, "log", None)
    if log is None:
        return open(path, "rb", buffering=0)
    return _HashedFile(path, log.setdefault(str(path), {}))


def changed_blocks(recorded: dict[int, set[str]], hashed: list[str]) -> list[int]:
    """The blocks with a recorded digest (of any read) that is not the one hashed first,
    sorted."""
    return sorted(
        i
        for i, digests in recorded.items()
        if any(i >= len(hashed) or hashed[i] != digest for digest in digests)
    )


class _HashedFile(io.RawIOBase):
    """A raw binary file that hashes, block by block, the bytes it hands out."""

    def __init__(self, path: Path, blocks: dict[int, str]):
        self._fh = open(path, "rb", buffering=0)  # noqa: SIM115 (closed in close())
        self._fd = self._fh.fileno()
        self._blocks = blocks
        self._pos = 0
        self._block: int | None = None  # the block being hashed
        self._digest = hashlib.sha256()
        self._filled = 0  # bytes of the block hashed so far

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = self._fh.seek(offset, whence)
        if target != self._pos:
            self._finish()
            self._pos = target
        return target

    def readinto(self, buffer) -> int:
        n = self._fh.readinto(buffer)
        if n:
            view = memoryview(buffer).cast("B")[:n]
            at = 0
            while at < n:
                if self._block is None:
                    self._start(self._pos + at)
                take = min(n - at, BLOCK - self._filled)
                self._digest.update(view[at : at + take])
                self._filled += take
                at += take
                if self._filled == BLOCK:
                    self._record()
            self._pos += n
        else:  # end of file: the open block ends here
            self._finish()
        return n

    def _start(self, pos: int) -> None:
        """Open the block holding ``pos``, hashing its bytes before ``pos`` first."""
        self._block, self._filled = pos // BLOCK, pos % BLOCK
        self._digest = hashlib.sha256(os.pread(self._fd, self._filled, pos - self._filled))

    def _finish(self) -> None:
        """Hash the rest of the open block (up to the end of the file) and record it."""
        if self._block is None:
            return
        end = (self._block + 1) * BLOCK
        at = self._block * BLOCK + self._filled
        while at < end and (rest := os.pread(self._fd, min(end - at, 1 << 20), at)):
            self._digest.update(rest)
            at += len(rest)
        self._record()

    def _record(self) -> None:
        assert self._block is not None
        digest = self._digest.hexdigest()
        seen = self._blocks.setdefault(self._block, digest)
        if seen != digest:
            self._blocks[self._block] = CHANGED
        self._block = None

    def close(self) -> None:
        if not self.closed:
            try:
                self._finish()
            finally:
                self._fh.close()
        super().close()
