"""The SHA-256 of a file (inputs, rewards and corrections files, shards)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path, stop=None) -> str:
    """sha256 of a file, read in 1 MiB blocks; ``stop`` (a ``threading.Event``) ends it
    early (the result is then meaningless: used when the build has already failed)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            if stop is not None and stop.is_set():
                break
    return digest.hexdigest()
