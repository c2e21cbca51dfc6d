"""The cut on plain token ids (``pipeline/core/seams.py``), the way SkyRL tests its merge of
``prompt_token_ids`` and ``response_ids`` into one sequence with ``loss_masks``:
hand-written ids in, exact sequences, spans and masks out. The decoder is the build's
real tokenizer (ids below 256 are single bytes of Qwen2.5's byte-level vocabulary)."""

from __future__ import annotations

import numpy as np

from pipeline.core.mask import MaskOptions, mask_segment
from pipeline.core.seams import TokenCall, segment_token_calls
from pipeline.core.segment import Segmenter

EOS = 151645  # <|im_end|>


def cut(renderer, *calls: TokenCall, header: int = 0):
    return segment_token_calls(calls, renderer, generation_prompt_length=header)


def loss_mask(renderer, seg) -> list[int]:
    masked = mask_segment(seg, MaskOptions(), renderer.eos_id, [True] * len(seg.spans))
    return masked.loss_mask.tolist()


def test_prompts_that_extend_the_sequence_merge_into_one_with_each_response_masked_in(renderer):
    (seg,) = cut(
        renderer,
        TokenCall([1, 2, 3], [10, 11]),
        TokenCall([1, 2, 3, 10, 11, 4, 5], [12, EOS]),
    )
    assert seg.tokens.tolist() == [1, 2, 3, 10, 11, 4, 5, 12, EOS]
    assert loss_mask(renderer, seg) == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert [(s.call_index, s.start, s.length) for s in seg.spans] == [(0, 3, 2), (1, 7, 2)]
    assert (seg.seam_kind, seg.drift_realigned) == ("none", 0)


def test_a_prompt_that_changes_the_prefix_opens_a_new_sequence(renderer):
    first, second = cut(
        renderer,
        TokenCall([1, 2, 3], [10, 11]),
        TokenCall([1, 7, 8], [12], seam_kind="compaction", seam_trigger="budget"),
        TokenCall([1, 7, 8, 12, 9], [13]),
    )
    assert first.tokens.tolist() == [1, 2, 3, 10, 11]
    assert loss_mask(renderer, first) == [0, 0, 0, 1, 1]
    assert second.tokens.tolist() == [1, 7, 8, 12, 9, 13]
    assert loss_mask(renderer, second) == [0, 0, 0, 1, 0, 1]
    assert (second.seam_kind, second.seam_trigger) == ("compaction", "budget")
    assert [s.call_index for s in second.spans] == [1, 2]


def test_a_prompt_that_stops_inside_the_sequence_is_a_seam(renderer):
    # P2 = P1 ⊕ O1 minus its last id: a prefix, but it does not extend the sequence.
    segments = cut(renderer, TokenCall([1, 2, 3], [10, 11]), TokenCall([1, 2, 3, 10], [12]))
    assert [s.tokens.tolist() for s in segments] == [[1, 2, 3, 10, 11], [1, 2, 3, 10, 12]]
    assert segments[1].seam_kind == "divergence"


def test_a_retokenized_output_is_realigned_and_the_sampled_ids_are_kept(renderer):
    sampled = renderer.encode("hel").tolist() + renderer.encode("lo world").tolist()
    canonical = renderer.encode("hello world").tolist()
    assert sampled != canonical and renderer.decode(sampled) == renderer.decode(canonical)
    (seg,) = cut(
        renderer,
        TokenCall([1, 2], sampled, logprobs=[-0.5] * len(sampled)),
        TokenCall([1, 2, *canonical, 4, 5], [12], logprobs=[-0.25]),
    )
    assert seg.tokens.tolist() == [1, 2, *sampled, 4, 5, 12]
    assert seg.drift_realigned == 1
    assert loss_mask(renderer, seg) == [0, 0] + [1] * len(sampled) + [0, 0, 1]
    masked = mask_segment(seg, MaskOptions(), renderer.eos_id, [True, True])
    assert masked.logprobs is not None
    assert masked.logprobs.tolist() == [0, 0] + [-0.5] * len(sampled) + [0, 0, -0.25]


def test_realigned_drift_is_compared_against_what_the_engine_saw_next(renderer):
    """After a realignment the next prompt extends the engine's (re-tokenized) view, not
    the training sequence that keeps the sampled ids: no second seam, no second drift."""
    sampled = renderer.encode("hel").tolist() + renderer.encode("lo").tolist()
    canonical = renderer.encode("hello").tolist()
    p2 = [1, *canonical, 4]
    (seg,) = cut(renderer, TokenCall([1], sampled), TokenCall(p2, [5]), TokenCall([*p2, 5, 6], [7]))
    assert seg.tokens.tolist() == [1, *sampled, 4, 5, 6, 7]
    assert seg.drift_realigned == 1


def test_the_same_text_with_other_ids_before_the_last_turn_is_a_seam_not_drift(renderer):
    split = renderer.encode("hel").tolist() + renderer.encode("lo").tolist()
    whole = renderer.encode("hello").tolist()
    segments = cut(
        renderer,
        TokenCall([1, *split, 2], [10, 11]),
        TokenCall([1, *whole, 2, 10, 11, 3], [12]),
    )
    assert len(segments) == 2 and segments[1].seam_kind == "divergence"


def test_drift_may_start_in_the_assistant_header_before_the_output(renderer):
    # The header's last id and the output's first one merge into one id in the next prompt.
    header_id, out = renderer.encode("\n").tolist(), renderer.encode("\nfoo").tolist()
    merged = renderer.encode("\n\nfoo").tolist()
    assert renderer.decode(header_id + out) == renderer.decode(merged)
    assert merged != header_id + out
    p1 = [1, *header_id]
    calls = (TokenCall(p1, out), TokenCall([1, *merged, 4], [5]))
    assert len(cut(renderer, *calls, header=0)) == 2
    (seg,) = cut(renderer, *calls, header=len(header_id))
    assert seg.tokens.tolist() == [1, *header_id, *out, 4, 5]
    assert seg.drift_realigned == 1


def test_different_text_in_the_last_turn_is_a_seam(renderer):
    segments = cut(
        renderer,
        TokenCall([1], renderer.encode("hello").tolist()),
        TokenCall([1, *renderer.encode("help").tolist(), 4], [5]),
    )
    assert [s.seam_kind for s in segments] == ["none", "divergence"]


def test_spans_carry_kind_truncation_and_logprobs_of_each_call(renderer):
    (seg,) = cut(
        renderer,
        TokenCall([1], [2, EOS], kind="summary", logprobs=[-1.0, -2.0]),
        TokenCall([1, 2, EOS, 3], [4], truncated=True),
    )
    summary, cut_short = seg.spans
    assert (summary.kind, summary.truncated) == ("summary", False)
    assert np.allclose(summary.logprobs, [-1.0, -2.0])
    assert (cut_short.kind, cut_short.truncated, cut_short.logprobs) == ("action", True, None)


def test_no_calls_no_segments(renderer):
    assert cut(renderer) == []


def chat(*texts: str):
    """A rollout of one system message, then user/assistant turns alternating from
    ``texts`` (ids s, u1, a1, u2, a2, ...)."""
    from schemas.rollout import Rollout

    events = [{"type": "message", "id": "s", "role": "system", "content": "S"}]
    for i, text in enumerate(texts):
        role, n = ("user", "u") if i % 2 == 0 else ("assistant", "a")
        events.append({"type": "message", "id": f"{n}{i // 2 + 1}", "role": role, "content": text})
    return Rollout.model_validate(
        {"rollout_id": "r", "task_id": "t", "source": "hand", "reward": 1.0, "events": events}
    )


def test_a_logged_prompt_that_retokenizes_an_earlier_turn_after_rendered_calls_is_a_seam(
    renderer,
):
    """Calls 1 and 2 are rendered (extended message by message); call 3's input was
    logged and spells the same text, but tokenizes call 1's output differently. That is
    not the last turn: a context the model saw differently, so a seam — which only holds
    if the segment tracks where its last output starts through the message-level path."""
    from schemas.replay import replay

    rollout = chat("Go.", "hello world", "More.", "Done.", "Last.", "ok")
    third = replay(rollout)[2]
    prompt, _ = renderer.engine_view(list(third.context), third.message, None)
    canonical = renderer.encode("hello world").tolist()
    split = renderer.encode("hel").tolist() + renderer.encode("lo world").tolist()
    at = next(i for i in range(len(prompt)) if prompt[i : i + len(canonical)] == canonical)
    logged = prompt[:at] + split + prompt[at + len(canonical) :]
    assert renderer.decode(logged) == renderer.decode(prompt)
    rollout.calls()[2].prompt_ids = logged

    assert renderer.incremental  # calls 1-2 take the message-by-message path
    segments = Segmenter(renderer).segments(rollout)
    assert [s.seam_kind for s in segments] == ["none", "divergence"]
    assert [len(s.spans) for s in segments] == [2, 1]
    assert segments[1].tokens.tolist()[: len(logged)] == logged


def test_a_logged_prompt_after_an_output_realigned_at_the_message_level_extends_the_segment(
    renderer,
):
    """Call 2 logged its output with other ids than the template gives its text (drift);
    call 3 is rendered, so the segment realigns call 2's output message by message; call
    4's input was logged by the engine, which saw that output re-tokenized. The segment
    goes on: the engine's view must hold the re-tokenized output exactly where call 2's
    output is, not anywhere else."""
    from schemas.replay import replay

    rollout = chat("Go.", "Start.", "More.", "hello world", "Again.", "Done.", "Last.", "ok")
    sampled = renderer.encode("hel").tolist() + renderer.encode("lo world").tolist() + [EOS]
    calls = rollout.calls()
    calls[1].output_ids = sampled
    fourth = replay(rollout)[3]
    calls[3].prompt_ids = renderer.engine_view(list(fourth.context), fourth.message, None)[0]

    (seg,) = Segmenter(renderer).segments(rollout)
    assert seg.drift_realigned == 1
    span = seg.spans[1]
    assert seg.tokens[span.start : span.start + span.length].tolist() == sampled


def _four_turns(renderer, a2_content: str = "hello world"):
    return chat("Go.", "Start.", "More.", a2_content, "Again.", "Done.")


def test_a_logged_output_with_the_template_s_own_ids_is_no_drift(renderer):
    rollout = _four_turns(renderer)
    rollout.calls()[1].output_ids = renderer.encode("hello world").tolist() + [EOS]
    (seg,) = Segmenter(renderer).segments(rollout)
    assert seg.drift_realigned == 0


def test_a_logged_output_whose_text_the_history_does_not_show_is_a_seam(renderer):
    """The engine sampled "goodbye", the rollout's history says "hello world": the next
    context is not what the model continued from, so it cannot extend the segment."""
    rollout = _four_turns(renderer)
    rollout.calls()[1].output_ids = renderer.encode("goodbye").tolist() + [EOS]
    segments = Segmenter(renderer).segments(rollout)
    assert [s.seam_kind for s in segments] == ["none", "template"]
    assert [len(s.spans) for s in segments] == [2, 1]


def test_the_engine_view_grown_by_chunks_knows_its_length_and_where_the_last_output_starts():
    """The rendered path extends a segment by several chunks at once (trailer, new
    messages, generation prompt); the drift window is measured from the last output's
    start in the engine's view, so both lengths must count every chunk."""
    from pipeline.core.seams import SegmentBuilder

    seg = SegmentBuilder.opened_by(np.array([1, 2, 3], dtype=np.int32), "none", None)
    seg.add_call(0, "action", np.array([10, 11], dtype=np.int32), False, None)
    chunks = [np.array(c, dtype=np.int32) for c in ([9], [], [4, 5, 6], [7])]
    seg.extend_both(chunks)
    seg.add_call(1, "action", np.array([12], dtype=np.int32), False, None)
    assert seg.engine_output_start == 10 and seg.engine_length == 11
    assert seg.engine_tokens().tolist() == [1, 2, 3, 10, 11, 9, 4, 5, 6, 7, 12]
    # The training sequence grew by the same chunks: the second output's span is at 10.
    assert seg.length == 11 and seg.spans[1].start == 10
    assert seg.tokens().tolist() == [1, 2, 3, 10, 11, 9, 4, 5, 6, 7, 12]


def test_joined_chunks_are_numpys_concatenation_and_other_widths_are_not_misread():
    from pipeline.core.seams import joined

    parts = [[151644, 8948], [], [198], list(range(300)), [2**31 - 1, 0]]
    chunks = [np.array(p, dtype=np.int32) for p in parts]
    assert joined(chunks).dtype == np.int32
    assert joined(chunks).tolist() == np.concatenate(chunks).tolist()
    assert joined(chunks[:1]) is chunks[0] and joined([]).tolist() == []
    # An int64 chunk (twice the bytes) or a strided one: joined by value, not by bytes.
    wide = [chunks[0], np.array([7, 8], dtype=np.int64)]
    assert joined(wide).tolist() == [151644, 8948, 7, 8]
    strided = [chunks[3][::2], chunks[0]]
    assert joined(strided).tolist() == [*range(0, 300, 2), 151644, 8948]


def test_a_realigned_output_keeps_the_engine_view_s_length_exact():
    """A realigned drift replaces the last output in the engine's view by its re-tokenized
    ids (``replace_last_output``); the view's kept length must follow, or the next
    call's drift window (measured from ``engine_output_start``) starts off by the
    difference. The outputs and chunks have distinct lengths, so replacing or counting
    the wrong chunk shows."""
    from pipeline.core.seams import SegmentBuilder

    seg = SegmentBuilder.opened_by(np.array([1, 2, 3], dtype=np.int32), "none", None)
    seg.add_call(0, "action", np.array([10, 11], dtype=np.int32), False, None)
    seg.extend_both([np.array([4], dtype=np.int32), np.array([5], dtype=np.int32)])
    seg.add_call(1, "action", np.array([12, 13, 14], dtype=np.int32), False, None)
    seg.replace_last_output(np.array([30], dtype=np.int32))
    assert seg.engine_length == 8 == len(seg.engine_tokens())
    assert seg.engine_tokens().tolist() == [1, 2, 3, 10, 11, 4, 5, 30]
    seg.extend_both([np.array([6, 7], dtype=np.int32)])
    seg.add_call(2, "action", np.array([15], dtype=np.int32), False, None)
    assert seg.engine_output_start == 10 and seg.engine_length == 11
    # The training sequence keeps the sampled output.
    assert seg.tokens().tolist() == [1, 2, 3, 10, 11, 4, 5, 12, 13, 14, 6, 7, 15]


def test_the_retokenized_length_counts_ids_that_end_inside_a_character(renderer):
    """An output re-tokenized by the engine may spell a character over several byte-level
    ids, and a prefix ending inside it decodes to a replacement character of the same
    length as the text: the search's first candidate is then short by one or two ids.
    Qwen2's tokenizer spells 🦜 with 2 ids and 𓀀 with 3; the tail may end with the text."""
    from pipeline.core.seams import retokenized_length

    for text, ids in (("🦜", 2), ("𓀀", 3)):
        spelled = renderer.encode(text)
        assert len(spelled) == ids  # the premise: byte-level ids inside one character
        assert retokenized_length(renderer, renderer.encode(text + " x"), text) == ids
        assert retokenized_length(renderer, spelled, text) == ids  # the whole tail
    assert retokenized_length(renderer, renderer.encode("🦜 x"), "🦝") is None
