"""verl: the RL dataset Parquet layout, plus the token fields of an agent-loop output.

verl's ``RLHFDataset`` reads Parquet rows with ``data_source``, ``prompt`` (chat
messages it renders with the chat template), ``ability``, ``reward_model``
(``{style, ground_truth}``) and ``extra_info`` (``{index, split, ...}``), and hands every
column to the agent loop as keyword arguments. ``agent_loop_output`` holds the fields of
verl's ``AgentLoopOutput`` — ``prompt_ids``, ``response_ids``, ``response_mask`` (1 on
generated tokens, 0 on tool observations), ``response_logprobs``, ``reward_score``,
``num_turns`` — so the replay agent loop (``verl_replay.py``) returns them as they are,
instead of sampling. They are one struct, not top-level columns, because verl's default
(v1) trainer stores every column of the row next to the agent loop's output under the
column's name: a top-level ``response_mask`` list would replace verl's mask tensor.

``prompt`` is the segment's prompt tokens decoded and split back into ChatML messages
(tool results show as the user turns the template rendered them into); a tokenizer
without ChatML markers gives one user message holding the decoded prompt.
``reward_model.ground_truth`` is the recorded reward as text; ``verl_reward.py`` is the
``compute_score`` that returns it (verl has none for ``data_source="seam/..."``).

The response ends at the segment's **last trainable token**: verl's reward managers put
the score on the last response token and its GAE skips tokens with ``response_mask`` 0,
so a response ending in untrained tokens (a truncated call whose rendered end-of-turn
is not trained) would lose its reward (A ≡ 0). The tokens cut there are context for
nothing later in the segment; ``trimmed_tokens`` counts them per row.

``extra_info`` also carries each segment's ``trainable_tokens_after`` (N_{>s}) and its
rollout's ``rollout_trainable_tokens``: the per-row numbers of seam's cross-trajectory GAE
(``verl_gae.py``), and its ``context_fidelity`` and ``context_gap_tokens``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.export.tokens import (
    FIDELITY_FIELDS,
    fidelity_columns,
    response_starts,
    split_lists,
)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
EXTRA_INFO = pa.struct(
    [
        ("index", pa.int64()),
        ("split", pa.string()),
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("segment_index", pa.int32()),
        ("num_segments", pa.int32()),
        ("seam_kind", pa.string()),
        ("num_compactions", pa.int32()),
        ("advantage", pa.float32()),
        ("group_size", pa.int32()),
        ("trainable_tokens_after", pa.int32()),
        ("rollout_trainable_tokens", pa.int32()),
        *FIDELITY_FIELDS,
    ]
)
AGENT_LOOP_OUTPUT = pa.struct(
    [
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int8())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("reward_score", pa.float32()),
        ("num_turns", pa.int32()),
    ]
)
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(MESSAGE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", EXTRA_INFO),
        ("agent_loop_output", AGENT_LOOP_OUTPUT),
        ("trimmed_tokens", pa.int32()),
    ]
)


def chatml_messages(text: str) -> list[dict] | None:
    """Messages of a ChatML rendering, without the trailing generation prompt; None if
    the text is not ChatML."""
    if not text.startswith(IM_START):
        return None
    messages = []
    for block in text.split(IM_START)[1:]:
        role, _, body = block.partition("\n")
        messages.append({"role": role, "content": body.removesuffix("\n").removesuffix(IM_END)})
    # The prompt ends with "<|im_start|>assistant\n", which opens the first call's output.
    if messages and messages[-1] == {"role": "assistant", "content": ""}:
        messages.pop()
    return messages


def verl_table(shard: pa.Table, tokenizer, first_index: int) -> pa.Table:
    """``shard`` in verl's layout; ``extra_info.index`` counts rows from ``first_index``.
    ``tokenizer`` is the build's ``tokenizers.Tokenizer`` (decoding needs no chat template)."""
    at = response_starts(shard)
    end = last_trainable_ends(shard["loss_mask"])
    lengths = shard["input_ids"].combine_chunks().value_lengths().to_numpy(zero_copy_only=False)
    kept = slice_lists(shard, end)
    prompt_ids, response_ids = split_lists(kept["input_ids"], at)
    _, response_mask = split_lists(kept["loss_mask"], at)
    _, response_logprobs = split_lists(kept["logprobs"], at)
    texts = tokenizer.decode_batch(prompt_ids.to_pylist(), skip_special_tokens=False)
    prompts = [chatml_messages(t) or [{"role": "user", "content": t}] for t in texts]
    n = shard.num_rows
    num_turns = (
        np.array([len(p) for p in prompts])
        + 1
        + _turns_opened(response_ids, tokenizer, shard["num_calls"])
    )
    extra = pa.StructArray.from_arrays(
        [
            pa.array(np.arange(first_index, first_index + n), pa.int64()),
            pa.array(["train"] * n),
            *(
                shard[name].combine_chunks()
                for name in (
                    "rollout_id",
                    "task_id",
                    "segment_index",
                    "num_segments",
                    "seam_kind",
                    "num_compactions",
                    "advantage",
                    "group_size",
                    "trainable_tokens_after",
                    "rollout_trainable_tokens",
                )
            ),
            *fidelity_columns(shard),
        ],
        fields=list(EXTRA_INFO),
    )
    reward_model = pa.StructArray.from_arrays(
        [pa.array(["recorded"] * n), pc.cast(shard["reward"], pa.string()).combine_chunks()],
        names=["style", "ground_truth"],
    )
    agent_loop_output = pa.StructArray.from_arrays(
        [
            prompt_ids,
            response_ids,
            response_mask,
            response_logprobs,
            shard["reward"].combine_chunks(),
            pa.array(num_turns, pa.int32()),
        ],
        fields=list(AGENT_LOOP_OUTPUT),
    )
    columns = [
        pc.binary_join_element_wise("seam/", shard["source"], ""),
        pa.array(prompts, pa.list_(MESSAGE)),
        pa.array(["agent"] * n),
        reward_model,
        extra,
        agent_loop_output,
        pa.array(lengths - end, pa.int32()),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def longest(table: pa.Table) -> dict[str, int]:
    """The longest prompt and response of ``verl_table``'s rows, under the names of the
    verl settings that must hold them."""
    out = {}
    for key, column in (
        ("max_prompt_length", "prompt_ids"),
        ("max_response_length", "response_ids"),
    ):
        ids = pc.struct_field(table["agent_loop_output"], column)
        out[key] = pc.max(pc.list_value_length(ids)).as_py() or 0
    return out


def lengths_line(longest: dict[str, int]) -> str:
    """What to set so verl keeps every row: its agent loop pads prompts to
    ``data.max_prompt_length`` and responses to ``data.max_response_length``
    (``rollout.prompt_length``/``response_length``); smaller values cut or reject rows."""
    p, r = longest.get("max_prompt_length", 0), longest.get("max_response_length", 0)
    return (
        f"verl: the longest prompt has {p:,} tokens and the longest response {r:,}: set "
        f"`data.max_prompt_length={p} data.max_response_length={r}` (or more) to keep every row."
    )


def last_trainable_ends(loss_mask: pa.ChunkedArray) -> np.ndarray:
    """Per row: 1 + the index of the last 1 in ``loss_mask`` (0 when there is none)."""
    array = loss_mask.combine_chunks()
    lengths = array.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    values = array.flatten().to_numpy(zero_copy_only=False)
    rows = np.repeat(np.arange(len(array)), lengths)
    position = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    ends = np.zeros(len(array), dtype=np.int64)
    np.maximum.at(ends, rows[values == 1], position[values == 1] + 1)
    return ends


def slice_lists(shard: pa.Table, end: np.ndarray) -> dict[str, pa.ListArray]:
    """``input_ids``, ``loss_mask`` and ``logprobs`` of each row cut to ``[:end]``."""
    return {
        name: split_lists(shard[name], end)[0] for name in ("input_ids", "loss_mask", "logprobs")
    }


def _turns_opened(response_ids: pa.ListArray, tokenizer, num_calls: pa.ChunkedArray) -> np.ndarray:
    """Turns that start inside each response, after the first output: one per
    ``<|im_start|>`` in ChatML; otherwise an observation and an output per later call."""
    im_start = tokenizer.token_to_id(IM_START)
    if im_start is None:
        return 2 * (num_calls.to_numpy() - 1)
    lengths = response_ids.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    rows = np.repeat(np.arange(len(response_ids)), lengths)
    values = response_ids.flatten().to_numpy(zero_copy_only=False)
    return np.bincount(rows[values == im_start], minlength=len(response_ids))
