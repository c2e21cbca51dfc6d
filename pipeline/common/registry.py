"""What seam's registries share (engines, export targets, build stages, show's audits):
an entry named by import string (``"package.module:attr"``, imported only when used, so a
command line lists the entries without importing them), and one name per entry."""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

T = TypeVar("T")


def resolve(spec: str) -> Any:
    """The object a ``"package.module:attr"`` import string names (its module imported)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def add_named(table: dict[str, T], name: str, entry: T, what: str) -> T:
    """Add ``entry`` to ``table`` under ``name``; a second entry under a taken name is a
    bug (``what`` names the kind of entry in the error), the same entry again is not."""
    if name in table and table[name] is not entry:
        raise ValueError(f"{what} name {name!r} is taken")
    table[name] = entry
    return entry
