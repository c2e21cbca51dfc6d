"""``seam ingest``: raw rollout files → canonical rollouts (Parquet) + quarantine.

Every input file is read by one reader (named, or detected from the file's content),
and every record of it ends in exactly one place: a canonical rollout in
``OUT/rollouts.parquet``, a line of ``OUT/quarantine.jsonl`` (file, line, format,
reason), or a skip counted by reason (records that are not model messages, such as a
Claude Code title). The closing tables reconcile this per format and per file; for
JSONL inputs the records accounted for are checked against the file's lines.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

from pipeline.common.errors import UsageError

SUMMARY_FILE = "ingest.json"
SKIP_ROWS = 8


def run(args) -> int:
    from pipeline.build.run import OutputLock, check_out_path, make_out_dir
    from pipeline.cli.build_rl import os_error_line
    from pipeline.common.options import config_from_args
    from pipeline.readers import REGISTRY
    from pipeline.readers.rewards import load_rewards
    from pipeline.sources.files import plan_tasks, resolve_inputs, walked_files
    from pipeline.sources.input_config import InputConfig

    if args.format not in ("auto", "canonical") and args.format not in REGISTRY:
        raise UsageError(
            f"unknown --format {args.format!r}; choose auto, canonical or one of: "
            f"{', '.join(sorted(REGISTRY))}"
        )
    context = config_from_args(InputConfig, args).read_context()
    out = Path(args.out)
    try:
        with context.active():  # detection reads under the limits too
            files = resolve_inputs(args.inputs)
            check_out_path(out, files, args.inputs)
            rewards = load_rewards(Path(args.rewards)) if args.rewards else None
            tasks = plan_tasks(files, args.format, split=False, walked=walked_files(args.inputs))
            context.check_readers(t.format for t in tasks)
            make_out_dir(out)
            with OutputLock(out):
                _check_out(out, args.overwrite)
                stats = _write(out, tasks, args, rewards, context)
    except OSError as exc:  # disk full, --out not writable: one line, not a traceback
        raise UsageError(os_error_line(exc, str(out), "ingest")) from None
    stats.print(out, args.rewards)
    unaccounted = stats.unaccounted()
    if unaccounted:
        print(
            f"seam ingest: error: {unaccounted:,} input line(s) ended in no rollout, quarantine "
            "entry or skip count (see the lines check above); this is a reader bug",
            file=sys.stderr,
        )
        return 1
    return 0


def _check_out(out: Path, overwrite: bool) -> None:
    """Refuse an --out holding files seam did not write, or an earlier ingest without
    --overwrite; otherwise remove what an earlier ingest wrote (its summary first)."""
    from pipeline.build import out_dir

    out_dir.refuse_foreign(out)
    if (out / "rollouts.parquet").exists() and not overwrite:
        raise UsageError(f"{out / 'rollouts.parquet'} exists; pass --overwrite to replace it")
    (out / SUMMARY_FILE).unlink(missing_ok=True)
    out_dir.clear_written(out)


def _write(out: Path, tasks, args, rewards, context) -> _Stats:
    """rollouts.parquet and quarantine.jsonl (each whole or absent), then ingest.json last:
    a reader that finds the summary finds the outputs it describes."""
    from pipeline.build import out_dir
    from pipeline.common.atomic import atomic_write, write_text
    from pipeline.sources.canonical_io import write_canonical_parquet

    out_dir.record(out, ["rollouts.parquet", "quarantine.jsonl", SUMMARY_FILE])
    stats = _Stats()

    def write_both(quarantine_tmp: str) -> None:
        with open(quarantine_tmp, "w", encoding="utf-8") as quarantine:
            rollouts = _ingest(tasks, args, rewards, stats, quarantine, context)
            write_canonical_parquet(rollouts, out / "rollouts.parquet")

    atomic_write(out / "quarantine.jsonl", write_both, private=True)  # raw session text
    write_text(out / SUMMARY_FILE, json.dumps(stats.as_dict(), indent=2, sort_keys=True))
    return stats


def _ingest(tasks, args, rewards, stats: _Stats, quarantine, context) -> Iterator:
    """Rollouts of every planned file, through ingest's steps (``pipeline/build/steps.py``):
    read → join rewards → drop duplicates (a rollout id seen before is quarantined, the
    first is kept: it would join its GRPO group twice). Quarantine and counts are written
    on the way."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pipeline.build.progress import console
    from pipeline.build.quarantine import NOT_WRITTEN, StreamQuarantine
    from pipeline.build.steps import (
        DropDuplicates,
        JoinRewards,
        Pipeline,
        ReadRecords,
        Rejection,
        Step,
    )

    show = not args.no_progress and sys.stderr.isatty()
    columns = (
        TextColumn("[bold]ingesting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[file]}"),
        TextColumn("{task.fields[rollouts]} rollouts"),
        TimeElapsedColumn(),
    )
    # Bounded like a build's (pipeline/build/quarantine.py): five million "{}" lines fit in a
    # 38 KB .jsonl.zst; past the caps entries are counted (quarantine_not_written).
    bounded = StreamQuarantine(quarantine, context.limits)

    class Sink:
        def reject(self, rejection: Rejection) -> None:
            # A session in several files is read together and accounted for under its
            # first file: its lines are checked against all its files' lines.
            stats.count(
                Path(rejection.task_path), rejection.format, "rejected", None, rejection.records
            )
            before = bounded.not_written
            bounded.add(rejection.entry(), rejection.raw or "")
            stats.total[NOT_WRITTEN] += bounded.not_written - before

    def skipped(task, reason: str, records: int) -> None:
        stats.count(Path(task.path), task.format, "skipped", reason, records)

    with Progress(*columns, console=console, disable=not show) as progress:
        bar = progress.add_task("ingest", total=len(tasks), file="", rollouts=0)

        def planned():
            """The tasks, with the per-file accounting once a task's last item is through
            (the steps pull a task only when every item of the one before has passed)."""
            for task in tasks:
                progress.update(bar, file=Path(task.path).name)
                yield task
                stats.check_lines([Path(task.path), *map(Path, task.paths)], task.format)
                progress.advance(bar)

        steps: list[Step] = [JoinRewards(rewards)] if rewards is not None else []
        steps.append(DropDuplicates())
        read = ReadRecords(planned(), context, on_skip=skipped)
        pipeline = Pipeline(read, steps, Sink())
        for item in pipeline:
            stats.count(Path(item.task.path), item.format, "accepted", item.rollout, item.records)
            stats.rewrites(item.format, item.rollout)
            progress.update(bar, rollouts=stats.total["accepted"])
            yield item.rollout
        if rewards is not None:
            counts = pipeline.stats.counts()
            for key in ("matched", "unmatched"):
                if counts[f"rewards_{key}"]:
                    stats.rewards[key] = counts[f"rewards_{key}"]


class _Stats:
    """Counts per format and per file, reconciled at the end."""

    def __init__(self) -> None:
        self.files: dict[str, Counter] = defaultdict(Counter)
        self.formats: dict[str, Counter] = defaultdict(Counter)
        self.file_format: dict[str, str] = {}
        self.skipped: dict[str, Counter] = defaultdict(Counter)
        self.total: Counter = Counter()
        self.rewards: Counter = Counter()

    def count(self, path: Path, fmt: str, kind: str, payload, records: int) -> None:
        name = str(path)
        self.file_format[name] = fmt
        for counter in (self.files[name], self.formats[fmt], self.total):
            counter[kind] += 1
            counter["records"] += records
        if kind == "skipped":
            self.skipped[fmt][payload] += 1

    def rewrites(self, fmt: str, rollout) -> None:
        for event in rollout.events:
            if event.type == "rewrite":
                self.formats[fmt][f"rewrite:{event.reason}"] += 1
        self.formats[fmt]["calls"] += len(rollout.calls())

    def check_lines(self, paths: list[Path], fmt: str) -> None:
        """For JSONL inputs: every non-blank line must be accounted for (the lines of all
        the files of one session, counted under its first file)."""
        from pipeline.sources.canonical_io import UNREADABLE, iter_jsonl_lines
        from pipeline.sources.files import UNRECOGNISED

        jsonl = (".jsonl", ".jsonl.gz", ".jsonl.zst")
        if fmt == UNRECOGNISED or not all(p.name.endswith(jsonl) for p in paths):
            return
        try:
            lines = sum(1 for p in paths for _ in iter_jsonl_lines(p))
        except UNREADABLE:
            return
        self.files[str(paths[0])]["lines"] = lines

    def unaccounted(self) -> int:
        """Lines of JSONL inputs that no item accounts for (the lines check)."""
        return sum(abs(c["lines"] - c["records"]) for c in self.files.values() if "lines" in c)

    def as_dict(self) -> dict:
        return {
            "total": dict(self.total),
            "formats": {k: dict(v) for k, v in self.formats.items()},
            "files": {k: {**v, "format": self.file_format[k]} for k, v in self.files.items()},
            "skipped": {k: dict(v) for k, v in self.skipped.items()},
            "rewards": dict(self.rewards),
        }

    def print(self, out: Path, rewards_file: str | None) -> None:
        from rich.table import Table

        from pipeline.build.summary_table import table_console

        console = table_console()
        by_format = Table(title=f"seam ingest → {out}", header_style="bold")
        for col in (
            "format",
            "files",
            "records",
            "accepted rollouts",
            "rejected",
            "skipped",
            "calls",
            "rewrites",
        ):
            by_format.add_column(col, justify="left" if col == "format" else "right")
        files_per_format = Counter(self.file_format.values())
        for fmt, c in sorted(self.formats.items()):
            rewrites = ", ".join(
                f"{k.split(':')[1]} {v}" for k, v in sorted(c.items()) if k.startswith("rewrite:")
            )
            by_format.add_row(
                fmt,
                str(files_per_format[fmt]),
                f"{c['records']:,}",
                f"{c['accepted']:,}",
                f"{c['rejected']:,}",
                f"{c['skipped']:,}",
                f"{c['calls']:,}",
                rewrites or "-",
            )
        console.print(by_format)
        per_file = Table(
            title="per file: records = in accepted rollouts + rejected + skipped",
            header_style="bold",
        )
        for col in ("file", "format", "records", "accepted", "rejected", "skipped", "lines check"):
            per_file.add_column(col, justify="left" if col in ("file", "format") else "right")
        for name, c in sorted(self.files.items()):
            shown = _short(name)
            check = (
                "-"
                if "lines" not in c
                else (
                    "ok"
                    if c["lines"] == c["records"]
                    else f"[red]{c['lines'] - c['records']:+} unaccounted[/]"
                )
            )
            per_file.add_row(
                shown,
                self.file_format[name],
                f"{c['records']:,}",
                f"{c['accepted']:,}",
                f"{c['rejected']:,}",
                f"{c['skipped']:,}",
                check,
            )
        console.print(per_file)
        skipped = Table(
            title="skipped records by reason (not model messages; not quarantined)",
            header_style="bold",
        )
        for col in ("format", "reason", "count"):
            skipped.add_column(col, justify="right" if col == "count" else "left")
        for fmt, reasons in sorted(self.skipped.items()):
            common = reasons.most_common()
            for reason, n in common[:SKIP_ROWS]:
                skipped.add_row(fmt, reason, f"{n:,}")
            if len(common) > SKIP_ROWS:
                rest = common[SKIP_ROWS:]
                skipped.add_row(
                    fmt,
                    f"{len(rest)} other reasons (all in {SUMMARY_FILE})",
                    f"{sum(n for _, n in rest):,}",
                )
        if self.skipped:
            console.print(skipped)
        if rewards_file:
            console.print(
                f"rewards from {rewards_file}: {self.rewards['matched']:,} rollouts matched, "
                f"{self.rewards['unmatched']:,} without a row"
            )
        console.print(
            f"wrote {self.total['accepted']:,} rollouts to {out / 'rollouts.parquet'}, "
            f"{self.total['rejected']:,} quarantined records to {out / 'quarantine.jsonl'}"
        )
        if self.total.get("quarantine_not_written"):
            console.print(
                f"{self.total['quarantine_not_written']:,} quarantine entries not written "
                "(past its caps, --max-quarantine-entries/--max-quarantine-mb; counted in "
                "ingest.json)"
            )


def _short(name: str) -> str:
    """A file name as the user would recognise it: relative to the working directory if inside it."""
    path = Path(name)
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return name if len(path.parts) <= 3 else str(Path("…", *path.parts[-3:]))


def register(sub) -> None:
    from pipeline.build.config import OutputConfig
    from pipeline.common.options import add_options
    from pipeline.readers import REGISTRY
    from pipeline.sources.input_config import InputConfig

    formats = "\n".join(
        f"  {name:<16} {reader.description}" for name, reader in sorted(REGISTRY.items())
    )
    about = textwrap.fill(
        "Read raw rollout files, find their compactions and other context rewrites, and write canonical rollouts "
        "to OUT/rollouts.parquet. Records that cannot become a valid rollout go to OUT/quarantine.jsonl with file, "
        "line, format and reason; records that are not model messages are skipped and counted by reason. "
        "OUT/ingest.json holds the counts. See docs/readers.md.",
        width=88,
    )
    p = sub.add_parser(
        "ingest",
        help="Convert raw agent rollouts (Claude Code, Codex, OpenHands, ...) into canonical rollouts.",
        description=f"{about}\n\nformats:\n{formats}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="Files, directories (searched recursively) or globs; .gz and .zst are decompressed on the fly.",
    )
    p.add_argument("--out", required=True, help="Output directory (created if missing).")
    add_options(p, InputConfig)
    add_options(p, OutputConfig, only=("overwrite", "progress"))
    p.set_defaults(func=run)
