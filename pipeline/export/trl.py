"""TRL: pre-tokenized SFT rows, or GRPO rows with precomputed advantages.

``sft`` — what ``SFTTrainer`` treats as an already-processed dataset (it has
``input_ids``): ``input_ids`` plus ``completion_mask`` and ``assistant_masks``, both the
shard's ``loss_mask``. TRL's ``DataCollatorForLanguageModeling`` sets ``labels`` to
-100 wherever ``assistant_masks`` is 0 (and, with ``completion_only_loss``, wherever
``completion_mask`` is 0), so either switch trains exactly the generated tokens.

``grpo`` — the per-sample fields of the batch ``GRPOTrainer`` builds before its loss
(``_generate_and_score_completions`` → ``_compute_loss``): ``prompt_ids``,
``completion_ids``, ``completion_mask``, ``tool_mask``, ``advantages`` (one float: the
rollout's shared advantage) and ``old_per_token_logps`` (the logged sampling log-probs
of the completion, null when not logged). TRL attends with
``cat(prompt_mask, completion_mask)`` and trains ``completion_mask * tool_mask``, so
``completion_mask`` is 1 on every completion token (observations between calls must stay
visible to the model) and the model/observation split is ``tool_mask`` (the shard's
``loss_mask`` from the first generated token on), as in TRL's own multi-turn tool
rollouts. ``pipeline/export/trl_replay.py`` pads rows into that batch and trains on
them. Advantages are already normalized over the rollouts of a task; use them as given:
recomputing them over segments would weight each rollout by its number of segments (the
segment-count bias).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.export.tokens import (
    FIDELITY_FIELDS,
    fidelity_columns,
    response_starts,
    split_lists,
)

IDS = ["rollout_id", "task_id", "segment_index"]

SFT_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("completion_mask", pa.list_(pa.int8())),
        ("assistant_masks", pa.list_(pa.int8())),
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("segment_index", pa.int32()),
        *FIDELITY_FIELDS,
    ]
)

GRPO_SCHEMA = pa.schema(
    [
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("completion_mask", pa.list_(pa.int8())),
        ("tool_mask", pa.list_(pa.int8())),
        ("advantages", pa.float32()),
        ("old_per_token_logps", pa.list_(pa.float32())),
        ("reward", pa.float32()),
        ("num_trainable_tokens", pa.int32()),
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("segment_index", pa.int32()),
        *FIDELITY_FIELDS,
    ]
)


def sft_table(shard: pa.Table) -> pa.Table:
    mask = shard["loss_mask"]
    return pa.Table.from_arrays(
        [shard["input_ids"], mask, mask, *(shard[c] for c in IDS), *fidelity_columns(shard)],
        schema=SFT_SCHEMA,
    )


def grpo_table(shard: pa.Table) -> pa.Table:
    at = response_starts(shard)
    prompt_ids, completion_ids = split_lists(shard["input_ids"], at)
    _, tool_mask = split_lists(shard["loss_mask"], at)
    _, old_logps = split_lists(shard["logprobs"], at)
    lengths = completion_ids.value_lengths().to_numpy(zero_copy_only=False)
    ones = pa.array(np.ones(int(lengths.sum()), dtype=np.int8))
    completion_mask = pa.ListArray.from_arrays(completion_ids.offsets, ones)
    columns = [
        prompt_ids,
        completion_ids,
        completion_mask,
        tool_mask,
        shard["advantage"],
        old_logps,
        shard["reward"],
        shard["num_trainable_tokens"],
        *(shard[c] for c in IDS),
        *fidelity_columns(shard),
    ]
    return pa.Table.from_arrays(columns, schema=GRPO_SCHEMA)
