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

from pipeline.errors import UsageError

SUMMARY_FILE = "ingest.json"
UNRECOGNISED = "unrecognised"
SKIP_ROWS = 8


def run(args) -> int:
    from pipeline.canonical_io import write_canonical_parquet
    from pipeline.inputs import InputError, resolve_inputs
    from pipeline.readers import REGISTRY
    from pipeline.readers.detect import FormatError
    from pipeline.readers.rewards import RewardsError, load_rewards

    if args.format not in ("auto", "canonical") and args.format not in REGISTRY:
        raise UsageError(
            f"unknown --format {args.format!r}; choose auto, canonical or one of: "
            f"{', '.join(sorted(REGISTRY))}"
        )
    out = Path(args.out)
    target = out / "rollouts.parquet"
    if target.exists() and not args.overwrite:
        raise UsageError(f"{target} exists; pass --overwrite to replace it")
    try:
        rewards = load_rewards(Path(args.rewards)) if args.rewards else None
        plan = [entry for spec in args.inputs for entry in _plan(spec, args.format, resolve_inputs)]
    except (InputError, FormatError, RewardsError) as exc:
        raise UsageError(str(exc)) from None
    stats = _Stats()
    out.mkdir(parents=True, exist_ok=True)
    quarantine_tmp = out / ".quarantine.jsonl.tmp"
    with open(quarantine_tmp, "w") as quarantine:
        rollouts = _ingest(plan, args, rewards, stats, quarantine)
        write_canonical_parquet(rollouts, target)
    quarantine_tmp.replace(out / "quarantine.jsonl")
    (out / SUMMARY_FILE).write_text(json.dumps(stats.as_dict(), indent=2, sort_keys=True))
    stats.print(out, args.rewards)
    return 0


def _plan(spec: str, fmt: str, resolve_inputs) -> list[tuple[Path, str, str | None]]:
    """(file, format, why unrecognised) for the files of one input. A file found by
    walking a directory whose format is not recognised is quarantined, not fatal."""
    from pipeline.inputs import detect_format
    from pipeline.readers.detect import FormatError

    walked = Path(spec).expanduser().is_dir()
    planned: list[tuple[Path, str, str | None]] = []
    for path in resolve_inputs([spec]):
        if fmt != "auto":
            planned.append((path, fmt, None))
            continue
        try:
            planned.append((path, detect_format(path), None))
        except FormatError as exc:
            if not walked:
                raise
            planned.append((path, UNRECOGNISED, str(exc)))
    return planned


def _ingest(plan, args, rewards, stats: _Stats, quarantine) -> Iterator:
    """Rollouts of every planned file; quarantine and counts are written on the way."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pipeline.progress import console
    from pipeline.readers.rewards import apply_rewards

    show = not args.no_progress and sys.stderr.isatty()
    columns = (
        TextColumn("[bold]ingesting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[file]}"),
        TextColumn("{task.fields[rollouts]} rollouts"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, disable=not show) as progress:
        bar = progress.add_task("ingest", total=len(plan), file="", rollouts=0)
        for path, fmt, why in plan:
            progress.update(bar, file=path.name)
            for kind, line, payload, records in _items(path, fmt, why, args):
                stats.count(path, fmt, kind, payload, records)
                if kind == "accepted":
                    rollout = payload
                    if rewards is not None:
                        rollout, key = apply_rewards(rollout, rewards)
                        stats.rewards["matched" if key else "unmatched"] += 1
                    stats.rewrites(fmt, rollout)
                    progress.update(bar, rollouts=stats.total["accepted"])
                    yield rollout
                elif kind == "rejected":
                    reason, raw = payload
                    quarantine.write(
                        json.dumps(
                            {
                                "file": str(path),
                                "line": line,
                                "format": fmt,
                                "reason": reason,
                                "raw": (raw or "")[: 1 << 20],
                            },
                            ensure_ascii=False,
                        )
                        + "\n"
                    )
            stats.check_lines(path, fmt)
            progress.advance(bar)


def _items(path: Path, fmt: str, why: str | None, args):
    """(kind, line, payload, records) for each item a file yields; never raises."""
    from pipeline.canonical_io import iter_canonical_records
    from pipeline.readers import REGISTRY, Accepted, Rejected

    if fmt == UNRECOGNISED:
        yield "rejected", None, (why, None), 1
        return
    try:
        if fmt == "canonical":
            for raw, parsed in iter_canonical_records(path):
                if isinstance(parsed, str):
                    yield "rejected", raw.line, (parsed, raw.data.decode("utf-8", "replace")), 1
                else:
                    yield "accepted", raw.line, parsed, 1
            return
        reader = REGISTRY[fmt].configure(group_by=args.group_by)
        for item in reader.read(path):
            if isinstance(item, Accepted):
                yield "accepted", item.line, item.rollout, item.records
            elif isinstance(item, Rejected):
                yield "rejected", item.line, (item.reason, item.raw), item.records
            else:
                yield "skipped", item.line, item.reason, 1
    except Exception as exc:  # a reader bug must not stop the other files or lose this one silently
        yield "rejected", None, (f"reader {fmt} failed: {type(exc).__name__}: {exc}", None), 0


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

    def check_lines(self, path: Path, fmt: str) -> None:
        """For JSONL inputs: every non-blank line must be accounted for."""
        if not path.name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")) or fmt == UNRECOGNISED:
            return
        from pipeline.canonical_io import iter_jsonl_lines

        try:
            lines = sum(1 for _ in iter_jsonl_lines(path))
        except (OSError, EOFError, ValueError):
            return
        self.files[str(path)]["lines"] = lines

    def as_dict(self) -> dict:
        return {
            "total": dict(self.total),
            "formats": {k: dict(v) for k, v in self.formats.items()},
            "files": {k: {**v, "format": self.file_format[k]} for k, v in self.files.items()},
            "skipped": {k: dict(v) for k, v in self.skipped.items()},
            "rewards": dict(self.rewards),
        }

    def print(self, out: Path, rewards_file: str | None) -> None:
        from rich.console import Console
        from rich.table import Table

        console = Console()
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


def _short(name: str) -> str:
    """A file name as the user would recognise it: relative to the working directory if inside it."""
    path = Path(name)
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return name if len(path.parts) <= 3 else str(Path("…", *path.parts[-3:]))


def register(sub) -> None:
    from pipeline.readers import REGISTRY

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
    p.add_argument(
        "--format",
        default="auto",
        help="auto (default): detect each file's format from its content and refuse ambiguous or unknown "
        "files; canonical; or one reader name from the list above, used for every input.",
    )
    p.add_argument(
        "--rewards",
        metavar="FILE",
        default=None,
        help="CSV or JSONL with rollout_id / session_id / id, reward, and optional task_id and resolved: "
        "joined to the rollouts (for formats that record no reward, e.g. Claude Code, Codex).",
    )
    p.add_argument(
        "--group-by",
        metavar="FIELD",
        default=None,
        help="chat-completions logs only: dotted path of the field that names the rollout a call belongs "
        "to (default: session_id, conversation_id, rollout_id, ... else the first messages).",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="Replace an existing OUT/rollouts.parquet."
    )
    p.add_argument("--no-progress", action="store_true", help="No progress bar (logs, CI).")
    p.set_defaults(func=run)
