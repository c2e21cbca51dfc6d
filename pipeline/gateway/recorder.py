"""Crash-safe collection files: every completed call is one line, written before the
harness gets its answer and fsync'd as ``--durability`` says.

A call is written as ONE ``write`` of one complete JSON line to a file opened with
``O_APPEND``. What survives what (``--durability``):

- ``group`` (the default): the line is written before the answer is sent, so a killed
  process (``kill -9``, a crash of the gateway) loses only the call in flight; the kernel
  still holds the written lines. They reach the disk in background rounds (``Syncer``:
  on Linux one ``syncfs`` per filesystem written, else one ``fsync`` per file written in
  the round, across all sessions), each round starting at most ``GROUP_WINDOW_S`` (50 ms)
  after the first write it covers: a power loss or OS crash loses at most the calls
  answered in that window plus one round's time.
- ``sync``: the answer is sent only after a round that covers its line returned (its
  file's data and a new file's directory entry are on the disk). Concurrent calls share
  rounds (group commit: the calls written while one round runs are made durable together
  by the next), so a power loss loses no answered call.
- ``none``: no ``fsync``; a killed process loses only the call in flight, an OS crash or
  power loss whatever the kernel had not yet written back (typically up to 30 s).

A ``kill -9`` can only cut the line being written (the call in flight): the readers
quarantine that one line with its reason and keep every call before it. Files are
never rewritten.

Layout of ``--out``:
- ``calls/<rollout_id>.jsonl``: the ``chat-completions`` call log of one session;
- ``corrections.jsonl``: ``schemas.correction.Correction`` records (``--corrections``);
- ``rewards.jsonl``: outcomes posted by the harness (``--rewards``);
- ``gateway.json``: what collected the data (upstream, token-id mode, judge);
- ``.gateway.lock``: held while a gateway writes here (a second one is refused).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from pipeline.common import atomic
from pipeline.common.errors import SeamError
from pipeline.readers import raw_ids

# Matched whole (fullmatch): with match() and "$", "abc\n" passed ("$" matches before a
# trailing newline) and named a file "abc\n.jsonl".
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


class RecorderError(SeamError, RuntimeError):
    """The collection directory cannot be used; the message says why and what to do."""


def check_id(value: str, what: str) -> str:
    """A rollout or task id that is safe as a file name and a group key."""
    if not SAFE_ID.fullmatch(value or "") or ".." in value:
        raise ValueError(
            f"{what} {value!r} must be 1-200 characters of letters, digits, '.', '_', ':' or '-'"
        )
    return value


DURABILITY_MODES = ("group", "sync", "none")
GROUP_WINDOW_S = 0.05  # --durability group: a written line is fsync'd within this (+ a round)
# Lines up to this size are written on the event loop (no fsync there: that is a thread's
# job), larger ones from a thread, so a slow large write does not hold up other sessions.
INLINE_WRITE_BYTES = 64 * 1024


def _append_line(path: Path, record: dict, fsync: bool = True) -> bool:
    """Append ``record`` as one line (``_append_bytes``), fsync'd when ``fsync``."""
    return _append_bytes(path, orjson.dumps(record) + b"\n", fsync=fsync)


def _append_bytes(
    path: Path,
    data: bytes,
    fsync: bool = False,
    finish: Callable[[bytes], bytes] | None = None,
) -> bool:
    """Append ``data`` (one line, newline included) with ONE ``write`` to the file opened
    ``O_APPEND``; True when the file was new (its directory entry still needs an fsync to
    survive a power loss). ``finish`` edits the bytes just before the write (the gateway
    stamps ``gateway_ms`` there, so it includes the record's own serialization).

    A file whose last line was cut (a kill or a full disk during an earlier write) first
    gets its newline back: the fragment stays a line of its own, which the readers
    quarantine with its reason, instead of swallowing this answered call (before, the
    call was appended to the fragment and lost at build time)."""
    fd, size, cut = _open_append(path)
    try:
        _write_line(fd, b"\n" + data if cut else data, finish)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return size == 0


def _open_append(path: Path) -> tuple[int, int, bool]:
    """(a descriptor appending to ``path``, created if need be, its size, whether its
    last line was cut: it does not end in a newline)."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        size = os.fstat(fd).st_size
        cut = bool(size) and os.pread(fd, 1, size - 1) != b"\n"
    except BaseException:
        os.close(fd)
        raise
    return fd, size, cut


def _write_line(fd: int, data: bytes, finish: Callable[[bytes], bytes] | None) -> None:
    if finish is not None:
        data = finish(data)
    written = os.write(fd, data)
    while written < len(data):  # a short write (rare): finish the same line
        written += os.write(fd, data[written:])


# Call logs kept open for appending (LogFiles), at most this many and an eighth of the
# process's open-files limit (each session also holds two sockets); the least recently
# written is closed past it.
OPEN_LOGS = 512


def _open_logs_cap() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 16
    if soft == resource.RLIM_INFINITY:
        return OPEN_LOGS
    return max(4, min(OPEN_LOGS, soft // 8))


class LogFiles:
    """The append descriptors of the files being written, kept open between lines: opening,
    checking the tail of and closing a session's log for every call was four system calls
    more per call, each a release and re-take of the GIL on the event loop (py-spy: ~8% of
    the gateway's event-loop samples at 64 sessions). The tail is checked when a file is
    opened (``_append_bytes``'s repair of a cut line); after that every line is written
    whole by this process (the lock keeps other gateways out), and a write that fails
    closes the descriptor, so the next line opens and checks the file again. At most
    ``cap`` stay open (the least recently written is closed): a fleet's finished sessions
    do not hold descriptors. Calls of one file are written one at a time (the session's
    lock, the side files' lock), possibly from a thread (a large line)."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = _open_logs_cap() if cap is None else cap
        self._fds: dict[Path, int] = {}  # insertion-ordered: the least recent first
        self._lock = threading.Lock()  # the dict, when a large line is written from a thread

    def append(
        self, path: Path, data: bytes, finish: Callable[[bytes], bytes] | None = None
    ) -> bool:
        """``_append_bytes`` (no fsync) on the kept descriptor: True when the file was new."""
        with self._lock:
            fd = self._fds.pop(path, None)
        new = False
        if fd is None:
            fd, size, cut = _open_append(path)
            new = size == 0
            if cut:
                data = b"\n" + data
        try:
            _write_line(fd, data, finish)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._fds[path] = fd
            while len(self._fds) > self.cap:
                os.close(self._fds.pop(next(iter(self._fds))))
        return new

    def close(self) -> None:
        with self._lock:
            while self._fds:
                os.close(self._fds.popitem()[1])


def libc_syncfs() -> Callable[[int], None] | None:
    """Linux's ``syncfs(fd)`` (through libc; the GIL is released while it runs), or None
    where there is none. It writes back and commits everything dirty on ``fd``'s filesystem
    and flushes the disk's cache, like an ``fsync`` of every file there; since Linux 5.8 it
    reports a writeback error on that filesystem since ``fd`` was opened."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    call.argtypes, call.restype = [ctypes.c_int], ctypes.c_int

    def syncfs(fd: int) -> None:
        if call(fd) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))

    return syncfs


_DEFAULT = object()
# Filesystems whose syncfs makes every file's data and names durable, as fsync would (a
# journal or log commit and a cache flush). Elsewhere (a network or FUSE filesystem, where
# syncfs may only write pages back) the rounds fsync each file.
SYNCFS_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs"})


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem ``path`` is on (Linux: ``/proc/self/mountinfo``, matched
    by device number), or None when it cannot be told."""
    try:
        dev = os.stat(path).st_dev
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == wanted and " - " in line:
            return line.split(" - ", 1)[1].split()[0]
    return None


class Syncer:
    """Makes written lines durable in rounds, off the event loop.

    ``written(path)`` registers a file that got a line; a background task makes every
    registered file durable once per round. ``sync`` mode: a round starts as soon as the
    previous one ends, and ``written`` returns a future that resolves when the round that
    covers the line has made it durable (group commit); ``group`` mode: a round starts
    ``window_s`` after its first write and nobody waits for it; ``none``: nothing is synced.

    A round is one ``syncfs`` per filesystem written (on Linux: ``libc_syncfs``; the
    ``Recorder`` uses it only on ``SYNCFS_FILESYSTEMS``), else one ``fsync`` per file (and
    per directory that got a new file). With one ``fsync`` per file
    a round cost ~0.2 ms of CPU and ~3.5 ms of wall time per file on ext4 (each fsync
    allocated its file's delayed blocks and committed the journal on its own): at 64
    sessions a round took ~220 ms, at 256 near a second, which is also how long a written
    line waited to be durable. One ``syncfs`` for the same 64 files: ~0.7 ms of CPU and
    ~14 ms (bench on the VM's ext4). Its cost: it also writes back what other processes
    left dirty on the same filesystem (so might an ext4 journal commit), so a round there
    can take longer; in ``group`` mode nobody waits for a round, in ``sync`` mode answers
    do. Each filesystem's directory descriptor stays open, so ``syncfs`` reports a
    writeback error since the first round (Linux 5.8 and later); a failed round fails
    every file it covered. ``fsync`` and ``syncfs`` are injectable so the tests can watch
    the order of rounds and answers; an injected ``fsync`` without a ``syncfs`` gets
    rounds of ``fsync``."""

    def __init__(
        self, mode: str, window_s: float = GROUP_WINDOW_S, fsync=os.fsync, syncfs=_DEFAULT
    ):
        if mode not in DURABILITY_MODES:
            raise ValueError(f"durability {mode!r}: choose one of {', '.join(DURABILITY_MODES)}")
        self.mode, self.window_s, self.fsync = mode, window_s, fsync
        if syncfs is _DEFAULT:
            syncfs = libc_syncfs() if fsync is os.fsync else None
        self.syncfs: Callable[[int], None] | None = syncfs
        self._fs: dict[Path, tuple[int, int]] = {}  # a directory -> (its fd, its st_dev)
        self._dirty: dict[Path, list[asyncio.Future]] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self.rounds = 0
        self.errors: list[str] = []  # fsync failures (group mode reports them here)

    def written(self, path: Path, new_file: bool = False) -> asyncio.Future | None:
        if self.mode == "none":
            return None
        if self.mode == "group" and path in self._dirty:
            # Already in the coming round: that entry was added after the round before took
            # its batch (``_round`` swaps ``_dirty`` right after clearing the wake-up, with
            # no await between), and its wake-up is still set, so that round covers this
            # line too. Nobody waits in group mode.
            return None
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        waiters = self._dirty.setdefault(path, [])
        if new_file and self.syncfs is None:  # its name is durable once its directory is
            self._dirty.setdefault(path.parent, [])
        waiter = loop.create_future() if self.mode == "sync" else None
        if waiter is not None:
            waiters.append(waiter)
        assert self._wake is not None
        self._wake.set()
        return waiter

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            if self.mode == "group" and not self._closing:
                await asyncio.sleep(self.window_s)
            self._wake.clear()  # writes from here on wake the next round
            await self._round()
            if self._closing and not self._dirty:
                return

    async def _round(self) -> None:
        batch, self._dirty = self._dirty, {}
        if not batch:
            return
        failed = await asyncio.to_thread(self._sync_paths, list(batch))
        self.rounds += 1
        for path, waiters in batch.items():
            for waiter in waiters:
                if waiter.done():
                    continue
                if path in failed:
                    waiter.set_exception(OSError(f"fsync of {path.name} failed: {failed[path]}"))
                else:
                    waiter.set_result(None)

    def _sync_paths(self, paths: list[Path]) -> dict[Path, str]:
        if self.syncfs is not None:
            return self._syncfs_paths(paths)
        failed: dict[Path, str] = {}
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    self.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                failed[path] = exc.strerror or str(exc)
                self.errors.append(f"{path}: {failed[path]}")
        return failed

    def _syncfs_paths(self, paths: list[Path]) -> dict[Path, str]:
        """One ``syncfs`` per filesystem the ``paths`` are on (their directories' devices)."""
        assert self.syncfs is not None
        by_dev: dict[int, tuple[int, list[Path]]] = {}
        failed: dict[Path, str] = {}
        for path in paths:
            try:
                fd, dev = self._fs_of(path.parent)
            except OSError as exc:
                failed[path] = exc.strerror or str(exc)
                continue
            by_dev.setdefault(dev, (fd, []))[1].append(path)
        for fd, on in by_dev.values():
            try:
                self.syncfs(fd)
            except OSError as exc:
                for path in on:
                    failed[path] = exc.strerror or str(exc)
        for path, reason in failed.items():
            self.errors.append(f"{path}: {reason}")
        return failed

    def _fs_of(self, directory: Path) -> tuple[int, int]:
        found = self._fs.get(directory)
        if found is None:
            fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
            found = self._fs[directory] = (fd, os.fstat(fd).st_dev)
        return found

    def close(self) -> None:
        """Close the directory descriptors kept for ``syncfs`` (after the last round)."""
        while self._fs:
            os.close(self._fs.popitem()[1][0])

    async def drain(self) -> None:
        """Finish the rounds: fsync what is still pending (the gateway is stopping)."""
        if self._task is not None:
            assert self._wake is not None
            self._closing = True
            self._wake.set()
            await self._task
            self._task, self._closing = None, False

    def drain_blocking(self) -> None:
        """``drain`` without an event loop (the loop already ended), then ``close``."""
        batch, self._dirty = self._dirty, {}
        if batch:
            self._sync_paths(list(batch))
        self.close()


class Recorder:
    """Owns ``--out`` for one gateway process: the lock, the call logs, the side files."""

    def __init__(
        self,
        out: Path,
        manifest: dict[str, Any],
        durability: str = "group",
        fsync=os.fsync,
        window_s: float = GROUP_WINDOW_S,
        syncfs=_DEFAULT,
    ):
        self.out = Path(out)
        self.calls_dir = self.out / "calls"
        try:
            self.calls_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RecorderError(f"--out {out}: cannot create it ({exc.strerror})") from None
        if syncfs is _DEFAULT and fsync is os.fsync:  # syncfs where it is an fsync of all
            dirs = (self.out, self.calls_dir)
            local = all(filesystem_type(d) in SYNCFS_FILESYSTEMS for d in dirs)
            syncfs = libc_syncfs() if local else None
        self.syncer = Syncer(durability, window_s, fsync, syncfs)
        lock_path = self.out / ".gateway.lock"
        if lock_path.is_symlink():
            raise RecorderError(f"--out {out}: .gateway.lock is a symlink; remove it")
        self._lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise RecorderError(
                f"--out {out}: another seam gateway is writing there; stop it or choose another --out"
            ) from None
        self.manifest = {
            "format": "seam-gateway/1",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **manifest,
            "durability": durability,
            "calls": 0,
            "calls_with_token_ids": 0,
        }
        self._manifest_lock = threading.Lock()  # calls of several sessions finish at once
        self._manifest_written = 0.0
        self._manifest_pending: asyncio.Future | None = None  # a rewrite in its thread
        self._locks: dict[str, asyncio.Lock] = {}
        self._logs: dict[str, Path] = {}  # rollout id -> its call log
        self._side_lock = asyncio.Lock()
        self._rewards: dict[str, dict] | None = None  # rollout id -> its recorded outcome
        self.files = LogFiles()
        self.write_manifest()

    def close(self) -> None:
        self.syncer.drain_blocking()  # normally drained by the app's cleanup already
        self.files.close()
        self.write_manifest()
        os.close(self._lock_fd)

    async def drain(self) -> None:
        """Make every written line durable now (the gateway is stopping)."""
        if self._manifest_pending is not None:
            await asyncio.wait([self._manifest_pending])
        await self.syncer.drain()

    def write_manifest(self) -> None:
        with self._manifest_lock:
            self._write_manifest()

    def _write_manifest(self) -> None:
        ids = self.manifest["calls_with_token_ids"]
        calls = self.manifest["calls"]
        if self.syncer.errors:  # group mode cannot fail a call for it: it is said here
            self.manifest["fsync_errors"] = len(self.syncer.errors)
            self.manifest["last_fsync_error"] = self.syncer.errors[-1]
        self.manifest["token_ids"] = (
            "none yet" if not calls else "all" if ids == calls else "none" if not ids else "some"
        )
        # rewritten after every call: no fsync, as before (a crash keeps the previous one)
        atomic.write_text(
            self.out / "gateway.json", json.dumps(self.manifest, indent=2) + "\n", fsync=False
        )

    def session_lock(self, rollout_id: str) -> asyncio.Lock:
        """Calls of one session are recorded in the order they complete, one at a time."""
        lock = self._locks.get(rollout_id)
        if lock is None:  # not setdefault: that built a Lock on every call to throw away
            lock = self._locks[rollout_id] = asyncio.Lock()
        return lock

    def log_path(self, rollout_id: str) -> Path:
        """The session's call log, ``calls/ROLLOUT_ID.jsonl`` (kept: a Path join per call
        was ~2 µs)."""
        path = self._logs.get(rollout_id)
        if path is None:
            path = self._logs[rollout_id] = self.calls_dir / f"{rollout_id}.jsonl"
        return path

    async def record_call(
        self,
        rollout_id: str,
        record: dict,
        token_ids: bool,
        finish: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """Write the call's line (one write), then wait for its fsync as ``--durability``
        says: ``sync`` returns once a round fsync'd it; ``group`` and ``none`` at once."""
        await self._append(self.log_path(rollout_id), record, finish)
        self.manifest["calls"] += 1
        self.manifest["calls_with_token_ids"] += int(token_ids)
        # Kept current within a second (not fsync'd: the call logs are the truth, this is
        # their summary; rewriting it on every call would cost more than the call's line).
        # Written by a thread the call does not wait for: the answer is not held up by it,
        # and a failure to write the summary does not fail a call already recorded.
        if time.monotonic() - self._manifest_written > 1.0 and self._manifest_pending is None:
            self._manifest_written = time.monotonic()
            pending = asyncio.get_running_loop().run_in_executor(None, self.write_manifest)
            self._manifest_pending = pending
            pending.add_done_callback(self._manifest_done)

    def _manifest_done(self, pending: asyncio.Future) -> None:
        self._manifest_pending = None
        if not pending.cancelled() and pending.exception() is not None:
            exc = pending.exception()
            print(f"seam gateway: gateway.json not updated: {exc}", file=sys.stderr)

    async def record_reward(self, row: dict) -> dict | None:
        """Record ``row`` unless its rollout already has an outcome: returns that earlier
        outcome (the caller refuses a different one; the same one again is a no-op), or
        None when ``row`` was recorded. Check and append are one step under the lock, so
        two concurrent posts cannot both record. rewards.jsonl is read once per process,
        so a restarted gateway knows the earlier outcomes."""
        async with self._side_lock:
            if self._rewards is None:
                self._rewards = await asyncio.to_thread(self._read_rewards)
            earlier = self._rewards.get(row["rollout_id"])
            if earlier is not None:
                return earlier
            await self._append(self.out / "rewards.jsonl", row)
            self._rewards[row["rollout_id"]] = row
            return None

    def _read_rewards(self) -> dict[str, dict]:
        found: dict[str, dict] = {}
        path = self.out / "rewards.jsonl"
        if path.is_file():
            for line in path.read_bytes().splitlines():
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError:  # a cut line: the build quarantines it
                    continue
                if isinstance(row, dict) and isinstance(row.get("rollout_id"), str):
                    found.setdefault(row["rollout_id"], row)
        return found

    async def record_side(self, name: str, record: dict) -> None:
        async with self._side_lock:
            await self._append(self.out / name, record)

    async def _append(
        self, path: Path, record: dict, finish: Callable[[bytes], bytes] | None = None
    ) -> None:
        # default: the engine's prompt ids kept as bytes are spliced in as they came
        data = orjson.dumps(record, default=raw_ids.default, option=orjson.OPT_APPEND_NEWLINE)
        if len(data) <= INLINE_WRITE_BYTES:  # a page-cache write: cheaper than a thread hop
            new = self.files.append(path, data, finish)
        else:
            new = await asyncio.to_thread(self.files.append, path, data, finish)
        waiter = self.syncer.written(path, new)
        if waiter is not None:
            await waiter
