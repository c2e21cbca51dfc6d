"""The streaming build: inputs → tasks → part files (in parallel) → shards.

Two stages: each task runs the steps of ``worker.run_task`` on the build's executor
(``executor.py``: the ``--engine`` registered in ``engines.py``), then the finalize stage's
steps run once (``finalize.py``: duplicates across tasks, advantages and shards, the
quarantine, a ``BuildStage``'s side outputs, the card and the manifest). This module plans
the tasks, locks and resumes, and drives the two. Memory is bounded by one task's rows (a
byte range of ``chunk_bytes`` of input) per worker plus one shard.

Output directory lifecycle:
- ``OUT/.lock`` is held (``flock``) for the whole build: a second build into the same
  directory refuses at once; the lock dies with the process, even on SIGKILL.
- ``OUT/.parts/`` holds finished tasks; a rerun with the same fingerprint skips them.
  Worker processes die with the build, so nothing writes into ``OUT`` after a kill.
- Shards, ``quarantine.jsonl`` and a stage's side outputs are written into
  ``OUT/.parts/publish/`` and renamed into ``OUT`` only once the whole set is there, then
  ``README.md`` and ``manifest.json`` (last); ``.parts`` is removed once the manifest
  exists. A failed build never leaves a loadable set of shards (only a kill inside the
  renames can show part of a complete set; its rerun completes it). A rerun of an
  interrupted build rewrites whatever it had finalized from the parts, so a killed build
  rerun gives the bytes of an uninterrupted one; a failed build removes its temporary files.
- ``OUT/.seam-written`` records every entry the build creates, before creating it:
  ``--overwrite`` deletes only those (``pipeline/build/out_dir.py``), and an ``--out`` holding
  anything else, or overlapping an input, is refused before anything is deleted.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import shutil
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pipeline import __version__
from pipeline.build import out_dir
from pipeline.build.config import BuildConfig
from pipeline.build.engines import ENGINES
from pipeline.build.executor import running
from pipeline.build.finalize import Finalizing, final_steps, run_final_steps
from pipeline.build.input_hashes import start_digests
from pipeline.build.manifest import Manifest, ManifestError
from pipeline.build.steps import PipelineStats
from pipeline.build.worker import TaskResult, part_paths
from pipeline.build.write import file_sha256
from pipeline.common.atomic import remove_temporaries
from pipeline.common.errors import SeamError
from pipeline.common.step_times import StepTimes
from pipeline.core.shard_schema import SHARD_SCHEMA_VERSION
from pipeline.sources.files import Task, plan_tasks, resolve_inputs, walked_files
from pipeline.sources.read_hash import BLOCK, changed_blocks, recording


class BuildError(SeamError, ValueError):
    """A configuration problem detected before any work: one actionable line."""


@dataclass
class BuildResult:
    out: Path
    shards: list[str]
    counts: Counter
    seams: Counter
    skipped: Counter
    per_file: dict
    group_of_one: int
    manifest: dict
    up_to_date: bool = False
    # Seconds per step (never in the manifest): the workers' steps summed over the tasks
    # this run ran (a resumed task's are not), and the build process's own (finalize).
    worker_times: StepTimes = field(default_factory=StepTimes)
    build_times: StepTimes = field(default_factory=StepTimes)
    # The finalize stage's steps' counters (``pipeline/build/finalize.py``; not in the
    # manifest), None for a build that was already up to date.
    finalize_stats: PipelineStats | None = None


class OutputLock:
    def __init__(self, out: Path):
        self.path = out / ".lock"
        self.fh: IO[str] | None = None

    def __enter__(self):
        while True:
            try:  # never through a symlink: a planted .lock must not create a file elsewhere
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise BuildError(
                        f"{self.path} is a symlink, not a seam lock; remove it and rerun"
                    ) from None
                raise
            fh = os.fdopen(fd, "r+")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                raise BuildError(
                    f"{self.path.parent} is in use by another seam build (lock {self.path}); wait for it or pick another --out"
                ) from None
            # A finishing build unlinks the file before unlocking it: a lock taken on that
            # unlinked file excludes nobody, so lock the file that is there now instead.
            try:
                if os.stat(self.path).st_ino == os.fstat(fh.fileno()).st_ino:
                    self.fh = fh
                    return self
            except FileNotFoundError:
                pass
            fh.close()

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:  # e.g. disk full: leave no half-written file behind
            _remove_temporaries(self.path.parent)
            shutil.rmtree(self.path.parent / ".parts" / "publish", ignore_errors=True)
        # Unlink while still holding the lock so a finished build leaves no stray file.
        self.path.unlink(missing_ok=True)
        if self.fh is not None:  # always: __enter__ returns only once it holds the lock
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()


def _tokenizer_info(config: BuildConfig) -> dict:
    from pipeline.build.worker import segmenter_with
    from pipeline.core.render import TemplateError
    from pipeline.core.tokenizer import tokenizer_fingerprint

    try:
        renderer = segmenter_with(config.tokenizer, config.chat_template).renderer
    except TemplateError as exc:
        raise BuildError(
            f"the chat template ({config.chat_template or 'of the tokenizer'}) cannot be used: {exc}"
        ) from None
    info: dict[str, Any] = dict(tokenizer_fingerprint(renderer.tokenizer))
    info["incremental_rendering"] = renderer.incremental
    return info


def _check_out_dir(out: Path, fingerprint: str, overwrite: bool) -> bool:
    """True when ``out`` already holds this exact build. Raises for a directory seam must
    not write into, before deleting anything: a different build without ``--overwrite``,
    or one holding entries seam did not write (``--overwrite`` never deletes those)."""
    manifest_path = out / "manifest.json"
    if manifest_path.exists() and "manifest.json" not in out_dir.written(out):
        # Another tool's manifest (or a build from before the record): nothing in it is
        # trusted, whatever it lists; the directory is refused in one line.
        _refuse_foreign(out)
    if manifest_path.exists():
        try:
            manifest = Manifest.read(out)
        except ManifestError:
            if not overwrite:
                raise BuildError(
                    f"{out}/manifest.json is not a seam manifest; choose another --out (or --overwrite)"
                ) from None
            manifest = Manifest(shards=[])  # replaced below
        if manifest.shard_schema_version != SHARD_SCHEMA_VERSION:
            if not overwrite:
                rebuild = manifest.command or f"seam build-{manifest.kind} INPUT... --out {out}"
                raise BuildError(
                    f"{out} was built with shard schema {manifest.shard_schema_version} (this seam writes "
                    f"{SHARD_SCHEMA_VERSION}); rebuild it: {rebuild}"
                    + ("" if "--overwrite" in rebuild.split() else " --overwrite")
                )
        elif manifest.fingerprint == fingerprint:
            # Killed after writing its manifest, a build may have left its parts behind.
            shutil.rmtree(out / ".parts", ignore_errors=True)
            _remove_temporaries(out)
            return True
        elif not overwrite:
            raise BuildError(
                f"{out} already holds a different build; pass --overwrite to replace it or choose another --out"
            )
    _refuse_foreign(out)
    # What is left is seam's: a build to replace (--overwrite), an interrupted build whose
    # finished parts resume (if the fingerprint still matches) and whatever it had
    # finalized is rewritten from them, or the leftovers of a killed --overwrite.
    interrupted = (out / ".parts" / "fingerprint").exists() and not manifest_path.exists()
    out_dir.clear_written(out, keep=(".lock", ".parts") if interrupted else (".lock",))
    return False


def _refuse_foreign(out: Path) -> None:
    try:
        out_dir.refuse_foreign(out)
    except out_dir.OutDirError as exc:
        raise BuildError(str(exc)) from None


def _remove_temporaries(out: Path) -> None:
    remove_temporaries(out)
    if (out / ".parts").is_dir():
        remove_temporaries(out / ".parts")


def auto_chunk_bytes(files: list[Path]) -> int:
    """Task size for JSONL byte ranges: about 64 tasks per build so workers stay evenly
    busy to the end, between 256 KiB (per-task overhead) and 4 MiB (memory per worker).
    A function of the inputs only, so the output does not depend on --workers."""
    total = sum(f.stat().st_size for f in files)
    return int(min(4 << 20, max(256 << 10, total // 64)))


def run_build(config: BuildConfig, command: str = "") -> BuildResult:
    start = StepTimes.clock()
    if ENGINES[config.engine].owns_cores:
        # Workers own the cores: every process of a local build encodes on one thread.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    check_exclude_fidelity(config.exclude_fidelity)
    with config.read_context().active():  # detection and the range feeder read under it too
        return _run_build_reading(config, command, start)


def _run_build_reading(
    config: BuildConfig, command: str, start: tuple[float, float]
) -> BuildResult:
    files = resolve_inputs(config.inputs)
    check_out_path(Path(config.out), files, config.inputs)
    states = [_file_state(f) for f in files]  # before the first byte is hashed
    # The file's sha256 and its block digests (``read_hash``): what the tasks read is
    # checked against them before anything is published. Hashed in child processes
    # (``input_hashes``) while this process loads the tokenizer, which holds the GIL.
    stop = threading.Event()  # set when the build fails first: exit without reading on
    digests = start_digests(files, stop)
    try:
        return _run_build(config, command, files, digests, states, start)
    finally:
        stop.set()


def check_exclude_fidelity(reasons) -> None:
    """Refuse an ``--exclude-fidelity`` reason seam never gives a segment."""
    from pipeline.core.fidelity import REASONS

    unknown = [r for r in reasons if r not in REASONS]
    if unknown:
        raise BuildError(
            f"--exclude-fidelity: unknown reason(s) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(REASONS)}"
        )


def check_out_path(out: Path, files: list[Path], specs: list[str]) -> None:
    """Refuse, before any work, an ``--out`` that is not a directory or overlaps an input."""
    if out.exists() and not out.is_dir():
        raise BuildError(f"--out {out} is a file, not a directory; choose a directory")
    try:
        out_dir.check_no_overlap(out, files, [Path(s) for s in specs if Path(s).is_dir()])
    except out_dir.OutDirError as exc:
        raise BuildError(str(exc)) from None


def make_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create --out {out}: {exc.strerror or exc}") from None


def _file_state(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def _check_inputs_unchanged(files: list[Path], states: list[tuple[int, int, int]]) -> None:
    """The manifest's hashes must describe the bytes the tasks read: an input appended to,
    rewritten or replaced since the build hashed it fails the build."""
    for f, state in zip(files, states):
        try:
            now = _file_state(f)
        except FileNotFoundError:
            now = None
        if now != state:
            raise BuildError(
                f"input {f} changed while the build read it (its hash no longer describes "
                "what was read); rerun once it is complete"
            )


def _refuse_without_outcomes(tasks: list[Task]) -> None:
    """An RL build needs an outcome per rollout. When every input is in a format whose
    logs never record one (``Reader.records_outcomes``) and no --rewards is given, every
    rollout would be quarantined: say so before reading anything (it used to take a full
    read of the inputs to find out)."""
    from pipeline.readers import REGISTRY

    formats = {t.format for t in tasks}
    readers = [REGISTRY.get(f) for f in formats]
    if not tasks or any(r is None or r.records_outcomes for r in readers):
        return
    names = ", ".join(sorted(formats))
    raise BuildError(
        f"{names} logs record no outcome, so an RL build needs --rewards FILE (CSV or JSONL: "
        "rollout_id or session_id, reward; docs/readers.md) — or build SFT data with seam build-sft"
    )


def _check_reads(
    files: list[Path], digests: list[tuple[str, list[str]]], results: list[TaskResult], fed: dict
) -> None:
    """Every input block the tasks (and the feeder) read is the block the build hashed
    first, and an input whose blocks were not all read through ``read_hash`` still has
    its first hash: else the input changed while the build read it, and the build fails
    before it publishes (``pipeline/sources/read_hash.py``)."""
    read: dict[str, dict[int, set[str]]] = {}
    for log in [fed, *(r.reads or {} for r in results)]:
        for name, blocks in log.items():
            into = read.setdefault(os.path.realpath(name), {})
            for i, digest in blocks.items():
                into.setdefault(int(i), set()).add(digest)
    for f, (whole, hashed) in zip(files, digests):
        blocks = read.get(os.path.realpath(f), {})
        changed = changed_blocks(blocks, hashed)
        where = f"bytes {changed[0] * BLOCK:,}+" if changed else ""
        if not changed and len(blocks) < len(hashed):
            # Not every block came through read_hash (Parquet read by Arrow, a reader's
            # own open, a read that stopped early): the file is hashed again.
            changed = [0] if file_sha256(f) != whole else []
            where = "its sha256"
        if changed:
            raise BuildError(
                f"input {f} changed while the build read it ({where} differ from what the "
                "build hashed first); nothing was published: rerun once it is complete"
            )


def _run_build(
    config: BuildConfig,
    command: str,
    files: list[Path],
    digests: list,
    states: list,
    start: tuple[float, float],
) -> BuildResult:
    from pipeline.build.progress import task_progress

    chunk_bytes = config.chunk_bytes
    if chunk_bytes is None:
        chunk_bytes = auto_chunk_bytes(files)
        config = dataclasses.replace(config, chunk_bytes=chunk_bytes)
    tok_info = _tokenizer_info(config)
    if config.rewards:
        from pipeline.readers.rewards import RewardsError, load_rewards

        try:
            load_rewards(Path(config.rewards))  # fail fast, before any work
        except RewardsError as exc:
            raise BuildError(str(exc)) from None
    tasks = plan_tasks(files, config.format, chunk_bytes, walked_files(config.inputs))
    config.read_context().check_readers(t.format for t in tasks)
    if config.requires_outcome() and not config.rewards:
        _refuse_without_outcomes(tasks)
    # "from_out": the input relative to the output directory, so verify and show find
    # it from anywhere while the two keep their places (``path`` is as given, relative to
    # the directory the build ran in).
    out_at = Path(config.out).resolve()
    inputs = [
        {
            "path": str(f),
            "from_out": os.path.relpath(Path(f).resolve(), out_at),
            "sha256": d.result()[0],
            "bytes": f.stat().st_size,
        }
        for f, d in zip(files, digests)
    ]
    fp_source = json.dumps(
        {
            "config": config.fingerprint_config(),
            # What the tokenizer is (its hashes), not where this machine keeps it: a cache
            # folder elsewhere ($SEAM_CACHE_DIR, another HOME) is the same build.
            "tokenizer": {k: v for k, v in tok_info.items() if k != "name_or_path"},
            "inputs": [i["sha256"] for i in inputs],
            "version": __version__,
        },
        sort_keys=True,
    )
    fingerprint = hashlib.sha256(fp_source.encode()).hexdigest()
    out = Path(config.out)
    make_out_dir(out)
    with OutputLock(out):
        if _check_out_dir(out, fingerprint, config.overwrite):
            manifest = Manifest.read(out)
            return BuildResult(
                out,
                manifest.shards,
                Counter(manifest.counts),
                Counter(manifest.seams),
                Counter(manifest.skipped),
                manifest.per_file,
                manifest.groups_of_one,
                manifest.as_dict(),
                up_to_date=True,
            )
        parts = out / ".parts"
        stamp = parts / "fingerprint"
        if parts.exists() and (not stamp.exists() or stamp.read_text() != fingerprint):
            shutil.rmtree(parts)
        parts.mkdir(exist_ok=True)
        stamp.write_text(fingerprint)
        _remove_temporaries(out)
        # A task is done when all three of its files are there (a kill while .parts was
        # being removed can leave a marker without its part).
        finished = {
            t.index: _finished(part_paths(config.out, t.index)[2])
            for t in tasks
            if all(p.exists() for p in part_paths(config.out, t.index))
        }
        done = {i: r for i, r in finished.items() if r is not None}
        resumed = len(done)
        worker_times, build_times = StepTimes(), StepTimes()
        # From the start: inputs resolved and hashed, tokenizer loaded, tasks planned.
        build_times.add_since("plan", start)
        todo = [t for t in tasks if t.index not in done]
        wconf = config.worker_config(len(tasks))
        tasks_start = StepTimes.clock()
        # The build's engine, through the executor protocol (``pipeline/build/executor.py``):
        # the tasks submitted before the progress bar starts its thread (a local engine
        # forks its workers there), their results in task order, shut down on every way
        # out (cancelled on a failure or an interrupt).
        with (
            recording() as fed,  # the compressed ranges this process reads for the workers
            running(ENGINES[config.engine].start(wconf, config)) as executor,
        ):
            executor.submit(todo)
            with task_progress(config.progress, len(tasks), resumed) as advance:
                for finished_task in executor.results():
                    done[finished_task.task] = finished_task
                    worker_times.merge(finished_task.timings)
                    advance(finished_task)
        # The build process's wait for the workers (elapsed; their work: worker_times).
        build_times.add_since("tasks", tasks_start)
        results = [done[t.index] for t in tasks]
        with build_times.step("check reads"):
            _check_inputs_unchanged(files, states)
            _check_reads(files, [d.result() for d in digests], results, fed)
        result = _finalize(config, out, tasks, results, tok_info, inputs, fingerprint, command)
        result.worker_times = worker_times
        result.build_times = build_times.merge(result.build_times)
        return result


def _finished(marker: Path) -> TaskResult | None:
    """A finished task's result from its marker; None for a marker an older seam wrote
    (without the rollout list duplicates are found by): that task runs again."""
    try:
        return TaskResult.from_json(marker.read_text())
    except TypeError:
        return None


def _finalize(config, out, tasks, results, tok_info, inputs, fingerprint, command) -> BuildResult:
    """The build's second stage (``pipeline/build/finalize.py``): its steps, in order."""
    f = Finalizing(
        config,
        out,
        [t.index for t in tasks],
        results,
        {"command": command, "fingerprint": fingerprint, "tokenizer": tok_info, "inputs": inputs},
    )
    stats, times = run_final_steps(f, final_steps(config))
    s = f.stats
    result = BuildResult(
        out,
        list(f.shard_sha256),
        s.counts,
        s.seams,
        s.skipped,
        s.per_file,
        f.groups_of_one,
        f.manifest,
    )
    result.build_times = times
    result.finalize_stats = stats
    return result
