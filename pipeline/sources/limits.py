"""Limits on what one input record may cost, so a small hostile file cannot exhaust memory.

A 32 KB ``.jsonl.zst`` can hold a 1 GiB line; JSON nested a thousand levels deep
overflows Python's recursion in whichever function walks it first. Each limit is an
option with a safe default; a record over one is quarantined with the limit named
(and the option that raises it), and its neighbours are read on:

- ``max_line_bytes``: one JSONL line (one record); read in bounded pieces, so a longer
  line is skipped without ever being held in memory;
- ``max_document_bytes``: a whole-file JSON document (OpenHands, SWE-agent, ATIF, ...);
- ``max_decompressed_bytes``: all the data of one ``.gz``/``.zst`` file once decompressed;
- ``max_message_bytes``: the text of one message (content, reasoning, tool-call
  arguments): tokenizing text costs about 100 bytes of memory per byte, so this bounds a
  worker's memory (a 50 MB tool output would need over 5 GB);
- ``max_depth``: nesting of JSON objects and arrays in one record;
- ``max_quarantine_raw_bytes``: raw text copied into a build's quarantine, shared evenly
  by its tasks (entries past a task's share keep file, line and reason, not ``raw``);
- ``max_quarantine_entries`` / ``max_quarantine_bytes``: entries, and bytes, of a build's
  ``quarantine.jsonl``: five million ``{}`` lines fit in a 38 KB ``.jsonl.zst`` and
  made a 754 MB quarantine. Past the cap the first entries stay as a sample and the
  rest are counted, not written (``quarantine_not_written`` in the manifest's counts
  and the summary); every record is still counted as quarantined.

The limits in force are those of the ``ReadContext`` a command reads under
(``pipeline/read_context.py``): held in a ``ContextVar``, set only while that context's
reading runs, so two builds with different limits in one process (threads, or
generators read in turns) each read under their own. Outside any context: the defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields

from pipeline.common.options import MIB, in_mib, option, option_of

PER_RECORD = "limits per input record (a record over one is quarantined)"
QUARANTINE_CAPS = "quarantine.jsonl caps (past them: a sample, and the count of the rest)"
POSITIVE = "the --max-* limits must be positive"


def _mib(flag: str, what: str, group: str = PER_RECORD) -> dict:
    """A limit in bytes set in MiB on the command line."""
    return {
        "flag": flag,
        "help": f"{what} (default {{default}}).",
        **in_mib(),
        "check": lambda mb: mb > 0,
        "error": POSITIVE,
        "group": group,
    }


def _count(flag: str, what: str, group: str) -> dict:
    return {
        "flag": flag,
        "help": f"{what} (default {{default}}).",
        "type": int,
        "metavar": "N",
        "check": lambda n: n >= 1,
        "error": POSITIVE,
        "group": group,
    }


@dataclass(frozen=True)
class Limits:
    """Each field carries its flag (``pipeline/common/options.py``); every limit decides
    which records are quarantined, so the build fingerprints the whole set when it is not
    the default (``BuildConfig.limits``)."""

    max_line_bytes: int = option(64 * MIB, **_mib("--max-line-mb", "MiB per JSONL line"))
    max_document_bytes: int = option(
        128 * MIB, **_mib("--max-document-mb", "MiB per whole-file JSON document")
    )
    max_decompressed_bytes: int = option(
        16 * 1024 * MIB, **_mib("--max-decompressed-mb", "MiB per .gz/.zst file, decompressed")
    )
    max_message_bytes: int = option(
        8 * MIB, **_mib("--max-message-mb", "MiB of text per message (bounds memory)")
    )
    max_depth: int = option(
        100, **_count("--max-depth", "JSON nesting levels per record", PER_RECORD)
    )
    # No flag: a share of the quarantine's bytes (raw text past it is left out, counted).
    max_quarantine_raw_bytes: int = option(64 * MIB)
    max_quarantine_entries: int = option(
        100_000, **_count("--max-quarantine-entries", "Entries written", QUARANTINE_CAPS)
    )
    max_quarantine_bytes: int = option(
        128 * MIB, **_mib("--max-quarantine-mb", "MiB written", QUARANTINE_CAPS)
    )

    def as_dict(self) -> dict:
        return asdict(self)


# Options that set each limit, named in the reasons of the records over it.
OPTION = {f.name: option_of(f).flag for f in fields(Limits) if option_of(f).flag}  # type: ignore[union-attr]
# The flags of the quarantine caps: commands that write no quarantine.jsonl skip them.
QUARANTINE_CAP_FIELDS = tuple(
    f.name
    for f in fields(Limits)
    if option_of(f).group == QUARANTINE_CAPS  # type: ignore[union-attr]
)

# The limits of the reading in progress in this thread or generator step (set by
# ``ReadContext``); never assigned for the whole process.
_in_force: ContextVar[Limits] = ContextVar("seam_limits", default=Limits())  # noqa: B039 (frozen)


def current() -> Limits:
    """The limits of the ``ReadContext`` whose reading is running (defaults outside one)."""
    return _in_force.get()


@contextmanager
def in_force(limits: Limits) -> Iterator[None]:
    """``limits`` in force for the code run inside (this thread and context only)."""
    token = _in_force.set(limits)
    try:
        yield
    finally:
        _in_force.reset(token)


def set_in_this_context(limits: Limits) -> None:
    """Set ``limits`` in the current ``contextvars.Context``: only for a Context made for
    one reading (``ReadContext.read``), which nothing else runs in."""
    _in_force.set(limits)


def over(name: str, what: str) -> str:
    """The reason for a record over the limit ``name``: the limit, its value, its option."""
    value = getattr(current(), name)
    shown = f"{value / MIB:g} MiB" if name.endswith("_bytes") else str(value)
    return f"{what} exceeds the {name} limit ({shown}; raise it with {OPTION[name]})"


class DepthError(ValueError):
    """JSON nested deeper than ``max_depth``."""


def check_depth(obj: object, raw: bytes | None = None) -> None:
    """Raise ``DepthError`` if ``obj`` (parsed JSON) nests deeper than ``max_depth``.
    Iterative, so the check itself cannot overflow the stack; skipped when ``raw`` (the
    JSON text) has too few brackets to nest that deep, which is most small records.
    Level by level (the containers of one depth, then theirs): a stack of (value, depth)
    pairs cost 3.5x more, a fifth of a build's ``read`` step."""
    limit = _in_force.get().max_depth
    if raw is not None and raw.count(b"{") + raw.count(b"[") <= limit:
        return
    level: list = [obj] if isinstance(obj, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            raise DepthError(over("max_depth", f"JSON nesting of {depth}+ levels"))
        # One comprehension per level: ~15% cheaper than appending in nested loops.
        level = [
            child
            for value in level
            for child in (value.values() if isinstance(value, dict) else value)
            if isinstance(child, _CONTAINERS)
        ]


_CONTAINERS = (dict, list)
