"""``seam build-rl``: rollouts → RL shards (segments, masks, GRPO advantages, PPO metadata)."""

from __future__ import annotations

import errno
import os
import shlex
import sys
from pathlib import Path

from pipeline.build.engines import ENGINES
from pipeline.cli.aliases import deprecated_alias
from pipeline.common import options
from pipeline.common.errors import UsageError


def add_build_arguments(p) -> None:
    """Options shared by every build command (RL and SFT): the inputs, ``--out``, and the
    flags of ``BuildConfig``'s fields (``pipeline/build/config.py``), but ``--std``."""
    from pipeline.build.config import BuildConfig

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
    options.add_options(p, BuildConfig, skip=("use_std",))  # --std: build-rl only (GRPO)
    from pipeline.cli.verify import add_verify_argument

    add_verify_argument(p, "sample")


def config_from_args(args, kind: str):
    """The ``BuildConfig`` of a build command line: every field from its flag
    (``values_from_args``), the inputs, ``--out`` and the kind."""
    from pipeline.build.config import BuildConfig

    config = options.config_from_args(
        BuildConfig, args, inputs=args.inputs, out=args.out, kind=kind
    )
    engine = ENGINES[config.engine]
    if engine.extra is not None:
        from pipeline.common import extras

        command = getattr(args, "command", "build-rl")
        extras.require(engine.extra, f"{command} --engine {engine.name}")
    return config


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

    # Its rollouts checked on the build's worker processes' cores; with an engine whose
    # workers are elsewhere (Ray), in this process.
    workers = config.workers if ENGINES[config.engine].owns_cores else 1
    with result.build_times.step("verify", with_children=True):
        # The build hashed its inputs and checked every block it read against them (or
        # found them unchanged: up to date), so verify does not hash them again.
        status = audit_build(
            result.out,
            verify,
            config.tokenizer,
            progress=config.progress,
            workers=workers,
            inputs_checked=True,
        )
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
    from pipeline.build.config import GroupingConfig

    options.add_options(p, GroupingConfig)
    deprecated_alias(p, "--no-std", "--std none", dest="std", const="none")
    p.set_defaults(func=run)
