"""``--format auto``: which reader understands a file, decided from its content.

Every registered reader sniffs the file's first MiB (decompressed) and its name; the
sniffers are written to be mutually exclusive on real files, so exactly one should
answer. None, or more than one, is an error that names the candidates, so the user
can pass ``--format`` instead of getting a silently wrong conversion.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.common.errors import InputError
from pipeline.readers import REGISTRY
from pipeline.readers.common import read_head

HEAD_BYTES = 1 << 20


class FormatError(InputError):
    """The format of a file cannot be decided: one actionable line (a bad input, so the
    build commands report it like a missing file, before any work)."""


def candidates(path: Path) -> list[str]:
    """Names of the readers whose sniffer accepts ``path``."""
    try:
        head = read_head(path, HEAD_BYTES)
    except (OSError, EOFError, ValueError) as exc:
        raise FormatError(f"{path}: cannot read it to detect its format: {exc}") from None
    return [name for name, reader in sorted(REGISTRY.items()) if reader.sniff(path, head)]


def detect_format(path: Path) -> str:
    found = candidates(path)
    if len(found) == 1:
        return found[0]
    if found:
        raise FormatError(
            f"{path}: ambiguous format, it could be {' or '.join(found)}; "
            f"pass --format with one of them"
        )
    raise FormatError(
        f"{path}: format not recognised by any reader (known: {', '.join(sorted(REGISTRY))}); "
        f"pass --format NAME if it is one of them"
    )
