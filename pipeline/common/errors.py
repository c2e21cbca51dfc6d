"""The errors that end a command with one actionable line (docs/design.md, "Errors").

Every error whose message is written for the user derives from ``SeamError``; ``seam``'s
``main`` (``pipeline/cli/__init__.py``) catches it once and prints ``seam COMMAND: error: MESSAGE``
with ``exit_code`` (2), so a command module lets them through instead of translating each
one. Errors that are control flow inside seam (a rejected rollout, a missing delta base)
are not ``SeamError``: if one ever escaped, its traceback would be the useful report.

They live here, below every other module, so that a command module, a reader or the
input planner can raise them without importing the command line or each other.
"""

from __future__ import annotations


class SeamError(Exception):
    """An error whose message is one line for the user; ``seam`` exits ``exit_code``."""

    exit_code = 2


class UsageError(SeamError):
    """Bad configuration or arguments: ``seam`` prints the message as one line, exit code 2."""


class InputError(SeamError, ValueError):
    """A missing or unreadable input: one actionable line."""
