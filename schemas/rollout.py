"""The canonical, event-sourced rollout (docs/design.md, "The canonical rollout").

A rollout is a list of events replayed in order against a *live context*:

- ``MessageEvent`` appends one message. An assistant message is a **call** of the
  policy; its input is the live context at that moment.
- ``RewriteEvent`` replaces the live context (compaction, edit, truncation). The new
  context is a list of items, each either ``Keep`` (an earlier message, by id) or a
  new ``MessageEvent``; deleting is leaving an id out.

Storing events instead of a full context per call keeps a rollout O(n).

Invariants enforced by ``Rollout``'s validator (the reason a record is quarantined
names the one that failed):

- message ids are unique within the rollout;
- a ``Keep`` names a message that was seen before the rewrite;
- every tool call has exactly one tool result after it (a call in the rollout's very
  last assistant message may stay unanswered: the rollout ended there, e.g. ``submit``);
- every tool result answers a tool call made before it (a tool message inside a
  rewrite may also replace the result of an answered call: microcompaction clears
  old tool outputs in place).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.correction import Correction
from schemas.kinds import CallKind, RewriteReason

SCHEMA_VERSION: Literal["1.0"] = "1.0"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCall(_Strict):
    """One function call inside an assistant message."""

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = Field(
        description="The arguments exactly as the model wrote them (a JSON string; "
        "kept as text so a malformed call is still the truth about what was generated)."
    )


# The fields only an assistant message may set, in the order a reason names the first.
ASSISTANT_ONLY = ("reasoning", "kind", "finish_reason", "prompt_ids", "output_ids", "logprobs")


class MessageEvent(_Strict):
    """A message appended to the live context."""

    type: Literal["message"] = "message"
    id: str = Field(min_length=1)
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = Field(
        None, description="Assistant reasoning text, when the model produced any."
    )
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = Field(
        None, description="For role=tool: the call this result answers."
    )
    name: str | None = Field(None, description="For role=tool: the tool's name.")
    kind: CallKind | None = Field(
        None,
        description="For role=assistant: an action step or a compaction summary. Defaults to action.",
    )
    finish_reason: Literal["stop", "tool_calls", "length"] | None = Field(
        None,
        description="For role=assistant: why generation stopped; 'length' marks a truncated output.",
    )
    prompt_ids: list[int] | None = Field(
        None, description="Token ids of the call's input, as the engine logged them."
    )
    output_ids: list[int] | None = Field(
        None, description="Token ids the policy sampled, end-of-turn token included."
    )
    logprobs: list[float] | None = Field(
        None, description="Sampling log-probabilities, one per output id."
    )
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _role_fields_fit(self) -> MessageEvent:
        if self.role != "assistant":
            # One test for the usual case (none set), then the first one set is named:
            # this validator runs for every message of every rollout read.
            if not (
                self.reasoning is None
                and self.kind is None
                and self.finish_reason is None
                and self.prompt_ids is None
                and self.output_ids is None
                and self.logprobs is None
            ):
                name = next(n for n in ASSISTANT_ONLY if getattr(self, n) is not None)
                raise ValueError(
                    f"message {self.id}: field '{name}' is only allowed on assistant messages"
                )
            if self.tool_calls:
                raise ValueError(f"message {self.id}: only assistant messages carry tool_calls")
            if self.role == "tool":
                if not self.tool_call_id:
                    raise ValueError(f"message {self.id}: a tool message needs tool_call_id")
            elif self.tool_call_id is not None:
                raise ValueError(
                    f"message {self.id}: tool_call_id is only allowed on tool messages"
                )
            return self  # the checks below are of fields only an assistant message has
        if self.tool_call_id is not None:
            raise ValueError(f"message {self.id}: tool_call_id is only allowed on tool messages")
        if self.logprobs is not None:
            if self.output_ids is None:
                raise ValueError(f"message {self.id}: logprobs need output_ids")
            if len(self.logprobs) != len(self.output_ids):
                raise ValueError(
                    f"message {self.id}: {len(self.logprobs)} logprobs for {len(self.output_ids)} output ids"
                )
        if self.prompt_ids is not None and self.output_ids is None:
            raise ValueError(f"message {self.id}: prompt_ids without output_ids")
        if self.output_ids is not None and len(self.output_ids) == 0:
            raise ValueError(f"message {self.id}: output_ids is empty")
        return self

    @property
    def call_kind(self) -> CallKind:
        return self.kind or "action"


class Keep(_Strict):
    """Keep an earlier message (by id) in the rewritten context."""

    type: Literal["keep"] = "keep"
    id: str = Field(min_length=1)


ContextItem = Annotated[Keep | MessageEvent, Field(discriminator="type")]


class RewriteEvent(_Strict):
    """The live context is replaced by ``context``: a compaction, an edit or a truncation."""

    type: Literal["rewrite"] = "rewrite"
    id: str = Field(min_length=1)
    reason: RewriteReason
    trigger: Literal["budget", "model", "manual"]
    context: list[ContextItem]
    meta: dict[str, Any] = Field(default_factory=dict)


Event = Annotated[MessageEvent | RewriteEvent, Field(discriminator="type")]


class Rollout(_Strict):
    """One episode of one agent on one task."""

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    rollout_id: str = Field(min_length=1)
    task_id: str = Field(
        min_length=1, description="Group key: rollouts of one task form one GRPO group."
    )
    source: str = Field(
        min_length=1, description="Where the rollout came from (reader or simulator name)."
    )
    model: str | None = None
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="Tool schemas shown to the model (OpenAI style)."
    )
    events: list[Event]
    reward: float | None = None
    resolved: bool | None = None
    parent_rollout_id: str | None = Field(
        None, description="For sub-agent rollouts: the rollout that spawned it."
    )
    meta: dict[str, Any] = Field(default_factory=dict)
    corrections: list[Correction] = Field(default_factory=list)

    @model_validator(mode="after")
    def _events_replay(self) -> Rollout:
        seen: set[str] = set()
        open_calls: dict[str, str] = {}
        answered: set[str] = set()
        last_call_msg = None
        for event in self.events:
            if isinstance(event, RewriteEvent):
                if event.id in seen:
                    raise ValueError(f"duplicate event id {event.id!r}")
                for item in event.context:
                    if isinstance(item, Keep) and item.id not in seen:
                        raise ValueError(f"rewrite {event.id!r} keeps unknown message {item.id!r}")
                seen.add(event.id)
                for item in event.context:
                    if isinstance(item, MessageEvent):
                        self._check_message(item, seen, open_calls, answered, in_rewrite=True)
                continue
            self._check_message(event, seen, open_calls, answered)
            if event.role == "assistant":
                last_call_msg = event
        if not any(isinstance(e, MessageEvent) and e.role == "assistant" for e in self.events):
            raise ValueError("rollout has no assistant call")
        final_calls = (
            {c.id for c in last_call_msg.tool_calls} if last_call_msg is not None else set()
        )
        unanswered = sorted(set(open_calls) - final_calls)
        if unanswered:
            raise ValueError(f"tool call(s) without a result: {', '.join(unanswered[:5])}")
        return self

    @staticmethod
    def _check_message(
        msg: MessageEvent, seen: set, open_calls: dict, answered: set, in_rewrite: bool = False
    ) -> None:
        if msg.id in seen:
            raise ValueError(f"duplicate message id {msg.id!r}")
        seen.add(msg.id)
        if in_rewrite and msg.role == "tool" and msg.tool_call_id in answered:
            return  # a rewrite replaces an earlier result in place (e.g. a cleared tool output)
        for call in msg.tool_calls:
            if call.id in open_calls or call.id in answered:
                raise ValueError(f"duplicate tool call id {call.id!r}")
            open_calls[call.id] = msg.id
        if msg.role == "tool":
            if msg.tool_call_id in answered:
                raise ValueError(f"tool call {msg.tool_call_id!r} has more than one result")
            if msg.tool_call_id not in open_calls:
                raise ValueError(
                    f"tool result {msg.id!r} answers unknown tool call {msg.tool_call_id!r}"
                )
            answered.add(msg.tool_call_id)
            del open_calls[msg.tool_call_id]

    def calls(self) -> list[MessageEvent]:
        """The assistant messages in call order (call index = position in this list)."""
        return [e for e in self.events if isinstance(e, MessageEvent) and e.role == "assistant"]


def rollout_json_schema() -> dict[str, Any]:
    """The JSON Schema of one canonical rollout record (``seam schema``)."""
    schema = Rollout.model_json_schema()
    schema["$id"] = f"https://seam.dev/schema/rollout-{SCHEMA_VERSION}.json"
    schema["title"] = "seam canonical rollout"
    return schema
