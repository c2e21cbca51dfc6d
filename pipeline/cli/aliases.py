"""Deprecated flag names (issue 24, item 10): a renamed flag keeps its old name for one
release. The old name is hidden from ``--help``, does what the new one does, and says
once per process, on stderr, which name to use instead."""

from __future__ import annotations

import argparse
import sys
from typing import Any

_WARNED: set[str] = set()


class _Deprecated(argparse.Action):
    def __init__(self, option_strings, dest, instead: str, **kwargs: Any) -> None:
        self.instead = instead
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if option_string not in _WARNED:
            _WARNED.add(str(option_string))
            print(
                f"seam: {option_string} is deprecated and will be removed in the next "
                f"release; use {self.instead}",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def deprecated_alias(parser, old: str, instead: str, dest: str, **kwargs: Any) -> None:
    """``old`` as a hidden alias that stores into ``dest`` (what the new flag sets);
    ``instead`` is what the warning tells the user to write. ``const=...`` makes it a
    switch (like ``--no-std`` for ``--std none``)."""
    if "const" in kwargs:
        kwargs.setdefault("nargs", 0)
    parser.add_argument(
        old, action=_Deprecated, instead=instead, dest=dest, help=argparse.SUPPRESS, **kwargs
    )
