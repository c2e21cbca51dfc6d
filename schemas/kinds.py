"""The closed vocabularies of seam's records: why a context was rewritten, what kind of
seam opens a segment, what kind of call a policy output is (docs/design.md, "Seams and
segments"). Literal types, so a type checker rejects a misspelt kind where it is
written, and tuples of their values for code and tests that enumerate them."""

from __future__ import annotations

from typing import Literal, get_args

# The reason a rewrite event gives for replacing the live context.
RewriteReason = Literal["compaction", "edit", "truncation"]

# The seam that opens a segment: ``none`` for a rollout's first segment, a rewrite's
# reason, or — without a rewrite — ``template`` (the chat template re-rendered history)
# or ``divergence`` (the engine's logged input ids stop extending the segment).
SeamKind = Literal["none", "compaction", "edit", "truncation", "template", "divergence"]

# What a policy call produced: a step of the task or a compaction summary.
CallKind = Literal["action", "summary"]

SEAM_KINDS: tuple[SeamKind, ...] = get_args(SeamKind)
