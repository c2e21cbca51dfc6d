"""``MessageEvent``'s role check (``schemas/rollout.py``) against a plain reference: the
same messages accepted, and a refused one refused with the same reason (the reason a
record is quarantined with), whichever fields a message of any role sets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.rollout import MessageEvent

ASSISTANT_ONLY = ["reasoning", "kind", "finish_reason", "prompt_ids", "output_ids", "logprobs"]
VALUES = {
    "reasoning": st.just("thinking"),
    "kind": st.sampled_from(["action", "summary"]),
    "finish_reason": st.sampled_from(["stop", "length"]),
    "prompt_ids": st.lists(st.integers(0, 9), max_size=2),
    "output_ids": st.lists(st.integers(0, 9), max_size=2),
    "logprobs": st.lists(st.just(-0.5), max_size=2),
}


def reference_reason(m: dict) -> str | None:
    """The rules, one after the other, as the docstring of the schema states them."""
    role, call_id = m["role"], m.get("tool_call_id")
    if role != "assistant":
        for name in ASSISTANT_ONLY:
            if m.get(name) is not None:
                return f"message m: field '{name}' is only allowed on assistant messages"
        if m.get("tool_calls"):
            return "message m: only assistant messages carry tool_calls"
    if role == "tool" and not call_id:
        return "message m: a tool message needs tool_call_id"
    if role != "tool" and call_id is not None:
        return "message m: tool_call_id is only allowed on tool messages"
    logprobs, output_ids = m.get("logprobs"), m.get("output_ids")
    if logprobs is not None:
        if output_ids is None:
            return "message m: logprobs need output_ids"
        if len(logprobs) != len(output_ids):
            return f"message m: {len(logprobs)} logprobs for {len(output_ids)} output ids"
    if m.get("prompt_ids") is not None and output_ids is None:
        return "message m: prompt_ids without output_ids"
    if output_ids is not None and len(output_ids) == 0:
        return "message m: output_ids is empty"
    return None


@st.composite
def messages(draw) -> dict:
    m = {"id": "m", "role": draw(st.sampled_from(["system", "user", "assistant", "tool"]))}
    for name in draw(st.lists(st.sampled_from(ASSISTANT_ONLY), unique=True, max_size=3)):
        m[name] = draw(VALUES[name])
    if draw(st.booleans()):
        m["tool_call_id"] = draw(st.sampled_from(["", "c1"]))
    if draw(st.booleans()):
        m["tool_calls"] = [{"id": "c1", "name": "bash", "arguments": "{}"}]
    return m


@settings(max_examples=400, deadline=None)
@given(messages())
def test_every_role_is_accepted_or_refused_with_the_reference_reason(m):
    want = reference_reason(m)
    if want is None:
        MessageEvent.model_validate(m)
        return
    with pytest.raises(ValidationError) as refused:
        MessageEvent.model_validate(m)
    assert refused.value.errors()[0]["msg"].removeprefix("Value error, ") == want
