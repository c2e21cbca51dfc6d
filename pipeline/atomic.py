"""One way out: every file seam writes appears whole under its name, or not at all.

A file is written to a fresh temporary name next to its destination (``.NAME.XXXXXXXX.tmp``,
created with ``O_EXCL`` by ``tempfile.mkstemp``, so a planted symlink at a predictable
name cannot redirect the write), flushed to disk and renamed over the destination
(``os.replace``, atomic on POSIX). A failure removes the temporary file. Temporary names
start with a dot and end in ``.tmp``, so loaders that skip hidden files never see one and
``remove_temporaries`` finds the leftovers of a killed process.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def temporary_path(path: Path) -> Path:
    """A new, empty, uniquely named file next to ``path`` (the caller renames or removes it)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    return Path(name)


def atomic_write(path: Path | str, write: Callable[[str], Any], fsync: bool = True) -> None:
    """``write(tmp)`` writes the whole file at ``tmp``; it then replaces ``path`` at once."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        write(str(tmp))
        if fsync:  # the rename must never publish a name whose data is not on disk yet
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path | str, data: bytes, fsync: bool = True) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data), fsync)


def write_text(path: Path | str, text: str, fsync: bool = True) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), fsync)


def write_json(path: Path | str, obj: Any, fsync: bool = True) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", fsync)


def remove_temporaries(directory: Path) -> None:
    """Delete the temporary files a killed writer left in ``directory``."""
    for leftover in directory.glob(".*.tmp"):
        leftover.unlink(missing_ok=True)
