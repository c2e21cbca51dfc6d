"""Small hostile inputs cannot exhaust memory: a few KB of ``.zst`` holding a 1 GiB line,
compressed junk lines that would fill the quarantine with gigabytes, and one 50 MB tool
output are each quarantined (the limit named) while the rest of the build goes on, and
the whole build, workers included, stays under a generous 1.5 GB peak RSS (measured by
the kernel for the build process and its reaped children, from a small launcher: a
child forked from pytest would start its count at pytest's own size)."""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import time

import pytest
import zstandard

from tests.robustness.conftest import SEAM, seam_env
from tests.robustness.records import good_record, line

RSS_CAP_KB = 1_500_000  # 1.5 GB
# Runs a command and prints the largest peak RSS (KiB) of any process of its tree.
_LAUNCHER = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""
MIB = 1 << 20


def _good(rng: random.Random, rid: str) -> bytes:
    return line(good_record(rng, rid, "task")) + b"\n"


def _write_zst(path, pieces) -> int:
    """Stream-compress ``pieces`` (the test itself never holds the big data either)."""
    with open(path, "wb") as fh, zstandard.ZstdCompressor(level=3).stream_writer(fh) as out:
        for piece in pieces:
            out.write(piece)
    return path.stat().st_size


def _build_under_the_rss_cap(cwd, *args: str) -> None:
    """``seam build-rl ARGS --out out`` with two workers, from the launcher: it succeeds and
    no process of it peaks over ``RSS_CAP_KB``."""
    command = [*SEAM, "build-rl", *args, "--out", "out", "--workers", "2", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, *command],
        cwd=cwd,
        env=seam_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    peak_kb = int(done.stdout.split()[-1])
    assert peak_kb < RSS_CAP_KB, f"peak RSS {peak_kb / 1e6:.2f} GB"


@pytest.mark.slow
def test_bombs_are_quarantined_and_the_build_stays_under_the_rss_cap(tmp_path):
    rng = random.Random(7)
    inputs = tmp_path / "in"
    inputs.mkdir()
    one_gib_line = [
        _good(rng, "before-huge-line"),
        b'{"rollout_id": "huge", "pad": "',
        *(b"a" * MIB for _ in range(1024)),
        b'"}\n',
        _good(rng, "after-huge-line"),
    ]
    assert _write_zst(inputs / "a_huge_line.jsonl.zst", one_gib_line) < 64 << 10
    junk = [_good(rng, "before-junk"), *(b"\x7f" * MIB + b"\n" for _ in range(300))]
    assert _write_zst(inputs / "b_junk.jsonl.zst", junk) < 64 << 10
    big = json.loads(line(good_record(rng, "big-tool-output", "task")))
    tool = next(e for e in big["events"] if e.get("role") == "tool")
    tool["content"] = "x" * (50 * MIB)
    (inputs / "c_big_record.jsonl").write_bytes(
        json.dumps(big).encode() + b"\n" + _good(rng, "after-big")
    )
    _build_under_the_rss_cap(tmp_path, str(inputs))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["accepted"] == 4  # before/after each bomb
    quarantine = [json.loads(q) for q in (tmp_path / "out" / "quarantine.jsonl").open()]
    reasons = {q["file"].rsplit("/", 1)[1]: q["reason"] for q in quarantine}
    assert "max_line_bytes" in reasons["a_huge_line.jsonl.zst"]
    assert "max_message_bytes" in reasons["c_big_record.jsonl"]
    assert sum(q["file"].endswith("b_junk.jsonl.zst") for q in quarantine) == 300
    # 300 MiB of junk text, but the quarantine's raw copies are bounded (64 MiB).
    assert (tmp_path / "out" / "quarantine.jsonl").stat().st_size < 80 * MIB


@pytest.mark.slow
def test_a_flood_of_bad_lines_leaves_a_bounded_quarantine_with_an_exact_count(tmp_path):
    """A few hundred bytes of ``.jsonl.zst`` holding 30,000 ``{}`` lines (five million
    made a 754 MB quarantine in 4.5 minutes): the quarantine keeps a sample within its
    caps (entries and bytes), the manifest and the summary count every entry not
    written, and every line is still counted as quarantined."""
    rng = random.Random(3)
    flood = 30_000
    path = tmp_path / "flood.jsonl.zst"
    size = _write_zst(path, [_good(rng, "first"), b"{}\n" * flood, _good(rng, "last")])
    assert size < 4096
    args = [str(path), "--out", "out", "--no-progress", "--workers", "1", "--verify", "all"]
    caps = ["--max-quarantine-entries", "500", "--max-quarantine-mb", "0.0625"]  # 64 KiB
    started = time.monotonic()
    done = subprocess.run(
        [*SEAM, "build-rl", *args, *caps],
        cwd=tmp_path,
        env=seam_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 120
    out = tmp_path / "out"
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert (counts["read"], counts["accepted"], counts["quarantined"]) == (flood + 2, 2, flood)
    written = (out / "quarantine.jsonl").read_bytes()
    entries = written.count(b"\n")
    assert 0 < entries <= 500 and len(written) <= 64 << 10
    assert counts["quarantine_not_written"] == flood - entries  # exact
    sample = [json.loads(q) for q in written.splitlines()]
    assert [q["line"] for q in sample] == list(range(2, 2 + entries))  # the first ones
    assert (
        f"{flood - entries:,}" in done.stdout and "not written to quarantine.jsonl" in done.stdout
    )
    assert "verified 2 rollout(s)" in done.stdout


# Tokenizes a rollout of COUNT tool outputs of SIZE characters each (log-like text, or
# one base64 line each with KIND "base64") and prints the peak RSS (KiB) before and
# after: the growth is what tokenizing the rollout cost.
_TOKENIZE = """
import base64, os, random, resource, sys
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from pipeline.build.worker import segmenter_with
from schemas.rollout import Rollout
count, size = int(sys.argv[1]), int(sys.argv[2])
kind = sys.argv[3] if len(sys.argv) > 3 else "log"
segmenter = segmenter_with(None, None)
block = " ".join(f"line {i}: value = {i * 7919 % 1000} # é 中文" for i in range(4000)) + "\\n"
events = [{"type": "message", "id": "u", "role": "user", "content": "Read the logs."}]
for i in range(count):
    if kind == "base64":
        text = base64.b64encode(random.Random(i).randbytes(size * 3 // 4)).decode()
    else:
        text = (f"file {i}\\n" + block * (size // len(block) + 1))[:size]
    call = {"id": f"c{i}", "name": "read", "arguments": "{}"}
    events.append({"type": "message", "id": f"a{i}", "role": "assistant", "content": "", "tool_calls": [call]})
    events.append({"type": "message", "id": f"t{i}", "role": "tool", "content": text, "tool_call_id": f"c{i}"})
    del text
events.append({"type": "message", "id": "end", "role": "assistant", "content": "Done."})
rollout = Rollout.model_validate({"rollout_id": "r", "task_id": "t", "source": "s", "events": events})
del events
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
segments = segmenter.segments(rollout)
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, len(segments[0].tokens))
"""


@pytest.mark.slow
def test_a_rollout_of_many_large_messages_is_tokenized_in_bounded_memory(tmp_path):
    """Eight 512 KiB tool outputs in one rollout, tokenized a batch of at most 1 MiB at a
    time: the tokenizer's cost per character (~60 bytes kept per encoding, ~130 at its
    peak) is paid for one batch, not for the whole rollout at once (it was: ten 5 MB
    messages took 3.3 GB). Measured: the peak grows by ~30 MB (it grew by ~110 MB when
    the rollout was one batch)."""
    done = subprocess.run(
        [sys.executable, "-c", _TOKENIZE, "8", str(MIB // 2)],
        cwd=tmp_path,
        env=seam_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    before_kb, after_kb, tokens = map(int, done.stdout.split())
    assert tokens > 4 * MIB // 8  # every message was tokenized
    grown_mb = (after_kb - before_kb) / 1024
    assert grown_mb < 75, (
        f"tokenizing eight 512 KiB messages raised the peak RSS by {grown_mb:.0f} MB"
    )


def _five_mb_text(kind: str, i: int) -> str:
    """5 MiB of log-like text (~1.7 M tokens) or of one base64 line (~3.7 M tokens, the
    worst case tried: no newline, short pre-tokens)."""
    if kind == "base64":
        return base64.b64encode(random.Random(i).randbytes(5 * MIB * 3 // 4)).decode()
    block = " ".join(f"line {i}: value = {i * 7919 % 1000} # é" for i in range(4000)) + "\n"
    return (f"file {i}\n" + block * (5 * MIB // len(block) + 1))[: 5 * MIB]


def test_one_long_base64_message_is_tokenized_in_pieces_in_bounded_memory(tmp_path):
    """One 2 MiB base64 line (1.55 M tokens; the tokenizer's worst case tried, ~190 bytes
    per character at its peak when encoded whole) is encoded in pieces of 128 Ki
    characters at cuts proven to change no id (``pipeline/core/long_text.py``). Measured: the
    peak grows by ~23 MB (by ~190 MB when the message was encoded whole)."""
    done = subprocess.run(
        [sys.executable, "-c", _TOKENIZE, "1", str(2 * MIB), "base64"],
        cwd=tmp_path,
        env=seam_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    before_kb, after_kb, tokens = map(int, done.stdout.split())
    assert tokens > 1_500_000
    grown_mb = (after_kb - before_kb) / 1024
    assert grown_mb < 75, (
        f"tokenizing one 2 MiB base64 message raised the peak by {grown_mb:.0f} MB"
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("SEAM_FUZZ_EXAMPLES"),
    reason="tokenizes 50 MB (1-3 min): runs under make fuzz",
)
@pytest.mark.parametrize("kind", ["log", "base64"])
def test_a_build_of_ten_5_mb_messages_stays_under_the_rss_cap(tmp_path, kind):
    """The issue's case end to end: one rollout of ten 5 MB tool outputs, built with two
    workers, under 1.5 GB peak RSS for the build and its workers (was 3.3 GB; 1.26 GB
    log-like and 1.63 GB base64 before long texts were tokenized in pieces)."""
    events = [{"type": "message", "id": "u", "role": "user", "content": "Read the logs."}]
    for i in range(10):
        call = {"id": f"c{i}", "name": "read", "arguments": "{}"}
        events.append(
            {
                "type": "message",
                "id": f"a{i}",
                "role": "assistant",
                "content": "",
                "tool_calls": [call],
            }
        )
        events.append(
            {
                "type": "message",
                "id": f"t{i}",
                "role": "tool",
                "content": _five_mb_text(kind, i),
                "tool_call_id": f"c{i}",
            }
        )
    events.append({"type": "message", "id": "end", "role": "assistant", "content": "Done."})
    record = {"rollout_id": "r", "task_id": "t", "source": "s", "events": events, "reward": 1.0}
    (tmp_path / "big.jsonl").write_text(json.dumps(record, ensure_ascii=False) + "\n")
    del events, record
    _build_under_the_rss_cap(tmp_path, "big.jsonl", "--verify", "none")


def test_the_quarantine_caps_count_every_entry_they_leave_out(tmp_path):
    """Hand-checked: tasks keep their share (entries, bytes, raw text); the merge keeps
    the first entries of the build within its caps, duplicates' entries included, and
    counts the rest."""
    from pipeline.build.quarantine import Share, TaskQuarantine, merge_quarantine
    from pipeline.sources.limits import Limits

    limits = Limits(max_quarantine_entries=40, max_quarantine_raw_bytes=1 << 17)
    share = Share.of(limits, 2)
    assert (share.entries, share.raw_bytes) == (20, 1 << 16)  # 40 / 2 tasks; 128 KiB / 2
    parts = []
    for task in range(2):
        quarantine = TaskQuarantine(share)
        for n in range(30):
            quarantine.add({"file": f"f{task}", "line": n, "reason": "r"}, "x" * 5000)
        assert (len(quarantine.lines), quarantine.not_written) == (20, 10)
        # 65,536 bytes of raw text: the first 13 entries keep theirs, the others say so
        assert sum(b'"raw"' in q for q in quarantine.lines) == 13
        parts.append(tmp_path / f"part{task}")
        quarantine.write(parts[-1])
    dest = tmp_path / "quarantine.jsonl"
    duplicates = [b'{"reason": "duplicate"}\n'] * 3
    assert merge_quarantine(parts, dest, Limits(max_quarantine_entries=25), duplicates) == (25, 18)
    lines = [json.loads(q) for q in dest.read_text().splitlines()]
    assert [(q["file"], q["line"]) for q in lines] == [("f0", n) for n in range(20)] + [
        ("f1", n) for n in range(5)
    ]
    small = Limits(max_quarantine_bytes=3 * len(duplicates[0]))
    assert merge_quarantine([], dest, small, duplicates) == (3, 0)
    assert merge_quarantine([], dest, small, [*duplicates, b"{}\n"]) == (3, 1)
