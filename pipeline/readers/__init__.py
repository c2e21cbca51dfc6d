"""Readers: raw rollout files of one format → canonical rollouts.

Each format is one small module in this package with one job. A module defines a
subclass of ``Reader`` and registers an instance with ``@register``. The build
(``pipeline/build/run.py``) and ``seam ingest`` only talk to this interface:

- ``sniff(path, head)`` says from the file's first bytes (and name) whether this
  reader understands it: ``--format auto`` asks every reader;
- ``session_key(path, head)`` (optional) names the session a file belongs to: the build
  reads the files of one session together with ``read_files(paths)``, whose items name
  their ``file``;
- ``read(path)`` yields, in file order, ``Accepted`` rollouts, ``Rejected`` records (go
  to quarantine with file, line and reason) and ``Skipped`` records (not model calls,
  e.g. a Claude Code title record: counted by reason, not quarantined).

For every file: records read = accepted + rejected (+ skipped, reported separately).
``records`` on ``Accepted``/``Rejected`` says how many raw records (lines of a JSONL
file, steps or events of a JSON file) the item stands for, so ``seam ingest`` can check
that every line of a file ended somewhere.

Readers that take options (e.g. which field groups chat-completions calls into
rollouts) expose them through ``configure``, which returns a configured copy.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from schemas.rollout import Rollout


@dataclass(frozen=True)
class Accepted:
    rollout: Rollout
    line: int | None = None
    records: int = 1
    file: str | None = None  # set when a reader read several files (one session's)


@dataclass(frozen=True)
class Rejected:
    line: int | None
    reason: str
    raw: str | None = None
    records: int = 1
    file: str | None = None


@dataclass(frozen=True)
class Skipped:
    line: int | None
    reason: str
    file: str | None = None


ReadItem = Union[Accepted, Rejected, Skipped]  # noqa: UP007 (a runtime alias; | needs 3.10 objects)


class Reader:
    name: str = ""
    description: str = ""
    options: dict[str, Any] = {}
    # Whether this format's logs can carry an outcome (a reward or a resolved flag). An RL
    # build of inputs whose readers all say no, without --rewards, is refused up front.
    records_outcomes: bool = True

    def sniff(self, path: Path, head: bytes) -> bool:
        raise NotImplementedError

    def read(self, path: Path) -> Iterator[ReadItem]:
        raise NotImplementedError

    def session_key(self, path: Path, head: bytes) -> str | None:
        """For formats whose sessions can be spread over several files: the session the
        file belongs to (files with one key are read together by ``read_files``); None
        reads the file alone."""
        return None

    def read_files(self, paths: list[Path]) -> Iterator[ReadItem]:
        """The files of one session read together; by default one after the other."""
        for path in paths:
            for item in self.read(path):
                yield item if len(paths) == 1 else dataclasses.replace(item, file=str(path))

    def configure(self, **options: Any) -> Reader:
        """A copy of this reader with ``options`` set (unknown option names are ignored,
        so one option set can be passed to whichever reader a file needs)."""
        known = {k: v for k, v in options.items() if k in self.options and v is not None}
        if not known:
            return self
        configured = copy.copy(self)
        configured.options = {**self.options, **known}
        return configured


REGISTRY: dict[str, Reader] = {}


def register(reader_cls: type[Reader]) -> type[Reader]:
    """Add a reader under its ``name``; a second reader with a taken name is a bug."""
    taken = REGISTRY.get(reader_cls.name)
    if taken is not None and type(taken) is not reader_cls:
        raise ValueError(
            f"reader name {reader_cls.name!r} is taken by {type(taken).__qualname__}: "
            f"{reader_cls.__qualname__} needs another name"
        )
    REGISTRY[reader_cls.name] = reader_cls()
    return reader_cls


# Importing the format modules registers their readers.
from pipeline.readers import (  # noqa: E402,F401
    atif,
    claude_code,
    codex,
    gemini_cli,
    harbor_traces,
    mini_swe_agent,
    openai_messages,
    openhands,
    swe_agent,
    token_dumps,
)
