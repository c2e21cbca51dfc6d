"""The errors that end a command with one actionable line (docs/design.md, "Errors").

They live here, below every other module, so that a command module, a reader or the
input planner can raise them without importing the command line or each other.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad configuration or arguments: ``seam`` prints the message as one line, exit code 2."""


class InputError(ValueError):
    """A missing or unreadable input: one actionable line."""
