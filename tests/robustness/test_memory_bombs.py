"""Small hostile inputs cannot exhaust memory: a few KB of ``.zst`` holding a 1 GiB line,
compressed junk lines that would fill the quarantine with gigabytes, and one 50 MB tool
output are each quarantined (the limit named) while the rest of the build goes on, and
the whole build, workers included, stays under a generous 1.5 GB peak RSS (measured by
the kernel for the build process and its reaped children, from a small launcher: a
child forked from pytest would start its count at pytest's own size)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

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
    command = [*SEAM, "build-rl", str(inputs), "--out", "out", "--workers", "2", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, *command],
        cwd=tmp_path,
        env=seam_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    peak_kb = int(done.stdout.split()[-1])
    assert peak_kb < RSS_CAP_KB, f"peak RSS {peak_kb / 1e6:.2f} GB"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["accepted"] == 4  # before/after each bomb
    quarantine = [json.loads(q) for q in (tmp_path / "out" / "quarantine.jsonl").open()]
    reasons = {q["file"].rsplit("/", 1)[1]: q["reason"] for q in quarantine}
    assert "max_line_bytes" in reasons["a_huge_line.jsonl.zst"]
    assert "max_message_bytes" in reasons["c_big_record.jsonl"]
    assert sum(q["file"].endswith("b_junk.jsonl.zst") for q in quarantine) == 300
    # 300 MiB of junk text, but the quarantine's raw copies are bounded (64 MiB).
    assert (tmp_path / "out" / "quarantine.jsonl").stat().st_size < 80 * MIB
