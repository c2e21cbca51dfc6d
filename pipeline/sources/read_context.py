"""What a command reads its inputs under: the record limits (``pipeline/sources/limits.py``) and
the readers' options (``--group-by``), passed to the reading instead of set for the
whole process.

``ReadContext.read(items)`` runs each step of a reading generator inside a
``contextvars.Context`` of its own that holds the context's limits, so the limits deep in
``canonical_io``, ``intake`` and the readers are those of the reading that asked, even
when two readings with different limits run at once: on two threads (a thread starts
with an empty context) or as two generators consumed in turns in one thread (each step
re-enters its own context). ``active()`` does the same for plain calls (planning, the
build's range feeder). Nothing is left set afterwards.

``check_readers`` makes a reader option that no reader of the inputs takes an error (one
line naming the readers that take it) instead of an option silently ignored.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pipeline.common.errors import SeamError
from pipeline.sources import limits as limits_module
from pipeline.sources.limits import Limits

T = TypeVar("T")

# The command-line flag of each reader option (its one-line errors name the flag).
OPTION_FLAGS = {"group_by": "--group-by"}


class ReaderOptionError(SeamError, ValueError):
    """A reader option that none of the inputs' readers takes: one actionable line."""


@dataclass(frozen=True)
class ReadContext:
    """Limits and reader options of one reading (a build, an ingest, a judge run...)."""

    limits: Limits = field(default_factory=Limits)
    # Options for the raw-format readers, by ``Reader.options`` name; None values are unset.
    reader_options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, limits: Limits | None = None, group_by: str | None = None) -> ReadContext:
        return cls(limits or Limits(), {"group_by": group_by} if group_by else {})

    @contextmanager
    def active(self) -> Iterator[None]:
        """This context's limits in force for the calls inside the ``with`` block."""
        with limits_module.in_force(self.limits):
            yield

    def read(self, items: Iterable[T]) -> Iterator[T]:
        """``items`` (typically a generator), each step of it run under this context's
        limits in a ``contextvars.Context`` of its own, whoever consumes it and whatever
        else the consumer reads in between."""
        own = contextvars.copy_context()
        own.run(limits_module.set_in_this_context, self.limits)
        iterator = own.run(iter, items)
        while True:
            try:
                item = own.run(next, iterator)
            except StopIteration:
                return
            yield item

    def set_options(self) -> dict[str, Any]:
        """The reader options that are set (None means unset)."""
        return {k: v for k, v in self.reader_options.items() if v is not None}

    def check_readers(self, formats: Iterable[str]) -> None:
        """Refuse a reader option that none of ``formats`` (the readers the inputs were
        planned for; ``canonical`` and unrecognised files take no option) takes."""
        from pipeline.readers import REGISTRY

        used = sorted(set(formats))
        for option in self.set_options():
            if any(option in getattr(REGISTRY.get(f), "options", {}) for f in used):
                continue
            takers = sorted(name for name, r in REGISTRY.items() if option in r.options)
            flag = OPTION_FLAGS.get(option, option)
            raise ReaderOptionError(
                f"{flag} applies only to {', '.join(takers) or 'no'} input; these inputs are "
                f"read as {', '.join(used) or 'nothing'}: drop {flag}"
            )
