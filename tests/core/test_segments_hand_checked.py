"""Hand-checked segmentation: exact tokens and masks of small rollouts."""

from __future__ import annotations

import numpy as np

from pipeline.core.mask import MaskOptions, mask_segment
from pipeline.core.segment import Segmenter
from schemas.rollout import Rollout

IM_START, IM_END, NEWLINE = 151644, 151645, 198
SYSTEM, USER, ASSISTANT = 8948, 872, 77091

CALL_1 = (
    'Reading.\n<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call><|im_end|>'
)
SUMMARY = "Goal: fix a.py. Read it: x=1.<|im_end|>"
CALL_3 = "Done.<|im_end|>"


def three_call_rollout(**extra) -> Rollout:
    return Rollout.model_validate(
        {
            "rollout_id": "r1",
            "task_id": "t1",
            "source": "hand",
            "reward": 1.0,
            **extra,
            "events": [
                {"type": "message", "id": "s", "role": "system", "content": "You fix bugs."},
                {"type": "message", "id": "u", "role": "user", "content": "Fix a.py"},
                {
                    "type": "message",
                    "id": "a1",
                    "role": "assistant",
                    "content": "Reading.",
                    "tool_calls": [{"id": "c1", "name": "read", "arguments": '{"path": "a.py"}'}],
                },
                {
                    "type": "message",
                    "id": "t1",
                    "role": "tool",
                    "tool_call_id": "c1",
                    "content": "x=1",
                },
                {"type": "message", "id": "q", "role": "user", "content": "Summarize."},
                {
                    "type": "message",
                    "id": "a2",
                    "role": "assistant",
                    "kind": "summary",
                    "content": "Goal: fix a.py. Read it: x=1.",
                },
                {
                    "type": "rewrite",
                    "id": "rw",
                    "reason": "compaction",
                    "trigger": "budget",
                    "context": [
                        {"type": "keep", "id": "s"},
                        {
                            "type": "message",
                            "id": "res",
                            "role": "user",
                            "content": "Resume: Goal: fix a.py. Read it: x=1.",
                        },
                    ],
                },
                {"type": "message", "id": "a3", "role": "assistant", "content": "Done."},
            ],
        }
    )


def expected(renderer, pieces: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
    ids, mask = [], []
    for text, trained in pieces:
        piece = renderer.encode(text).tolist()
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


def test_compaction_splits_three_calls_into_two_segments_token_by_token(renderer):
    segments = Segmenter(renderer).segments(three_call_rollout())
    assert [s.seam_kind for s in segments] == ["none", "compaction"]
    assert [s.seam_trigger for s in segments] == [None, "budget"]

    ids0, mask0 = expected(
        renderer,
        [
            (
                "<|im_start|>system\nYou fix bugs.<|im_end|>\n<|im_start|>user\nFix a.py<|im_end|>\n<|im_start|>assistant\n",
                0,
            ),
            (CALL_1, 1),
            (
                "\n<|im_start|>user\n<tool_response>\nx=1\n</tool_response><|im_end|>\n"
                "<|im_start|>user\nSummarize.<|im_end|>\n<|im_start|>assistant\n",
                0,
            ),
            (SUMMARY, 1),
        ],
    )
    ids1, mask1 = expected(
        renderer,
        [
            (
                "<|im_start|>system\nYou fix bugs.<|im_end|>\n<|im_start|>user\nResume: Goal: fix a.py. Read it: x=1."
                "<|im_end|>\n<|im_start|>assistant\n",
                0,
            ),
            (CALL_3, 1),
        ],
    )
    for seg, ids, mask in ((segments[0], ids0, mask0), (segments[1], ids1, mask1)):
        masked = mask_segment(seg, MaskOptions(), renderer.eos_id, [False] * len(seg.spans))
        assert seg.tokens.tolist() == ids
        assert masked.loss_mask.tolist() == mask
    # The scaffolding is Qwen2.5's real special tokens at their real ids.
    assert ids0[:4] == [IM_START, SYSTEM, NEWLINE, ids0[3]]
    assert ids1[-1] == IM_END and mask1[-1] == 1
    assert ids0[ids0.index(ASSISTANT) - 1] == IM_START


def test_each_generated_output_is_trained_once_and_decodes_back(renderer):
    segments = Segmenter(renderer).segments(three_call_rollout())
    trained = []
    for seg in segments:
        for span in seg.spans:
            trained.append(renderer.decode(seg.tokens[span.start : span.start + span.length]))
    assert trained == [CALL_1, SUMMARY, CALL_3]


def test_summary_tokens_are_trained_only_in_the_segment_that_generated_them(renderer):
    segments = Segmenter(renderer).segments(three_call_rollout())
    summary_ids = renderer.encode("Goal: fix a.py. Read it: x=1.").tolist()
    first = mask_segment(segments[0], MaskOptions(), renderer.eos_id, [False, False])
    second = mask_segment(segments[1], MaskOptions(), renderer.eos_id, [False])
    start = segments[0].spans[1].start
    assert segments[0].tokens[start : start + len(summary_ids)].tolist() == summary_ids
    assert first.loss_mask[start : start + len(summary_ids)].all()
    # In the next segment the summary text is context: present, never trained.
    text1 = renderer.decode(segments[1].tokens)
    assert "Goal: fix a.py. Read it: x=1." in text1
    assert second.loss_mask.sum() == len(renderer.encode(CALL_3))


def test_mask_summaries_option_masks_only_summary_outputs(renderer):
    seg = Segmenter(renderer).segments(three_call_rollout())[0]
    masked = mask_segment(seg, MaskOptions(mask_summaries=True), renderer.eos_id, [False, False])
    assert masked.trained == [True, False]
    assert masked.loss_mask.sum() == len(renderer.encode(CALL_1))


def test_logged_token_ids_win_over_rendering(renderer):
    rollout = three_call_rollout()
    calls = rollout.calls()
    # Log a valid, non-canonical tokenization of call 3's output ("Do" + "ne." + eos).
    odd = renderer.encode("Do").tolist() + renderer.encode("ne.").tolist() + [IM_END]
    assert renderer.decode(odd) == CALL_3 and odd != renderer.encode(CALL_3).tolist()
    calls[2].output_ids = odd
    calls[2].logprobs = [-0.5] * len(odd)
    seg = Segmenter(renderer).segments(rollout)[1]
    masked = mask_segment(seg, MaskOptions(), renderer.eos_id, [True])
    span = seg.spans[0]
    assert seg.tokens[span.start :].tolist() == odd
    assert (
        np.allclose(masked.logprobs[span.start :], -0.5) and not masked.logprobs[: span.start].any()
    )


def _logged_pair(second_prompt: list[int]) -> Rollout:
    """Two calls with logged ids: [1,2,3] → [4,5], then ``second_prompt`` → [9]."""
    return Rollout.model_validate(
        {
            "rollout_id": "r",
            "task_id": "t",
            "source": "hand",
            "reward": 1.0,
            "events": [
                {"type": "message", "id": "u", "role": "user", "content": "go"},
                {
                    "type": "message",
                    "id": "a1",
                    "role": "assistant",
                    "content": "x",
                    "prompt_ids": [1, 2, 3],
                    "output_ids": [4, 5],
                },
                {"type": "message", "id": "u2", "role": "user", "content": "more"},
                {
                    "type": "message",
                    "id": "a2",
                    "role": "assistant",
                    "content": "y",
                    "prompt_ids": second_prompt,
                    "output_ids": [9],
                },
            ],
        }
    )


def test_logged_ids_that_stop_extending_without_a_rewrite_are_a_divergence_seam(renderer):
    """No rewrite and no rendering: the logged input of call 2 drops token 2, so the
    seam is a divergence (a template had no part in it), not a template seam."""
    extends = Segmenter(renderer).segments(_logged_pair([1, 2, 3, 4, 5, 7]))
    assert [s.seam_kind for s in extends] == ["none"]
    diverges = Segmenter(renderer).segments(_logged_pair([1, 3, 4, 5, 7]))
    assert [(s.seam_kind, s.seam_trigger) for s in diverges] == [
        ("none", None),
        ("divergence", None),
    ]
    assert diverges[1].tokens.tolist() == [1, 3, 4, 5, 7, 9]


def test_a_message_that_opens_one_context_and_sits_inside_another_is_rendered_for_each(
    renderer,
):
    """No system prompt and tool schemas: the template opens a context with a system turn
    listing the tools before its first message. ``u2`` sits inside the first context and,
    after an edit drops the rest, opens the second, so its two pieces differ; and the first
    call's context is one message. Each call's input is the whole context rendered by the
    template and encoded at once (the reference seam's pieces must add up to)."""
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    rollout = Rollout.model_validate(
        {
            "rollout_id": "r2",
            "task_id": "t1",
            "source": "hand",
            "reward": 1.0,
            "tools": tools,
            "events": [
                {"type": "message", "id": "u1", "role": "user", "content": "Fix a.py"},
                {"type": "message", "id": "a1", "role": "assistant", "content": "Looking."},
                {"type": "message", "id": "u2", "role": "user", "content": "Go on."},
                {"type": "message", "id": "a2", "role": "assistant", "content": "Fixed."},
                {
                    "type": "rewrite",
                    "id": "rw",
                    "reason": "edit",
                    "trigger": "model",
                    "context": [{"type": "keep", "id": "u2"}],
                },
                {"type": "message", "id": "a3", "role": "assistant", "content": "Done."},
            ],
        }
    )
    u1, a1, u2 = (
        {"role": r, "content": c}
        for r, c in [("user", "Fix a.py"), ("assistant", "Looking."), ("user", "Go on.")]
    )
    segments = Segmenter(renderer).segments(rollout)
    assert [s.seam_kind for s in segments] == ["none", "edit"]
    inputs = [(segments[0], 0, [u1]), (segments[0], 1, [u1, a1, u2]), (segments[1], 0, [u2])]
    for seg, call, context in inputs:
        want = renderer.encode(renderer.render(context, tools, True)).tolist()
        assert seg.tokens[: seg.spans[call].start].tolist() == want, (call, context)
    assert "# Tools" in renderer.decode(segments[1].tokens)  # u2 opens it: tools first
