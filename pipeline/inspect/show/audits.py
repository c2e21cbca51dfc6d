"""What ``seam show`` prints under a summary call: the findings of a registered audit.

The summary audit is the judge library's (``judge/audit.py``), a layer the inspect
commands do not import: the command line and ``import seam`` plug it in here by import
string (``register_call_audit``), as they plug a judge into the gateway, and ``seam show``
asks the registry. Light on purpose: registering imports nothing.

An audit is a callable ``audit(rollout) -> iterable of (call index, findings)``: the call
(as the rollout numbers its calls; None for findings about no call) and a dict of what was found (the summary audit's
``SUMMARY_AUDIT`` struct: ``words``, ``omitted``, ``invented_paths``...). A rollout's
audit is best effort: with nothing registered a view shows no findings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from pipeline.common.registry import resolve

if TYPE_CHECKING:
    from schemas.rollout import Rollout

CallAudit = Callable[["Rollout"], Iterable[tuple[int | None, dict]]]
_AUDITS: dict[str, CallAudit | str] = {}


def register_call_audit(name: str, audit: CallAudit | str) -> None:
    """Register ``audit`` (a callable or its ``"package.module:function"`` import string,
    imported on first use) under ``name``; registering a name again replaces it."""
    _AUDITS[name] = audit


def _resolve(name: str) -> CallAudit:
    found = _AUDITS[name]
    if isinstance(found, str):
        found = resolve(found)
        _AUDITS[name] = found
    return found


def call_findings(rollout: Rollout) -> Iterator[tuple[int | None, dict]]:
    """``(call index, findings)`` of every registered audit, in registration order."""
    for name in list(_AUDITS):
        yield from _resolve(name)(rollout)
