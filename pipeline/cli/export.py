"""``seam export DIR --to trl|verl|slime --out DIR``: shards in another trainer's layout."""

from __future__ import annotations


def run(args) -> int:
    from pipeline.build.config import LengthConfig
    from pipeline.common.options import config_from_args
    from pipeline.export import export_build

    config_from_args(LengthConfig, args)  # its check: one line
    result = export_build(
        args.dir, args.to, args.out, args.mode, args.tokenizer, args.overwrite, args.max_length
    )
    what = args.to + (f" ({result.mode})" if result.mode else "")
    print(
        f"exported {result.rows:,} segment(s) for {what} to {result.out}: {', '.join(result.files)}, README.md"
    )
    if args.max_length:
        print(
            f"--max-length {args.max_length}: left out {result.dropped_rows:,} segment(s) longer than "
            f"that ({result.dropped_trainable_tokens:,} trainable tokens)"
        )
    print("rows and trainable tokens kept at each maximum length (rows longer are left out):")
    for r in result.lengths or []:
        print(
            f"  {r['max_length']:>7,}: {r['rows']:>8,} rows ({r['rows_share']:6.1%})  "
            f"{r['trainable_tokens']:>12,} trainable tokens ({r['trainable_share']:6.1%})"
        )
    if result.verl_lengths is not None:
        from pipeline.export.verl import lengths_line

        print(lengths_line(result.verl_lengths))
    return 0


def register(sub) -> None:
    from pipeline.build.config import LengthConfig, OutputConfig, TokenizerConfig
    from pipeline.common.options import add_options
    from pipeline.export_targets import EXPORTS, TRL_MODES

    p = sub.add_parser(
        "export",
        help="Export a build for TRL, verl or slime.",
        description="Convert a build directory's shards to the layout a trainer loads. trl: pre-tokenized SFT rows "
        "(input_ids, completion_mask, assistant_masks) or GRPO rows (prompt_ids, completion_ids, "
        "completion_mask, advantages, old_per_token_logps). verl: RLHFDataset Parquet (data_source, "
        "prompt, ability, reward_model, extra_info) plus agent_loop_output, the agent-loop token fields "
        "(prompt_ids, response_ids, response_mask, response_logprobs, reward_score, num_turns). slime: Sample dicts "
        "as JSON lines (segments of one rollout share rollout_id). verl multi-turn SFT needs no "
        "export: verl reads an SFT build directory through data.custom_cls "
        "(pipeline/export/verl_sft.py, docs/sft.md). See docs/data.md.",
    )
    p.add_argument("dir", help="A build directory (seam build-rl or build-sft).")
    p.add_argument("--to", required=True, choices=list(EXPORTS), help="Target trainer.")
    p.add_argument(
        "--out",
        required=True,
        help="Output directory (created; must be empty or an earlier export).",
    )
    p.add_argument(
        "--mode",
        choices=TRL_MODES,
        help="TRL only: sft or grpo columns (default: sft for SFT builds, grpo for RL builds).",
    )
    add_options(p, TokenizerConfig, only=("tokenizer",))  # the build's, if it moved
    add_options(p, LengthConfig)
    add_options(p, OutputConfig, only=("overwrite",))
    p.set_defaults(func=run)
