"""What seam may delete in an output directory: only what it wrote there.

Every command that writes a directory (the builds, ``seam ingest``) records the names of
the entries it is about to create in ``OUT/.seam-written`` *before* creating them, so
the record always covers what is on disk, even after a kill. ``--overwrite`` deletes
exactly the recorded entries (plus seam's own ``.lock``, ``.parts`` and temporaries);
a directory holding anything else is refused before anything is deleted, and so is an
``--out`` that contains an input or lies inside an input directory.

The record is the only thing trusted: a ``manifest.json`` is never read for names to
delete (another tool's manifest may list ``notes.txt`` or ``.bashrc``), so a directory
without a record holds nothing seam may delete.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from pipeline.common.errors import SeamError

RECORD = ".seam-written"
# seam's own bookkeeping: the lock, a build's parts, the record, temporary files.
_BOOKKEEPING = re.compile(r"^(\.lock|\.parts|\.seam-written|\..+\.tmp)$")


class OutDirError(SeamError, ValueError):
    """An output directory seam must not write into: one actionable line."""


def check_no_overlap(out: Path, inputs: list[Path], input_dirs: list[Path]) -> None:
    """Refuse an ``out`` that is an input, contains one, or lies inside an input directory
    (a later run would read its own output; ``--overwrite`` would delete inputs)."""
    out = out.expanduser().resolve()
    for f in inputs:
        f = f.resolve()
        if f == out or out in f.parents:
            raise OutDirError(
                f"--out {out} contains the input {f}; choose an --out outside the inputs"
            )
    for d in input_dirs:
        d = d.expanduser().resolve()
        if d == out or d in out.parents or out in d.parents:
            raise OutDirError(
                f"--out {out} overlaps the input directory {d}; choose an --out outside the inputs"
            )


def written(out: Path) -> set[str]:
    """Names of the entries seam recorded writing into ``out`` (none without a record)."""
    record = out / RECORD
    if record.is_file() and not record.is_symlink():
        return {n for n in record.read_text(encoding="utf-8").splitlines() if n}
    return set()


def foreign_entries(out: Path) -> list[str]:
    """Entries of ``out`` seam did not write (sorted; directories end in ``/``)."""
    if not out.is_dir():
        return []
    mine = written(out)
    return sorted(
        p.name + ("/" if p.is_dir() and not p.is_symlink() else "")
        for p in out.iterdir()
        if p.name not in mine and not _BOOKKEEPING.match(p.name)
    )


def refuse_foreign(out: Path) -> None:
    foreign = foreign_entries(out)
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise OutDirError(
            f"{out} holds files seam did not write ({shown}); seam never deletes them: "
            "choose an empty or new --out"
        )


def record(out: Path, names: list[str]) -> None:
    """Add ``names`` (entries of ``out`` about to be written) to the record, durably,
    before they are created."""
    new = [n for n in names if n not in written(out)]
    if not new:
        return
    fd = os.open(out / RECORD, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write("".join(n + "\n" for n in new))
        fh.flush()
        os.fsync(fh.fileno())


def clear_written(out: Path, keep: tuple[str, ...] = (".lock",)) -> None:
    """Delete what seam wrote in ``out`` (after ``refuse_foreign``): the manifest first, so
    a directory cleared halfway never looks like a finished build; the record last."""
    mine = written(out)
    entries = [
        p
        for p in out.iterdir()
        if p.name not in keep
        and p.name != RECORD
        and (p.name in mine or _BOOKKEEPING.match(p.name))
    ]
    for p in sorted(entries, key=lambda p: p.name != "manifest.json"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    (out / RECORD).unlink(missing_ok=True)
