"""Crash-safe collection files: every completed call is one fsync'd line.

A call is written as ONE ``write`` of one complete JSON line to a file opened with
``O_APPEND``, then ``fsync``'d before the harness gets its answer. A ``kill -9`` can
therefore only cut the line being written (the call in flight): the readers quarantine
that one line with its reason and keep every call before it. Files are never rewritten.

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
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from pipeline import atomic

# Matched whole (fullmatch): with match() and "$", "abc\n" passed ("$" matches before a
# trailing newline) and named a file "abc\n.jsonl".
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


class RecorderError(RuntimeError):
    """The collection directory cannot be used; the message says why and what to do."""


def check_id(value: str, what: str) -> str:
    """A rollout or task id that is safe as a file name and a group key."""
    if not SAFE_ID.fullmatch(value or "") or ".." in value:
        raise ValueError(
            f"{what} {value!r} must be 1-200 characters of letters, digits, '.', '_', ':' or '-'"
        )
    return value


def _append_line(path: Path, record: dict) -> None:
    """Append ``record`` as one line. A file whose last line was cut (a kill or a full
    disk during an earlier write) first gets its newline back: the fragment stays a line
    of its own, which the readers quarantine with its reason, instead of swallowing this
    answered call (before, the call was appended to the fragment and lost at build time)."""
    data = orjson.dumps(record) + b"\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        written = os.write(fd, data)
        while written < len(data):  # a short write (rare): finish the same line
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)


class Recorder:
    """Owns ``--out`` for one gateway process: the lock, the call logs, the side files."""

    def __init__(self, out: Path, manifest: dict[str, Any]):
        self.out = Path(out)
        self.calls_dir = self.out / "calls"
        try:
            self.calls_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RecorderError(f"--out {out}: cannot create it ({exc.strerror})") from None
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
            "calls": 0,
            "calls_with_token_ids": 0,
        }
        self._manifest_lock = threading.Lock()  # calls of several sessions finish at once
        self._manifest_written = 0.0
        self._locks: dict[str, asyncio.Lock] = {}
        self._side_lock = asyncio.Lock()
        self._rewards: dict[str, dict] | None = None  # rollout id -> its recorded outcome
        self.write_manifest()

    def close(self) -> None:
        self.write_manifest()
        os.close(self._lock_fd)

    def write_manifest(self) -> None:
        with self._manifest_lock:
            self._write_manifest()

    def _write_manifest(self) -> None:
        ids = self.manifest["calls_with_token_ids"]
        calls = self.manifest["calls"]
        self.manifest["token_ids"] = (
            "none yet" if not calls else "all" if ids == calls else "none" if not ids else "some"
        )
        # rewritten after every call: no fsync, as before (a crash keeps the previous one)
        atomic.write_text(
            self.out / "gateway.json", json.dumps(self.manifest, indent=2) + "\n", fsync=False
        )

    def session_lock(self, rollout_id: str) -> asyncio.Lock:
        """Calls of one session are recorded in the order they complete, one at a time."""
        return self._locks.setdefault(rollout_id, asyncio.Lock())

    async def record_call(self, rollout_id: str, record: dict, token_ids: bool) -> None:
        await asyncio.to_thread(_append_line, self.calls_dir / f"{rollout_id}.jsonl", record)
        self.manifest["calls"] += 1
        self.manifest["calls_with_token_ids"] += int(token_ids)
        # Kept current within a second (not fsync'd: the call logs are the truth, this is
        # their summary; rewriting it on every call would cost more than the call's line).
        if time.monotonic() - self._manifest_written > 1.0:
            self._manifest_written = time.monotonic()
            await asyncio.to_thread(self.write_manifest)

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
            await asyncio.to_thread(_append_line, self.out / "rewards.jsonl", row)
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
            await asyncio.to_thread(_append_line, self.out / name, record)
