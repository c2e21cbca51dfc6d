"""One way out: every file seam writes appears whole under its name, or not at all.

A file is written to a fresh temporary name next to its destination (``.NAME.XXXXXXXX.tmp``,
created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, so a planted symlink at a predictable
name cannot redirect the write), flushed to disk and renamed over the destination
(``os.replace``, atomic on POSIX). A failure removes the temporary file. Temporary names
start with a dot and end in ``.tmp``, so loaders that skip hidden files never see one and
``remove_temporaries`` finds the leftovers of a killed process.

Permissions: a file is created with mode ``0666`` less the process's umask, as ``open``
would create it (shards, manifest and card readable by a trainer running as another
user under the usual umask 022); ``private=True`` creates it ``0600`` whatever the
umask, for files that hold raw session text (the quarantine).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

PUBLIC_MODE = 0o666  # less the umask, applied by the kernel at creation
PRIVATE_MODE = 0o600  # the umask can only take bits away: 0600 or stricter


def temporary_path(path: Path, private: bool = False) -> Path:
    """A new, empty, uniquely named file next to ``path`` (the caller renames or removes
    it), created ``0666 & ~umask``, or ``0600`` when ``private``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, flags, PRIVATE_MODE if private else PUBLIC_MODE)
        except FileExistsError:  # 2^32 names: taken only by a leftover or a planted file
            continue
        os.close(fd)
        return tmp


def atomic_write(
    path: Path | str, write: Callable[[str], Any], fsync: bool = True, private: bool = False
) -> None:
    """``write(tmp)`` writes the whole file at ``tmp``; it then replaces ``path`` at once.
    ``private``: the file is created ``0600`` (module docstring)."""
    path = Path(path)
    tmp = temporary_path(path, private)
    try:
        write(str(tmp))
        if fsync:  # the rename must never publish a name whose data is not on disk yet
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path | str, data: bytes, fsync: bool = True, private: bool = False) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data), fsync, private)


def write_text(path: Path | str, text: str, fsync: bool = True) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), fsync)


def write_json(path: Path | str, obj: Any, fsync: bool = True) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", fsync)


def remove_temporaries(directory: Path) -> None:
    """Delete the temporary files a killed writer left in ``directory``."""
    for leftover in directory.glob(".*.tmp"):
        leftover.unlink(missing_ok=True)
