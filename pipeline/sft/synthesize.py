"""Synthesized summary calls for harness logs (``build-sft --synthesize-summary-calls``).

Claude Code's session file does not log the call that wrote a compaction summary: the
summary arrives as a user message after the boundary, with loss 0, so summary writing is
never trained from it (``--mask-summaries`` has nothing to mask). The call is in a
sub-agent file (``agent-acompact-*.jsonl``); given with the session, the reader joins it
as the real summary call, and then none is synthesized (``summary_call`` is set). A synthesized call restores the
missing step: its context is the live context at the boundary plus a summary prompt
(``prompts/summary_call.txt`` by default, or ``PROMPT_FILE``; the user's custom
instructions — the text after ``/compact``, from a ``seam hooks`` capture or the
command's echo — appended), and its output is the summary body without the harness's
wrapper (``summary.summary_body``).

This is distillation from the harness's summarizer, not on-policy data, and it is only
honest where the context at the boundary is exactly what the summarizer saw: so only
for compactions whose history is complete (``Compaction.history_complete``: never for a
slice, a file with lost records, or after an opaque summary), never for an opaque
summary, never where a summary call exists. The rewrite after it is unchanged, so every
later call sees what it saw. The synthesized call carries ``meta.synthesized_call =
"synthesized_summary_call"``: the segment whose tokens hold it says so in
``context_fidelity`` (``pipeline/core/fidelity.py``), and the build counts
``synthesized_summary_calls`` in the manifest.
"""

from __future__ import annotations

import re
from pathlib import Path

from judge.history import compactions
from judge.summary import summary_body
from pipeline.core.fidelity import SYNTHESIZED_KEY
from schemas.replay import replay
from schemas.rollout import MessageEvent, RewriteEvent, Rollout

DEFAULT_PROMPT = Path(__file__).resolve().parent / "prompts" / "summary_call.txt"
REASON = "synthesized_summary_call"
_COMPACT_ARGS_RE = re.compile(
    r"<command-name>/compact</command-name>.*?<command-args>(.*?)</command-args>", re.S
)


def load_prompt(path: str | None) -> str:
    text = Path(path or DEFAULT_PROMPT).read_text().strip()
    if not text:
        raise ValueError(f"{path}: the summary prompt is empty")
    return text


def custom_instructions(rewrite: RewriteEvent, user_after: tuple[MessageEvent, ...]) -> str:
    """The user's instructions for this compaction: from a capture, else from the
    ``/compact`` command's echo after the summary."""
    captured = (rewrite.meta.get("capture") or {}).get("custom_instructions")
    if captured:
        return str(captured).strip()
    for msg in user_after:
        found = _COMPACT_ARGS_RE.search(msg.content)
        if found and found.group(1).strip():
            return found.group(1).strip()
    return ""


def synthesize_summary_calls(rollout: Rollout, prompt: str) -> tuple[Rollout, int]:
    """The rollout with a synthesized summary call before every compaction rewrite that
    inserted a readable summary after a complete history; the count. Corrections move
    with the calls they name."""
    comps = [
        c
        for c in compactions(rollout, replay(rollout))
        if c.summary_call is None and not c.opaque and c.history_complete
    ]
    if not comps:
        return rollout, 0
    by_summary = {c.message_id: c for c in comps}
    events: list = []
    added = 0
    inserted_before: list[int] = []  # call index (original) before which a call was added
    calls_seen = 0
    for event in rollout.events:
        if isinstance(event, RewriteEvent):
            comp = next(
                (
                    by_summary[m.id]
                    for m in event.context
                    if isinstance(m, MessageEvent) and m.id in by_summary
                ),
                None,
            )
            if comp is not None:
                events += _synthesized(event, comp, prompt)
                inserted_before.append(calls_seen)
                added += 1
        elif event.role == "assistant":
            calls_seen += 1
        events.append(event)
    corrections = [
        c.model_copy(
            update={
                "call_index": c.call_index + sum(1 for k in inserted_before if k <= c.call_index)
            }
        )
        for c in rollout.corrections
    ]
    return rollout.model_copy(update={"events": events, "corrections": corrections}), added


def _synthesized(rewrite: RewriteEvent, comp, prompt: str) -> list[MessageEvent]:
    extra = custom_instructions(rewrite, comp.user_after)
    text = prompt + (f"\n\nAdditional instructions from the user:\n{extra}" if extra else "")
    return [
        MessageEvent(
            id=f"{rewrite.id}:summary-prompt",
            role="user",
            content=text,
            meta={SYNTHESIZED_KEY: REASON},
        ),
        MessageEvent(
            id=f"{rewrite.id}:summary-call",
            role="assistant",
            kind="summary",
            content=_target(rewrite, comp.summary),
            finish_reason="stop",
            meta={SYNTHESIZED_KEY: REASON, "summary_of": comp.message_id},
        ),
    ]


def _target(rewrite: RewriteEvent, summary: str) -> str:
    """What the summarizer wrote: PostCompact's ``compact_summary`` when a ``seam hooks``
    capture recorded it (the model's exact output), else the inserted summary without
    the harness's wrapper (Claude Code reformats the model's ``<summary>`` into it)."""
    captured = (rewrite.meta.get("capture") or {}).get("compact_summary")
    return str(captured) if captured else summary_body(summary).strip()
