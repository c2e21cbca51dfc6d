"""Replaying a rollout's events: the live context each policy call was sampled from.

A rollout stores events, not one context per call (docs/design.md, "The canonical
rollout"). ``replay`` applies them in order — a message appends to the live context, a
rewrite replaces it — and returns one ``CallView`` per assistant message: the message,
its context (a ``CallContext`` view, not a copy) and the first rewrite since the
previous call. The segmenter, the judge, verification and ``seam show`` all read
rollouts through it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from schemas.rollout import MessageEvent, RewriteEvent, Rollout

__all__ = ["CallContext", "CallView", "replay"]


class CallContext(Sequence[MessageEvent]):
    """The first ``n`` messages of a replay's live list: a call's context, not a copy.

    Between two rewrites the live list only grows, so every call's context is a prefix
    of it; copying it at each call would cost O(calls²) time and memory in one segment
    (10 k calls: 10⁸ references). A view costs O(1), and two views of one list whose
    lengths are ordered are prefixes of each other without comparing a message
    (``extends``). Reads like a tuple: ``len``, indexing, iteration; slices and ``+``
    give tuples.
    """

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[MessageEvent], n: int):
        self._items, self._n = items, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if type(i) is int and 0 <= i < self._n:  # the common case, checked first
            return self._items[i]
        if isinstance(i, slice):
            return tuple(self._items[slice(*i.indices(self._n))])
        if not -self._n <= i < self._n:
            raise IndexError("context index out of range")
        return self._items[i % self._n]

    def __iter__(self) -> Iterator[MessageEvent]:
        return itertools.islice(self._items, self._n)

    def __add__(self, other) -> tuple:
        return (*self, *other)

    def __radd__(self, other) -> tuple:
        return (*other, *self)

    def __eq__(self, other) -> bool:
        if isinstance(other, (CallContext, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"CallContext({len(self)} messages)"

    def extends(self, other: CallContext) -> bool:
        """Whether ``other`` is a prefix of this context, decided in O(1) when both are
        views of one live list and in O(len(other)) message ids otherwise."""
        if len(self) < len(other):
            return False
        if self._items is other._items:
            return True
        return all(a.id == b.id for a, b in zip(self, other))


@dataclass(frozen=True)
class CallView:
    """One policy call: the assistant message and the live context it was sampled from."""

    index: int
    message: MessageEvent
    context: CallContext
    rewrite: RewriteEvent | None  # the first rewrite since the previous call, if any


def replay(rollout: Rollout) -> list[CallView]:
    """Replay the events: the live context at each call."""
    live: list[MessageEvent] = []
    by_id: dict[str, MessageEvent] = {}
    calls: list[CallView] = []
    pending: RewriteEvent | None = None
    for event in rollout.events:
        if isinstance(event, RewriteEvent):
            new = []
            for item in event.context:
                if isinstance(item, MessageEvent):
                    by_id[item.id] = item
                    new.append(item)
                else:
                    new.append(by_id[item.id])
            live = new
            pending = pending or event
            continue
        if event.role == "assistant":
            calls.append(CallView(len(calls), event, CallContext(live, len(live)), pending))
            pending = None
        by_id[event.id] = event
        live.append(event)
    return calls
