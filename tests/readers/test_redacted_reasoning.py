"""Reasoning the log holds only as a signature or an encrypted blob (issue 22, item 3):
Claude Code's signature-only ``thinking`` and ``redacted_thinking`` blocks and Codex's
``reasoning`` items without text are one rule. The call keeps its visible text and tool
calls (trained), says how many reasoning blocks it lost (``meta.redacted_reasoning``),
and every segment that trains it or sees it says ``redacted_reasoning``."""

import os
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.fidelity import segment_fidelity
from pipeline.core.rows import RowOptions, masked_segments
from pipeline.core.segment import Segmenter
from tests.readers.util import fixture, only

FLAG = "redacted_reasoning"
NOT_LOGGED = ["missing_system_prompt", "missing_tool_schemas"]


def _rows(renderer, rollout):
    masked, _ = masked_segments(rollout, Segmenter(renderer), RowOptions(require_outcome=False))
    return masked, segment_fidelity(rollout, [m.segment for m in masked])


def _trained_text(renderer, masked, call_index: int) -> str:
    for m in masked:
        for span in m.segment.spans:
            if span.call_index == call_index:
                window = slice(span.start, span.start + span.length)
                ids = m.segment.tokens[window][m.loss_mask[window] == 1]
                assert m.loss_mask[window].all()  # the whole span is trained, nothing else
                return renderer.decode(ids)
    raise AssertionError(f"call {call_index} is in no segment")


def test_claude_signature_only_and_redacted_thinking_are_counted_and_text_is_kept():
    rollout = only("claude-code", fixture("claude_code", "signature_only_thinking.jsonl"))
    calls = {c.id: c for c in rollout.calls()}
    assert calls["msg_T1"].reasoning is None  # the empty text is not passed off as a thought
    assert calls["msg_T1"].meta[FLAG] == 1
    assert calls["msg_T1"].content == "Renaming it now."
    assert [t.name for t in calls["msg_T1"].tool_calls] == ["Edit"]
    assert calls["msg_T2"].reasoning == "The edit applied; nothing else calls parse()."
    assert FLAG not in calls["msg_T2"].meta
    assert calls["msg_T3"].meta[FLAG] == 1  # redacted_thinking: encrypted, no text
    assert "unsupported_blocks" not in calls["msg_T3"].meta


def test_hand_checked_mask_of_a_signature_only_call_is_its_visible_text_and_tool_call(renderer):
    """The trained tokens of msg_T1 are exactly its text and tool call (no reasoning
    block: the template renders none), of msg_T2 its logged thinking too; the segment
    says the output of msg_T1 is not the whole response."""
    rollout = only("claude-code", fixture("claude_code", "signature_only_thinking.jsonl"))
    masked, fidelity = _rows(renderer, rollout)
    assert _trained_text(renderer, masked, 0) == (
        "Renaming it now.\n<tool_call>\n"
        '{"name": "Edit", "arguments": {"file_path": "cfg.py", "old_string": "def parse(", '
        '"new_string": "def parse_config("}}\n</tool_call><|im_end|>'
    )
    assert _trained_text(renderer, masked, 1) == (
        "<think>\nThe edit applied; nothing else calls parse().\n</think>\n\n"
        "Done: parse() is now parse_config().<|im_end|>"
    )
    assert _trained_text(renderer, masked, 2) == "None: cfg.py was the only caller.<|im_end|>"
    assert all(all(m.trained) for m in masked)
    assert fidelity == [sorted([*NOT_LOGGED, FLAG])]


def test_codex_reasoning_without_text_is_the_same_rule_a_summary_is_the_reasoning(renderer):
    rollout = only("codex", fixture("codex", "encrypted_reasoning.jsonl"))
    first, second = rollout.calls()
    assert (first.reasoning, first.meta[FLAG], first.meta["encrypted_reasoning"]) == (None, 1, True)
    assert second.reasoning == "**Line endings differ**" and FLAG not in second.meta
    masked, fidelity = _rows(renderer, rollout)
    assert _trained_text(renderer, masked, 0) == (
        '<tool_call>\n{"name": "shell", "arguments": {"command": ["pytest", "-q", '
        '"test_io.py"]}}\n</tool_call><|im_end|>'
    )
    assert fidelity == [["missing_tool_schemas", FLAG]]


REAL = os.environ.get("SEAM_REALWORLD_NEW_DIR")


@pytest.mark.skipif(not REAL, reason="SEAM_REALWORLD_NEW_DIR not set")
def test_the_real_signature_only_session_flags_its_calls_and_segments(renderer):
    path = Path(str(REAL)) / "claude_code" / "wakil_32340547b1ec32_0_full.jsonl"
    rollout = only("claude-code", path)
    redacted = [c for c in rollout.calls() if c.meta.get(FLAG)]
    assert len(redacted) == 40  # every signature-only response (counted from the raw file)
    assert all(c.reasoning is None for c in redacted)
    masked, fidelity = _rows(renderer, rollout)
    assert np.sum([m.num_trainable_tokens for m in masked]) > 0
    assert all(FLAG in f for f in fidelity)
