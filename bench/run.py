"""seam's benchmarks: ratios measured in one run on the same input (``make bench``).

Machines are noisy, so every number that is judged is a ratio of two timings taken
here, on the same input, in the same run; the two sides of a ratio are run alternately
``--repeats`` times and the fastest run of each is kept. Inputs are simulated here with
a seed the embedded sample was not made with (held out), and never replicated: copies
of the same text would flatter a build that remembers encoded text.

1. build-rl on text (no logged ids) vs the distinct-text bound (``bound.py``): the fast
   tokenizer encoding each distinct text of the input once (by content), plus writing
   the build's shards once; with the build's seconds per step (``--timings``);
2. seam's segment + mask stage vs the naive per-prefix baseline (``naive_baseline.py``)
   on append-only rollouts of 25/50/100/200 calls;
3. the token-in/token-out path: tokens per second on one core;
4. scaling: 1× vs 8× input (time ratio and peak RSS), 2 workers vs 1;
5. calls per segment: the build stage on one rollout of 1 k vs 10 k calls in one
   segment (time ratio; linear is ≤ 10×, a cost quadratic in calls is ~100×);
6. the Ray engine vs the local engine;
7. ``seam gateway`` at 1/8/64/256 sessions, engine instant or 200 ms per call: added
   latency (median, p99), calls/s ratio, CPU per call, log bytes per call vs history.

Prints a table and writes ``out/bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 3  # runs of each side of a ratio; the fastest counts (--repeats)
sys.path.insert(0, str(ROOT))

from bench.gateway_overhead import bench_gateway  # noqa: E402
from bench.inputs import append_only, text_only, token_logged  # noqa: E402
from bench.naive_baseline import naive_masks  # noqa: E402
from pipeline.sources.canonical_io import iter_canonical_records, write_canonical_jsonl  # noqa: E402
from schemas.rollout import Rollout  # noqa: E402


def load_sample(path: Path, limit: int | None) -> list:
    rollouts = [r for _, r in iter_canonical_records(path) if not isinstance(r, str)]
    return rollouts[:limit] if limit else rollouts


def seam_build(
    inputs: list[Path], out: Path, workers: int, engine: str = "local", timings: bool = False
) -> tuple:
    """Run ``seam build-rl`` as a subprocess: wall seconds, peak RSS (MB) of the build's
    processes, and the manifest; with ``timings``, also its seconds per step
    (``--timings``, written next to ``out``)."""
    shutil.rmtree(out, ignore_errors=True)
    steps = out.with_name(out.name + "-timings.json")
    cmd = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "build-rl",
        *map(str, inputs),
        "--out",
        str(out),
        "--workers",
        str(workers),
        "--no-progress",
        "--engine",
        engine,
        *(["--timings", str(steps)] if timings else []),
    ]
    # A fresh parent per build, so the peak RSS it reports is this build's alone.
    wrapper = [sys.executable, "-c", _MEASURE, *cmd]
    start = time.perf_counter()
    proc = subprocess.run(wrapper, cwd=ROOT, capture_output=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"build failed: {proc.stderr.decode()[-2000:]}")
    peak_mb = int(proc.stdout.decode().split()[-1]) / 1024
    manifest = json.loads((out / "manifest.json").read_text())
    if timings:
        return wall, int(peak_mb), manifest, json.loads(steps.read_text())
    return wall, int(peak_mb), manifest


_MEASURE = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(rc)\n"
)


def on_one_core(function: str, *paths: Path, threads: int = 1) -> list[float]:
    """Run ``bench.run.<function>(*paths)`` in a child process whose Rust tokenizer
    uses ``threads`` threads (one: one core), and return the numbers it prints.

    The bound encodes on Rayon's worker threads, the build's stage on its own helper
    thread (``worker.run_task``): both off the main thread, whose malloc arena is slower."""
    code = (
        f"import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; from bench.run import {function}; "
        f"r = {function}(*map(Path, sys.argv[2:])); print(*(r if isinstance(r, tuple) else (r,)))"
    )
    rayon = "true" if function.startswith("distinct_") else "false"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": rayon, "RAYON_NUM_THREADS": str(threads)}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), *map(str, paths)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"{function} failed: {proc.stderr[-2000:]}")
    counts = {"distinct_text_bound": 4, "distinct_piece_tokenize": 4}
    numbers = proc.stdout.split()[-counts.get(function, 1) :]
    return [float(x) for x in numbers]


def stage_seconds(src: Path, out: Path) -> float:
    """Wall seconds of the build's per-task stage function on the whole file, in this
    process set up as a build worker (tokenizer already loaded): parse, validate, seams,
    masks, rows, part file."""
    from pipeline.build.run import BuildConfig
    from pipeline.build.worker import run_task, segmenter_for, worker_process_setup
    from pipeline.sources.files import Task

    worker_process_setup()
    config = BuildConfig(inputs=[], out=str(out)).worker_config(1)
    segmenter_for(config)
    start = time.perf_counter()
    run_task(Task(0, str(src), "canonical"), config)
    return time.perf_counter() - start


def fastest(*runs):
    """Run each zero-argument callable ``REPEATS`` times, alternating; the fastest result
    of each (results are tuples whose first item is seconds, or seconds)."""
    results = [[] for _ in runs]
    for _ in range(REPEATS):
        for out, run in zip(results, runs):
            out.append(run())
    key = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731
    return [min(out, key=key) for out in results]


def distinct_text_bound(src: Path, out: Path) -> tuple[float, float, int, float]:
    """``bound.py``'s bound for the build of ``src`` into ``out``: (tokenize seconds,
    write seconds, tokens, CPU seconds of both), in a child process (``on_one_core``
    sets its threads)."""
    from bench.bound import distinct_texts, tokenize_seconds, write_seconds

    texts = distinct_texts(src)
    cpu = time.process_time()
    seconds, tokens = tokenize_seconds(texts)
    write = write_seconds(out, int(os.environ.get("RAYON_NUM_THREADS", "1")))
    return seconds, write, tokens, time.process_time() - cpu


def distinct_piece_tokenize(src: Path) -> tuple[float, int, float, float]:
    """The tokenizing half of ``bound.distinct_pieces``' bound for ``src``: (seconds,
    tokens, CPU seconds, ``bound.piece_share`` of the input); its write half is the
    distinct-text bound's."""
    from bench.bound import distinct_pieces, distinct_texts, piece_share, tokenize_seconds

    texts = distinct_texts(src)
    pieces = distinct_pieces(texts)
    cpu = time.process_time()
    seconds, tokens = tokenize_seconds(pieces)
    return seconds, tokens, time.process_time() - cpu, piece_share(texts, pieces)


def build_and_bounds(src: Path, out: Path, workers: int) -> list:
    """``seam build-rl`` of ``src`` into ``out`` (``seam_build`` with timings), the
    distinct-text bound and the distinct-piece tokenizing, alternating (``fastest``)."""
    return fastest(
        lambda: seam_build([src], out, workers, timings=True),
        lambda: on_one_core("distinct_text_bound", src, out, threads=workers),
        lambda: on_one_core("distinct_piece_tokenize", src, threads=workers),
    )


def bench_text_vs_bound(held_out: list, work: Path, workers: int) -> dict:
    src = work / "text.jsonl"
    write_canonical_jsonl(text_only(held_out), src)
    (wall, _, manifest, steps), (tokenize, write, tokens, bound_cpu), piece = build_and_bounds(
        src, work / "text-out", workers
    )
    bound = tokenize + write
    piece_bound = piece[0] + write
    build_cpu = sum(s["cpu_s"] for s in steps["steps"].values())
    # One core each, on the first quarter (the same comparison at a quarter of the time).
    quarter = work / "text-quarter.jsonl"
    write_canonical_jsonl(text_only(held_out[: max(1, len(held_out) // 4)]), quarter)
    seam_build([quarter], work / "quarter-out", workers)
    stage, bound_one_core = fastest(
        lambda: on_one_core("stage_seconds", quarter, work / "text-stage")[0],
        lambda: sum(on_one_core("distinct_text_bound", quarter, work / "quarter-out")[:2]),
    )
    return {
        "rollouts": manifest["counts"]["accepted"],
        "tokens_written": manifest["counts"]["tokens"],
        "distinct_text_tokens": int(tokens),
        "workers": workers,
        "repeats": REPEATS,
        "build_wall_s": round(wall, 2),
        "bound_tokenize_s": round(tokenize, 2),
        "bound_write_s": round(write, 2),
        "bound_s": round(bound, 2),
        "ratio_end_to_end": round(bound / wall, 2),
        # CPU seconds of both sides (of the fastest runs): on a loaded machine the wall
        # clock measures the neighbours; the build's is every step's, workers and build.
        "build_cpu_s": round(build_cpu, 1),
        "bound_cpu_s": round(bound_cpu, 1),
        "ratio_cpu": round(bound_cpu / build_cpu, 2),
        # The distinct-text bound with the build's reuse of repeated stretches inside
        # texts (``bound.distinct_pieces``): the ratio to it is the build's overhead alone.
        "piece_bound_s": round(piece_bound, 2),
        "piece_bound_tokens": int(piece[1]),
        "ratio_piece_bound": round(piece_bound / wall, 2),
        "piece_share": round(piece[3], 3),
        "steps": steps,
        "one_core_rollouts": max(1, len(held_out) // 4),
        "stage_one_core_s": round(stage, 2),
        "bound_one_core_s": round(bound_one_core, 2),
        "ratio_one_core": round(bound_one_core / stage, 2),
        "goal": ">= 0.9",
    }


def real_session_dirs() -> list[Path]:
    """The real sessions the tests read (``SEAM_REALWORLD_DIR``, ``SEAM_REALWORLD_NEW_DIR``)."""
    dirs = (os.environ.get(v) for v in ("SEAM_REALWORLD_DIR", "SEAM_REALWORLD_NEW_DIR"))
    return [Path(d) for d in dirs if d and Path(d).is_dir()]


def bench_real_sessions(work: Path, workers: int) -> dict | None:
    """The distinct-text bound against the build on the real sessions of
    ``real_session_dirs()`` (None when there are none), beside the simulated input's row:
    the bench input is simulated, and how much a build gains from reusing stretches
    repeated inside texts depends on how much its input repeats. The sessions are read by
    seam's readers into canonical JSONL (rewards 0: they record none) and built as text.
    They are small (seconds), so the build's fixed costs (start-up, tokenizer load) weigh
    more than at 2,000 rollouts; ``piece_share`` (``bound.piece_share``) compares the
    inputs without that."""
    from pipeline.inspect.verify import iter_input_records

    dirs = real_session_dirs()
    if not dirs:
        return None
    files = sorted(p for d in dirs for p in d.rglob("*") if p.is_file() and p.suffix != ".md")
    rollouts, seen = [], set()
    for _, _, rollout in iter_input_records(files):
        if isinstance(rollout, Rollout) and rollout.rollout_id not in seen:
            seen.add(rollout.rollout_id)
            reward = 0.0 if rollout.reward is None else rollout.reward
            rollouts.append(rollout.model_copy(update={"reward": reward}))
    src = work / "real.jsonl"
    write_canonical_jsonl(text_only(rollouts), src)
    (wall, _, manifest, steps), (tokenize, write, _, bound_cpu), piece = build_and_bounds(
        src, work / "real-out", workers
    )
    build_cpu = sum(s["cpu_s"] for s in steps["steps"].values())
    return {
        "dirs": [str(d) for d in dirs],
        "rollouts": manifest["counts"]["accepted"],
        "tokens_written": manifest["counts"]["tokens"],
        "build_wall_s": round(wall, 2),
        "bound_s": round(tokenize + write, 2),
        "ratio_end_to_end": round((tokenize + write) / wall, 2),
        "build_tokenize_cpu_s": round(steps["steps"]["tokenize"]["cpu_s"], 2),
        "ratio_cpu": round(bound_cpu / build_cpu, 2),
        "piece_bound_s": round(piece[0] + write, 2),
        "ratio_piece_bound": round((piece[0] + write) / wall, 2),
        "piece_share": round(piece[3], 3),
    }


def bench_naive(sample, sizes: list[int], counts: dict[int, int]) -> dict:
    from pipeline.core.render import ChatRenderer
    from pipeline.core.rows import RowOptions, masked_segments
    from pipeline.core.segment import Segmenter
    from pipeline.core.tokenizer import load_build_tokenizer, load_tokenizer

    segmenter = Segmenter(ChatRenderer(load_build_tokenizer()))
    hf = load_tokenizer()
    rows = {}
    for calls in sizes:
        items = append_only(sample, calls, counts.get(calls, 1))
        # These rollouts are stitched from one pool of steps: forget encoded text between
        # rollouts, so that seam does not profit from the repetition the baseline pays for.
        seam_s = 0.0
        for r in items:
            segmenter.renderer.forget()
            start = time.perf_counter()
            masked_segments(r, segmenter, RowOptions())
            seam_s += time.perf_counter() - start
        seam_s /= len(items)
        start = time.perf_counter()
        for r in items:
            naive_masks(r, hf)
        naive_s = (time.perf_counter() - start) / len(items)
        rows[calls] = {
            "seam_ms_per_rollout": round(seam_s * 1000, 1),
            "naive_ms_per_rollout": round(naive_s * 1000, 1),
            "speedup": round(naive_s / seam_s, 1),
        }
    return rows


def bench_tito(sample, work: Path) -> dict:
    """Rollouts whose every call logged prompt and output ids: never rendered, never
    tokenized. Timed as the stage function on one core."""
    from pipeline.core.render import ChatRenderer
    from pipeline.core.tokenizer import load_build_tokenizer

    logged = token_logged(sample, ChatRenderer(load_build_tokenizer()))
    src = work / "tito.jsonl"
    write_canonical_jsonl(logged, src)
    read = sum(len(c.prompt_ids) + len(c.output_ids) for r in logged for c in r.calls())
    seconds = on_one_core("stage_seconds", src, work / "tito-stage")[0]
    import pyarrow.feather as feather

    written = feather.read_table(
        work / "tito-stage" / ".parts" / "part-000000.arrow", columns=["num_tokens"]
    )
    written = int(sum(written["num_tokens"].to_pylist()))
    return {
        "rollouts": len(logged),
        "logged_ids_read": read,
        "tokens_written": written,
        "seconds": round(seconds, 2),
        "logged_ids_per_s_per_core": int(read / seconds),
        "tokens_written_per_s_per_core": int(written / seconds),
        "goal": ">= 3M/s/core",
    }


def bench_scaling(held_out: list, work: Path) -> dict:
    """1× = the first eighth of the held-out rollouts, 8× = all of them (distinct
    rollouts, not copies); 2 workers vs 1 on the 8× input."""
    one, eight = work / "x1.jsonl", work / "x8.jsonl"
    write_canonical_jsonl(held_out[: len(held_out) // 8], one)
    write_canonical_jsonl(held_out, eight)
    (t1, rss1, _), (t8, rss8, _) = fastest(
        lambda: seam_build([one], work / "x1-out", 1),
        lambda: seam_build([eight], work / "x8-out", 1),
    )
    (t8w1, _, _), (t8w2, _, _) = fastest(
        lambda: seam_build([eight], work / "x8w1-out", 1),
        lambda: seam_build([eight], work / "x8w2-out", 2),
    )
    return {
        "rollouts_1x": len(held_out) // 8,
        "rollouts_8x": len(held_out),
        "repeats": REPEATS,
        "time_1x_s": round(t1, 1),
        "time_8x_s": round(t8, 1),
        "time_ratio_8x": round(t8 / t1, 2),
        "peak_rss_1x_mb": rss1,
        "peak_rss_8x_mb": rss8,
        "time_8x_1_worker_s": round(t8w1, 1),
        "time_8x_2_workers_s": round(t8w2, 1),
        "speedup_2_workers": round(t8w1 / t8w2, 2),
        "goals": "ratio <= 8.5, rss <= 1500 MB, speedup >= 1.8",
    }


def bench_calls_per_segment(sample, work: Path, sizes: tuple[int, int]) -> dict:
    """The build stage, one core, on one append-only rollout (one segment) of each size."""
    timings = []
    for calls in sizes:
        src = work / f"calls-{calls}.jsonl"
        write_canonical_jsonl(append_only(sample, calls, 1), src)
        timings.append(lambda src=src: on_one_core("stage_seconds", src, src.with_suffix(""))[0])
    small, big = fastest(*timings)
    return {
        "calls": list(sizes),
        "stage_s": [round(small, 2), round(big, 2)],
        "time_ratio": round(big / small, 2),
        "goal": f"<= {sizes[1] // sizes[0]}",
    }


def simulate_held_out(n: int, work: Path) -> list:
    """``n`` fresh rollouts from the simulator, seeded apart from the embedded sample."""
    path = work / "held-out.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "simulate",
        "--n",
        str(n),
        "--seed",
        "bench-held-out",
        "--out",
        str(path),
        "--no-progress",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True)
    if proc.returncode:
        raise SystemExit(f"simulate failed: {proc.stderr.decode()[-2000:]}")
    return load_sample(path, None)


def bench_ray(sample, work: Path) -> dict:
    try:
        import ray  # noqa: F401
    except ImportError:
        return {"skipped": "ray is not installed (pip install 'seam-rl[ray]')"}
    src = work / "ray.jsonl"
    write_canonical_jsonl(sample, src)
    local, _, _ = seam_build([src], work / "ray-local", 2)
    remote, _, _ = seam_build([src], work / "ray-ray", 2, engine="ray")
    same = all(
        (work / "ray-local" / s).read_bytes() == (work / "ray-ray" / s).read_bytes()
        for s in json.loads((work / "ray-local" / "manifest.json").read_text())["shards"]
    )
    return {
        "local_s": round(local, 1),
        "ray_s": round(remote, 1),
        "overhead_s": round(remote - local, 1),
        "identical_output": same,
    }


def print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="seam benchmarks (ratios measured in this run)")
    table.add_column("benchmark")
    table.add_column("result", justify="right")
    table.add_column("goal")
    t = results.get("text_vs_distinct_text_bound")
    if t:
        table.add_row(
            f"distinct-text bound / build-rl from text, end to end, {t['rollouts']:,} rollouts "
            f"({t['workers']} workers)",
            f"{t['ratio_end_to_end']} ({t['bound_s']} vs {t['build_wall_s']} s)",
            t["goal"],
        )
        table.add_row(
            "  the same in CPU seconds (both sides, all threads and processes)",
            f"{t['ratio_cpu']} ({t['bound_cpu_s']} vs {t['build_cpu_s']} s)",
            "reported",
        )
        table.add_row(
            "distinct-piece bound / build-rl (both reuse repeated stretches inside texts: "
            "the build's overhead alone)",
            f"{t['ratio_piece_bound']} ({t['piece_bound_s']} vs {t['build_wall_s']} s)",
            "reported",
        )
        table.add_row(
            "  distinct piece / distinct text characters of the input (one minus it: what "
            "the reuse can skip)",
            f"{t['piece_share']}",
            "reported",
        )
        table.add_row(
            "distinct-text bound / build stage, one core",
            f"{t['ratio_one_core']} ({t['bound_one_core_s']} vs {t['stage_one_core_s']} s)",
            "reported",
        )
    r = results.get("real_sessions_vs_distinct_text_bound")
    if r:
        table.add_row(
            f"the real sessions of SEAM_REALWORLD_DIR(s), {r['rollouts']:,} rollouts: "
            "distinct-text bound / build-rl (small: start-up weighs)",
            f"{r['ratio_end_to_end']} ({r['bound_s']} vs {r['build_wall_s']} s)",
            "reported",
        )
        table.add_row(
            "  the same, distinct-piece bound / build-rl; distinct piece / text characters",
            f"{r['ratio_piece_bound']}; {r['piece_share']}",
            "reported",
        )
    if "naive_baseline" not in results:  # --only text
        Console().print(table)
        return
    for calls, row in results["naive_baseline"].items():
        table.add_row(
            f"speedup vs per-prefix baseline, {calls} calls",
            f"{row['speedup']}× ({row['seam_ms_per_rollout']} vs {row['naive_ms_per_rollout']} ms)",
            ">= 20× at 100 calls",
        )
    t = results["token_in_token_out"]
    table.add_row(
        "token-in/token-out, logged ids read /s/core",
        f"{t['logged_ids_per_s_per_core']:,}",
        t["goal"],
    )
    table.add_row(
        "token-in/token-out, tokens written /s/core", f"{t['tokens_written_per_s_per_core']:,}", ""
    )
    s = results["scaling"]
    table.add_row("8× input / 1× input time", f"{s['time_ratio_8x']}", "<= 8.5")
    table.add_row(
        "peak RSS 1× / 8×", f"{s['peak_rss_1x_mb']} / {s['peak_rss_8x_mb']} MB", "flat, <= 1500 MB"
    )
    table.add_row("2 workers speedup", f"{s['speedup_2_workers']}×", ">= 1.8×")
    c = results["calls_per_segment"]
    table.add_row(
        f"{c['calls'][1]:,} / {c['calls'][0]:,} calls in one segment, stage time",
        f"{c['time_ratio']} ({c['stage_s'][1]} vs {c['stage_s'][0]} s)",
        c["goal"],
    )
    r = results["ray"]
    table.add_row(
        "ray engine overhead",
        "skipped"
        if "skipped" in r
        else f"{r['overhead_s']} s (identical: {r['identical_output']})",
        "reported",
    )
    goals = {  # issue 26's targets, for the sessions and engine they are set for
        ("0 ms per call", "1"): "added median ≤ 1 ms",
        ("0 ms per call", "64"): "calls/s ratio ≥ 0.7",
        ("200 ms per call", "256"): "median ratio ≤ 1.05",
    }
    for engine, rows in results["gateway"]["engines"].items():
        for sessions, g in rows.items():
            table.add_row(
                f"gateway, engine {engine}, {sessions} sessions: added median / p99, "
                "calls/s ratio, CPU per call",
                f"+{g['added_median_ms']} / +{g['added_p99_ms']} ms, "
                f"{g['calls_per_s_ratio']}, {g['gateway_cpu_ms_per_call']} ms",
                goals.get((engine, sessions), "reported"),
            )
    for history, b in results["gateway"]["bytes_logged_per_call"].items():
        table.add_row(
            f"gateway log bytes per call at {history} (delta vs whole)",
            f"{b['delta_log_bytes_per_call']:,} vs {b['full_log_bytes_per_call']:,}",
            "reported",
        )
    Console().print(table)


def step_table(steps: dict):
    """The build's seconds per step (its ``--timings`` file) as a table."""
    from rich.table import Table

    table = Table(title=f"build-rl time per step ({steps['elapsed_s']} s elapsed)")
    for name in ("step", "where", "wall s", "CPU s"):
        table.add_column(name, justify="left" if name in ("step", "where") else "right")
    for name, s in steps["steps"].items():
        table.add_row(name, s["where"], f"{s['wall_s']:.2f}", f"{s['cpu_s']:.2f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", default=str(ROOT / "data" / "sample" / "rollouts.jsonl.zst"))
    parser.add_argument(
        "--quick", action="store_true", help="Small inputs (a smoke run, numbers not meaningful)."
    )
    parser.add_argument("--out", default=str(ROOT / "out" / "bench.json"))
    parser.add_argument(
        "--held-out",
        type=int,
        default=2000,
        help="Rollouts simulated for the build benchmarks (the bound uses all of them, "
        "scaling and Ray the first 1,024).",
    )
    parser.add_argument(
        "--only",
        choices=["text"],
        default=None,
        help="Run only this benchmark (text: build-rl vs the distinct-text bound).",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="Runs of each side of a ratio (the fastest counts)."
    )
    args = parser.parse_args()
    global REPEATS
    REPEATS = 1 if args.quick else args.repeats
    sample = load_sample(Path(args.sample), 16 if args.quick else None)
    workers = os.cpu_count() or 1
    sizes = [25, 50] if args.quick else [25, 50, 100, 200]
    counts = {25: 8, 50: 4, 100: 2, 200: 1}
    results = {"machine": {"cpus": workers, "python": sys.version.split()[0]}}
    with tempfile.TemporaryDirectory(prefix="seam-bench-") as tmp:
        work = Path(tmp)
        held_out = simulate_held_out(32 if args.quick else args.held_out, work)
        results["text_vs_distinct_text_bound"] = bench_text_vs_bound(held_out, work, workers)
        real = bench_real_sessions(work, workers)
        if real is not None:
            results["real_sessions_vs_distinct_text_bound"] = real
        if args.only == "text":
            return _report(results, args.out)
        held_out = held_out[:1024]
        results["naive_baseline"] = bench_naive(sample, sizes, counts)
        results["token_in_token_out"] = bench_tito(sample[: 8 if args.quick else 64], work)
        results["scaling"] = bench_scaling(held_out, work)
        results["calls_per_segment"] = bench_calls_per_segment(
            sample, work, (100, 1000) if args.quick else (1000, 10_000)
        )
        results["ray"] = bench_ray(held_out[: len(held_out) // 4], work)
    results["gateway"] = bench_gateway(quick=args.quick)
    _report(results, args.out)


def _report(results: dict, out: str) -> None:
    from rich.console import Console

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2))
    print_table(results)
    Console().print(step_table(results["text_vs_distinct_text_bound"]["steps"]))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
