"""``seam simulate``: write realistic simulated rollouts (SWE-style tasks with compaction)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pipeline.cli.aliases import deprecated_alias
from pipeline.common.errors import UsageError


def _target(out: str, fmt: str | None) -> tuple[Path, str]:
    """The output file and its format: from --format, else from the file name's suffix;
    an --out without a known suffix is a directory that receives ``rollouts.<ext>``."""
    from pipeline.simulate.run import FORMATS

    path = Path(out)
    by_suffix = next(
        (
            f
            for f, ext in sorted(FORMATS.items(), key=lambda kv: -len(kv[1]))
            if path.name.endswith(ext)
        ),
        None,
    )
    if by_suffix is None:
        fmt = fmt or "jsonl"
        return path / f"rollouts{FORMATS[fmt]}", fmt
    if fmt is not None and fmt != by_suffix:
        raise UsageError(f"--out {out} ends in {FORMATS[by_suffix]} but --format is {fmt}")
    return path, by_suffix


def run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
    from rich.table import Table

    from pipeline.simulate.run import Job, summary_rows
    from pipeline.simulate.run import run as simulate

    if args.n < 1:
        raise UsageError("--n must be at least 1")
    if args.group_size < 1:
        raise UsageError("--group-size must be at least 1")
    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    out, fmt = _target(args.out, args.format)
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory")
    job = Job(
        n=args.n,
        seed=str(args.seed),
        group_size=args.group_size,
        out=out,
        fmt=fmt,
        workers=min(args.workers, max(1, args.n // (4 * args.group_size))),
    )
    console = Console(stderr=True)
    start = time.perf_counter()
    show = not args.no_progress and sys.stderr.isatty()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
    ) as progress:
        bar = progress.add_task("simulating", total=args.n)
        totals = simulate(job, lambda k: progress.advance(bar, k))
    seconds = time.perf_counter() - start
    table = Table(title=f"seam simulate → {out}", show_header=False)
    for key, value in summary_rows(totals, seconds):
        table.add_row(key, value)
    console.print(table)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="Write simulated SWE-agent rollouts with compactions, edits, token logs and judge corrections.",
        description="Generate realistic, deterministic SWE-style agent rollouts in seam's canonical format: file "
        "searches, reads, edits, pytest runs with tracebacks, patches; CompactionRL budget compaction "
        "(C - |h| < T_comp, summary after q_sum, context = system + resume + last 2 steps, at most 3), "
        "AutoCompact compact() calls with '# Auto Context Summary' working states and judge corrections "
        "(24% trigger / 53% state / 23% continuation), MemAct context edits and truncations; some "
        "rollouts log prompt/output token ids and logprobs, some with a non-canonical tokenization "
        "(re-tokenization drift). The same --seed gives the same bytes for any --workers.",
    )
    p.add_argument("--n", type=int, required=True, help="Number of rollouts to write.")
    p.add_argument(
        "--out",
        required=True,
        help="Output file (.jsonl, .jsonl.gz, .jsonl.zst or .parquet), or a directory that receives "
        "rollouts.<ext>. Written under a temporary name, then renamed; an existing file is replaced.",
    )
    p.add_argument(
        "--seed",
        default="0",
        help="Seed of the run (any string; default 0). Same seed, same bytes.",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=4,
        help="Rollouts per task (G): each task's rollouts share a task_id and form one GRPO group; "
        "groups are all-pass, all-fail or mixed (default 4).",
    )
    from pipeline.build.config import EngineConfig, OutputConfig
    from pipeline.common.options import add_options

    add_options(p, EngineConfig, only=("workers",))
    formats = ["jsonl", "jsonl.gz", "jsonl.zst", "parquet"]
    deprecated_alias(p, "--format", "--output-format", dest="format", choices=formats)
    p.add_argument(
        "--output-format",
        choices=formats,
        default=None,
        dest="format",
        help="Output format (default: from the --out suffix, else jsonl). jsonl.zst uses a long window "
        "and compresses token-id logs best; parquet is seam's canonical Parquet layout.",
    )
    add_options(p, OutputConfig, only=("progress",))
    p.set_defaults(func=run)
