"""Judge correction records (docs/design.md, "Judge corrections"; AutoCompact's online Judge).

A correction names one call of one rollout, says what kind of mistake the judge saw
(``trigger``: when to compact; ``state``: what the working-state summary keeps;
``continuation``: what the agent does right after compaction), and records both the
original proposal and the executed replacement. The executed replacement is what the
rollout contains at that call, so it is what SFT trains; the original proposal is only
kept for audits and preference pairs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # schemas.rollout imports this module
    from schemas.rollout import MessageEvent

CorrectionType = Literal["trigger", "state", "continuation"]
Verdict = Literal[
    "too_early",
    "too_late",
    "missing_trigger",
    "omission",
    "invented",
    "contradiction",
    "missing_next_step",
    "drift",
    "redo",
    "ignored_next_step",
    "wrong_state",
]


class Evidence(BaseModel):
    """A quoted span of the history that supports the verdict."""

    model_config = ConfigDict(extra="forbid")
    message_id: str
    quote: str


class OmittedItem(BaseModel):
    """A piece of working state the summary should have kept."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal[
        "file_path", "error_message", "failing_command", "test_name", "constraint", "next_step"
    ]
    value: str


class Correction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    call_index: int = Field(
        ge=0, description="Index of the corrected call among the rollout's assistant calls."
    )
    type: CorrectionType
    verdict: Verdict
    original: str = Field(
        description="The policy's original proposal at this call (rendered assistant text)."
    )
    replacement: str = Field(
        description="The executed replacement; must equal the rollout's output at this call."
    )
    rationale: str = ""
    evidence: list[Evidence] = Field(default_factory=list)
    omitted: list[OmittedItem] = Field(default_factory=list)
    judge_model: str = "unknown"
    prompt_hash: str | None = None


class Finding(BaseModel):
    """A judge's verdict on an executed call, before any correction was executed.

    The rule judge and the LLM judge read finished rollouts: they can say that call k
    erred and, for the LLM judge, propose what it should have been, but the proposal was
    never executed, so it cannot be trained as if it had been. A ``Finding`` becomes a
    ``Correction`` only when a collector executes the proposal and records the result.
    """

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    call_index: int = Field(ge=0)
    type: CorrectionType
    verdict: Verdict
    rationale: str = ""
    evidence: list[Evidence] = Field(default_factory=list)
    omitted: list[OmittedItem] = Field(default_factory=list)
    proposal: str | None = Field(
        None, description="What the judge proposes instead (not executed)."
    )
    judge_model: str = "unknown"
    prompt_hash: str | None = None


def executed_output_text(call: MessageEvent) -> str:
    """The text a call produced, as a ChatML-with-tools template shows it: the content,
    then each tool call as ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>``
    (a newline before each call that follows content or another call). ``ARGS`` is the
    argument text exactly as the model wrote it. Reasoning is not part of it: a
    correction replaces what the call did, and templates disagree on how to show thoughts.

    This one function defines "the executed output" — a correction's ``replacement``
    and ``original`` are texts of this form — for attaching corrections
    (``pipeline/sft/attach.py``), for preference pairs, and for anyone who writes correction
    records (the simulator, the gateway's live judge).
    """
    parts = [call.content]
    for i, tc in enumerate(call.tool_calls):
        sep = "\n" if call.content or i else ""
        parts.append(
            f'{sep}<tool_call>\n{{"name": "{tc.name}", "arguments": {tc.arguments}}}\n</tool_call>'
        )
    return "".join(parts)
