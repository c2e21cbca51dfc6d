"""The targets of ``seam export`` (``pipeline/export``), registered like the readers:
each ``ExportTarget`` says what it takes (``--mode``, ``--tokenizer``, an install extra),
how its layout is loaded (its README) and which function writes it. ``seam export``'s
``--to``/``--mode`` choices and the one-line checks of ``export_build`` come from here,
not from ``if target == ...`` branches. This module imports nothing heavy (the writers
are named by import string), so the command line lists the targets cheaply."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pipeline.common.registry import add_named, resolve


@dataclass(frozen=True)
class ExportTarget:
    """One layout ``seam export --to NAME`` writes, and what it takes."""

    name: str
    # "module:function" writing the target's files: (shards, out, mode, decoder,
    # max_length) -> (file names, the Parquet schema or None, {key: longest} or {}).
    # Imported when used, so listing the targets (``seam export --help``) stays cheap.
    write: str
    loading: Mapping[str | None, str]  # the README's "how to load", per mode
    modes: tuple[str, ...] = ()  # ``--mode`` values (default: the build stage's trl_mode)
    uses_tokenizer: bool = False  # decodes the build's tokens, so ``--tokenizer`` applies
    extra: str | None = None  # the install extra it needs (``pipeline/extras.py``)
    # Recorded as ``export.json``'s key with the longest prompt and response, and the
    # README line that states them (verl's max_prompt_length / max_response_length).
    lengths_key: str | None = None
    lengths_line: str | None = None  # "module:function" of that line

    def writer(self) -> Callable[..., tuple]:
        return resolve(self.write)

    def lengths_line_of(self, longest: dict) -> str:
        assert self.lengths_line is not None
        return resolve(self.lengths_line)(longest)


EXPORTS: dict[str, ExportTarget] = {}


def register_export(target: ExportTarget) -> ExportTarget:
    """Add a target under its name; a second target with a taken name is a bug."""
    return add_named(EXPORTS, target.name, target, "export target")


def takers(has: Callable[[ExportTarget], object]) -> str:
    """The ``--to`` choices whose target ``has`` something (for one-line errors)."""
    return " / ".join(f"--to {name}" for name, spec in EXPORTS.items() if has(spec))


# How each layout is loaded (the export's README).
TRL_SFT_LOADING = (
    '`SFTTrainer(model, train_dataset=load_dataset("parquet", data_dir=OUT, '
    'split="train"))`: the dataset has `input_ids`, so TRL uses it as tokenized; its '
    "collator sets labels to -100 where `assistant_masks` (and, with "
    "completion_only_loss, `completion_mask`) is 0. The chat template is already applied "
    "(the tool list included), so no `tools` column is needed; to let TRL template "
    "itself, use the SFT build's `messages` and `tools` columns (docs/sft.md)."
)
TRL_GRPO_LOADING = (
    "Rows of the batch `GRPOTrainer` feeds its loss: pad `prompt_ids` on the left and "
    "`completion_ids`, `completion_mask`, `old_per_token_logps` on the right; "
    "`advantages` is one float per row, the rollout's shared GRPO advantage (already "
    "normalized over its task's rollouts)."
)
VERL_LOADING = (
    "`data.train_files` = these Parquet files (RLHFDataset columns `data_source`, "
    "`prompt`, `ability`, `reward_model`, `extra_info`); `agent_loop_output` holds verl's"
    " `AgentLoopOutput` fields (`prompt_ids`, `response_ids`, `response_mask`, "
    "`response_logprobs`, `reward_score`, `num_turns`), which the `seam_replay` agent "
    "loop (pipeline/export/verl_replay.py) returns as recorded; docs/training.md has the "
    "`main_ppo` recipe. `prompt` is decoded from the rendered prompt tokens: its system "
    "turn already holds the tool list as the template wrote it."
)
SLIME_LOADING = (
    "`samples.jsonl`: one `Sample.to_dict()` per line; `rollout_0.pt`: the same samples "
    'as `{"rollout_id": 0, "samples": [...]}`, what slime loads with '
    "`--load-debug-rollout-data OUT/rollout_{rollout_id}.pt` (one rollout step; segments "
    "of a rollout share `rollout_id`)."
)


TRL_MODES = ("sft", "grpo")

register_export(
    ExportTarget(
        "trl",
        "pipeline.export:write_trl",
        loading={"sft": TRL_SFT_LOADING, "grpo": TRL_GRPO_LOADING},
        modes=TRL_MODES,
    )
)
register_export(
    ExportTarget(
        "verl",
        "pipeline.export:write_verl",
        loading={None: VERL_LOADING},
        uses_tokenizer=True,
        lengths_key="verl_lengths",
        lengths_line="pipeline.export.verl:lengths_line",
    )
)
# rollout_0.pt is written with torch.save (slime's --load-debug-rollout-data reads it with
# torch.load): torch comes with the train extra.
register_export(
    ExportTarget(
        "slime", "pipeline.export:write_slime", loading={None: SLIME_LOADING}, extra="train"
    )
)
