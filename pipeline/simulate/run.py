"""Generate N rollouts in parallel and stream them to one file, identical for any worker count.

Work is cut into chunks of whole tasks. One ``Engine`` (tokenizer + template) is loaded
in this process before the workers are forked, so they start with it; each worker returns
a chunk's rollouts already serialized, with a few scalars for Parquet columns and the
closing statistics. The workers are the build's (``pipeline.build.worker.process_pool``: they
end by a sentinel and a join, never by ``multiprocessing.Pool.terminate``, which could
wait forever on a worker stuck on its task queue's lock). ``map`` hands the chunks back in
order, so the file is written front to back as chunks finish and its
bytes depend only on ``(n, seed, group_size, format)``. Compressed outputs are
deterministic too: gzip with ``mtime=0`` and no file name, zstd single-threaded,
Parquet without timestamps. The file is written under a temporary name, then renamed.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.common.atomic import atomic_write
from pipeline.sources.canonical_io import CANONICAL_PARQUET_SCHEMA, rollout_to_json

FORMATS = {
    "jsonl": ".jsonl",
    "jsonl.gz": ".jsonl.gz",
    "jsonl.zst": ".jsonl.zst",
    "parquet": ".parquet",
}
TASKS_PER_CHUNK = 4


@dataclass(frozen=True)
class Job:
    n: int
    seed: str
    group_size: int
    out: Path
    fmt: str
    workers: int


@dataclass
class Totals:
    """What the run wrote, for the closing table."""

    rollouts: int = 0
    calls: int = 0
    compactions: int = 0
    rewrites: dict = field(default_factory=dict)
    logging: dict = field(default_factory=dict)
    drifted_rollouts: int = 0
    corrections: dict = field(default_factory=dict)
    summary_tokens: list = field(default_factory=list)
    resolved: int = 0
    truncated: int = 0
    bytes: int = 0

    def add(self, s: dict) -> None:
        self.rollouts += 1
        self.calls += s["calls"]
        self.compactions += s["compactions"]
        self.resolved += s["resolved"]
        self.truncated += s["truncated"]
        self.drifted_rollouts += s["drifted"] > 0
        self.summary_tokens += s["summary_tokens"]
        for key, table in (("rewrites", self.rewrites), ("corrections", self.corrections)):
            for k, v in s[key].items():
                table[k] = table.get(k, 0) + v
        self.logging[s["logging"]] = self.logging.get(s["logging"], 0) + 1


_ENGINE = None


def _engine():
    global _ENGINE
    if _ENGINE is None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from pipeline.core.render import ChatRenderer
        from pipeline.core.tokenizer import load_tokenizer
        from pipeline.simulate.context import Engine

        _ENGINE = Engine(ChatRenderer(load_tokenizer()))
    return _ENGINE


def _stats(rollout) -> dict:
    events = rollout.events
    calls = rollout.calls()
    rewrites: dict[str, int] = {}
    for e in events:
        if e.type == "rewrite":
            rewrites[e.reason] = rewrites.get(e.reason, 0) + 1
    corrections: dict[str, int] = {}
    for c in rollout.corrections:
        corrections[c.type] = corrections.get(c.type, 0) + 1
    return {
        "calls": len(calls),
        "compactions": rewrites.get("compaction", 0),
        "rewrites": rewrites,
        "logging": rollout.meta["token_logging"],
        "drifted": rollout.meta["drifted_calls"],
        "corrections": corrections,
        "summary_tokens": rollout.meta.get("summary_tokens", []),
        "resolved": bool(rollout.resolved),
        "truncated": any(c.finish_reason == "length" for c in calls),
    }


def simulate_chunk(args: tuple[str, int, int, int, int]) -> list[tuple[bytes, tuple, dict]]:
    """Rollouts of tasks [first, last) of a run of ``n``: (JSON line, Parquet scalars, stats)."""
    from pipeline.simulate.rollouts import simulate_task

    seed, first, last, group_size, n = args
    out = []
    for task_index in range(first, last):
        members = range(min(group_size, n - task_index * group_size))
        for r in simulate_task(_engine(), seed, task_index, group_size, members):
            scalars = (
                r.schema_version,
                r.rollout_id,
                r.task_id,
                r.source,
                r.model,
                r.reward,
                r.resolved,
                len(r.events),
            )
            out.append((rollout_to_json(r), scalars, _stats(r)))
    return out


def chunks(job: Job) -> list[tuple[str, int, int, int, int]]:
    n_tasks = (job.n + job.group_size - 1) // job.group_size
    return [
        (job.seed, a, min(n_tasks, a + TASKS_PER_CHUNK), job.group_size, job.n)
        for a in range(0, n_tasks, TASKS_PER_CHUNK)
    ]


def _results(job: Job) -> Iterator[list]:
    work = chunks(job)
    if job.workers <= 1:
        yield from map(simulate_chunk, work)
        return
    from pipeline.build.worker import process_pool

    _engine()  # loaded once here; the forked workers start with it
    with process_pool(job.workers) as pool:
        yield from pool.map(simulate_chunk, work)


def run(job: Job, on_progress: Callable[[int], None] = lambda k: None) -> Totals:
    """Simulate ``job.n`` rollouts into ``job.out``; returns what was written."""
    totals = Totals()
    job.out.parent.mkdir(parents=True, exist_ok=True)

    def write_all(tmp: str) -> None:
        with _writer(job.fmt, Path(tmp)) as write:
            for chunk in _results(job):
                write(chunk)
                for _, _, stats in chunk:
                    totals.add(stats)
                on_progress(len(chunk))

    atomic_write(job.out, write_all, fsync=False)
    totals.bytes = job.out.stat().st_size
    return totals


class _writer:
    """A context manager yielding ``write(chunk)`` for the chosen format."""

    def __init__(self, fmt: str, path: Path):
        self.fmt, self.path = fmt, path

    def __enter__(self):
        if self.fmt == "parquet":
            self.pq = pq.ParquetWriter(self.path, CANONICAL_PARQUET_SCHEMA, compression="zstd")
            return self._parquet
        self.raw = open(self.path, "wb")
        if self.fmt == "jsonl.gz":
            self.fh: Any = gzip.GzipFile(
                filename="", mode="wb", fileobj=self.raw, mtime=0, compresslevel=6
            )
        elif self.fmt == "jsonl.zst":
            import zstandard

            params = zstandard.ZstdCompressionParameters.from_level(
                10, window_log=27, enable_ldm=True
            )
            self.fh = zstandard.ZstdCompressor(compression_params=params).stream_writer(
                self.raw, closefd=False
            )
        else:
            self.fh = self.raw
        return self._jsonl

    def _jsonl(self, chunk: list) -> None:
        self.fh.write(b"".join(line + b"\n" for line, _, _ in chunk))

    def _parquet(self, chunk: list) -> None:
        columns = list(zip(*[scalars + (line.decode(),) for line, scalars, _ in chunk]))
        self.pq.write_table(
            pa.Table.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(columns, CANONICAL_PARQUET_SCHEMA)],
                schema=CANONICAL_PARQUET_SCHEMA,
            )
        )

    def __exit__(self, *exc) -> None:
        if self.fmt == "parquet":
            self.pq.close()
            return
        if self.fh is not self.raw:
            self.fh.close()
        self.raw.close()


def summary_rows(t: Totals, seconds: float) -> list[tuple[str, str]]:
    n = max(t.rollouts, 1)
    toks = sorted(t.summary_tokens)
    median = toks[len(toks) // 2] if toks else 0
    logged = n - t.logging.get("none", 0)
    return [
        (
            "rollouts",
            f"{t.rollouts:,} ({t.rollouts / max(seconds, 1e-9):,.1f}/s, {t.calls / n:.1f} calls each)",
        ),
        ("resolved", f"{t.resolved / n:.1%}"),
        ("compactions per rollout", f"{t.compactions / n:.2f}"),
        ("rewrites", ", ".join(f"{k} {v:,}" for k, v in sorted(t.rewrites.items())) or "none"),
        (
            "summary length (tokens)",
            f"median {median:,}, max {toks[-1] if toks else 0:,} over {len(toks):,} summaries",
        ),
        (
            "token ids logged",
            f"{logged / n:.1%} (full {t.logging.get('full', 0) / n:.1%}, output only "
            f"{t.logging.get('output', 0) / n:.1%})",
        ),
        ("re-tokenization drift", f"{t.drifted_rollouts / n:.1%} of rollouts"),
        ("truncated last call", f"{t.truncated / n:.1%} of rollouts"),
        (
            "corrections",
            ", ".join(f"{k} {v:,}" for k, v in sorted(t.corrections.items())) or "none",
        ),
        ("output", f"{t.bytes / 1e6:,.1f} MB" if t.bytes >= 1e6 else f"{t.bytes / 1e3:,.1f} kB"),
    ]
