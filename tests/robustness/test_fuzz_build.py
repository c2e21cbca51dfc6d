"""Fuzzing ``build-rl``: good rollouts mixed with every way a record or a file breaks.

Invariants, for any mix:
- no exception escapes the build;
- ``read = accepted + quarantined`` exactly, and ``quarantine.jsonl`` has one entry per
  quarantined record, pointing at its file and line;
- every good record's rows are the rows it gets when built alone with the other good
  records: a bad neighbour never moves a byte of them.

``SEAM_FUZZ_EXAMPLES`` scales the number of examples (``make fuzz``).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from pipeline.build.run import BuildConfig, run_build
from pipeline.sources.canonical_io import write_canonical_parquet
from schemas.rollout import Rollout
from tests.robustness.records import MUTATIONS, broken_line, fuzz_settings, good_record, line

TALLY: Counter = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_tally():
    yield
    print(
        f"\nfuzzed build-rl: {TALLY['records']} records ({TALLY['broken']} broken) in {TALLY['builds']} builds, "
        f"{TALLY['files']} damaged files"
    )


def build(inputs: list[Path], out: Path, fmt: str = "canonical"):
    TALLY["builds"] += 1
    return run_build(
        BuildConfig(
            inputs=[str(i) for i in inputs], out=str(out), format=fmt, workers=1, progress=False
        )
    )


def rows_of(out: Path, prefix: str = "good-") -> pa.Table:
    table = pq.read_table(sorted(out.glob("train-*.parquet")))
    return table.filter(pc.starts_with(table["rollout_id"], prefix))


def quarantine(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]


def assert_accounted(result, out: Path, read: int | None = None) -> None:
    c = result.counts
    assert c["read"] == c["accepted"] + c["quarantined"]
    if read is not None:
        assert c["read"] == read
    entries = quarantine(out)
    assert len(entries) == c["quarantined"]
    assert all(e["reason"] and e["file"] for e in entries)


@fuzz_settings(10)
@given(
    good=st.lists(st.integers(0, 2**32), min_size=1, max_size=4),
    bad=st.lists(
        st.tuples(st.integers(0, 2**32), st.integers(0, len(MUTATIONS) - 1)), min_size=1, max_size=6
    ),
    order=st.randoms(use_true_random=False),
)
def test_bad_records_are_quarantined_and_never_move_a_byte_of_good_rows(
    tmp_path_factory, good, bad, order
):
    tmp = tmp_path_factory.mktemp("fuzz")
    good_lines = [
        line(good_record(random.Random(s), f"good-{i}", f"task-{i % 2}"))
        for i, s in enumerate(good)
    ]
    bad_lines = [
        broken_line(seed, m, f"bad-{i}", f"bad-task-{i}") for i, (seed, m) in enumerate(bad)
    ]
    mixed = list(good_lines)
    for b in bad_lines:
        mixed.insert(order.randint(0, len(mixed)), b)
    (tmp / "mixed.jsonl").write_bytes(b"\n".join(mixed) + b"\n")
    (tmp / "clean.jsonl").write_bytes(b"\n".join(good_lines) + b"\n")
    result = build([tmp / "mixed.jsonl"], tmp / "mixed")
    TALLY["records"] += len(mixed)
    TALLY["broken"] += len(bad_lines)
    assert_accounted(result, tmp / "mixed", read=len(mixed))
    assert result.counts["accepted"] >= len(good_lines)
    bad_line_numbers = {i + 1 for i, x in enumerate(mixed) if x in bad_lines}
    for entry in quarantine(tmp / "mixed"):
        assert entry["line"] in bad_line_numbers and entry["file"] == str(tmp / "mixed.jsonl")
    clean = build([tmp / "clean.jsonl"], tmp / "clean")
    assert clean.counts["accepted"] == len(good_lines)
    assert rows_of(tmp / "mixed").equals(rows_of(tmp / "clean"))


def _good_lines(seed: int, n: int, prefix: str = "good-") -> list[bytes]:
    return [
        line(good_record(random.Random(seed * 1000 + i), f"{prefix}{i}", f"{prefix}task-{i % 3}"))
        for i in range(n)
    ]


def test_damaged_files_in_a_directory_are_quarantined_beside_good_ones(tmp_path):
    """Empty, binary, cut, corrupt and oddly terminated files, found by walking a directory."""
    src = tmp_path / "in"
    src.mkdir()
    rng = random.Random(7)
    good = _good_lines(1, 9)
    (src / "a-good.jsonl").write_bytes(b"\n".join(good[:3]) + b"\n")
    (src / "b-crlf.jsonl").write_bytes(b"\r\n".join(good[3:5]) + b"\r\n")
    (src / "c-no-final-newline.jsonl").write_bytes(good[5])
    huge = {
        "rollout_id": "bad-huge",
        "task_id": "t",
        "source": "s",
        "events": [{"type": "teleport", "payload": "x" * (10 << 20)}],
    }
    (src / "d-10mb-line.jsonl").write_bytes(
        good[6] + b"\n" + json.dumps(huge).encode() + b"\n" + good[7] + b"\n"
    )
    (src / "e-empty.jsonl").write_bytes(b"")
    (src / "f-blank-lines.jsonl").write_bytes(b"\n \n\t\n")
    (src / "g-binary.jsonl").write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    (src / "h-nul-bytes.jsonl").write_bytes(good[8] + b"\n\x00\x00\x00\n")
    cut = gzip.compress(b"\n".join(_good_lines(2, 30, "cut-gz-")) + b"\n")
    (src / "i-cut.jsonl.gz").write_bytes(cut[: len(cut) // 2])
    frame = zstandard.ZstdCompressor().compress(b"\n".join(_good_lines(3, 4, "cut-zst-")) + b"\n")
    (src / "j-two-frames-cut.jsonl.zst").write_bytes(frame + frame[: len(frame) // 2])
    (src / "k-not-zstd.jsonl.zst").write_bytes(
        b"\x28\xb5\x2f\xfd" + bytes(rng.randrange(256) for _ in range(300))
    )
    (src / "l-garbage.parquet").write_bytes(
        b"PAR1" + bytes(rng.randrange(256) for _ in range(500)) + b"PAR1"
    )
    whole = tmp_path / "whole.parquet"
    write_canonical_parquet(
        [Rollout.model_validate(json.loads(x)) for x in _good_lines(4, 3, "cut-parquet-")], whole
    )
    (src / "m-cut.parquet").write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    (src / "n-not-utf8.json").write_bytes(b'{"messages": "\xff\xfe"}')
    TALLY["files"] += 14
    result = build([src], tmp_path / "out", fmt="auto")
    assert_accounted(result, tmp_path / "out")
    entries = quarantine(tmp_path / "out")
    unusable = {Path(e["file"]).name for e in entries if e["line"] is None}
    assert {
        "e-empty.jsonl",
        "f-blank-lines.jsonl",
        "g-binary.jsonl",
        "i-cut.jsonl.gz",
        "j-two-frames-cut.jsonl.zst",
        "k-not-zstd.jsonl.zst",
        "l-garbage.parquet",
        "m-cut.parquet",
    } <= unusable
    (huge_entry,) = [e for e in entries if e["file"].endswith("d-10mb-line.jsonl")]
    assert huge_entry["line"] == 2 and len(huge_entry["raw"]) <= 1 << 20
    assert [e["line"] for e in entries if e["file"].endswith("h-nul-bytes.jsonl")] == [2]
    # What precedes the cut of a compressed file is kept (the whole first zstd frame).
    assert rows_of(tmp_path / "out", "cut-zst-")["rollout_id"].unique().to_pylist() == [
        f"cut-zst-{i}" for i in range(4)
    ]
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b"\n".join(good) + b"\n")
    alone = build([clean], tmp_path / "alone")
    assert alone.counts["accepted"] == 9
    assert rows_of(tmp_path / "out").equals(rows_of(tmp_path / "alone"))


@pytest.mark.skipif(
    not os.environ.get("SEAM_FUZZ_EXAMPLES"), reason="tokenizes 10 MB: runs under make fuzz"
)
def test_a_valid_10_mb_record_builds_like_any_other(tmp_path):
    record = good_record(random.Random(5), "good-huge", "t")
    # 10.8 MB in two messages of 5.4 MB: one message of 10.8 MB is over the default
    # per-message limit (--max-message-mb 8, pipeline/sources/limits.py) and is quarantined
    # by design (tests/robustness/test_memory_bombs.py); this record is within every limit.
    for role in ("system", "user"):
        next(e for e in record["events"] if e.get("role") == role)["content"] = (
            "lorem ipsum 12345 " * 300_000
        )
    huge = line(record)
    assert len(huge) > 10_000_000
    src = tmp_path / "huge.jsonl"
    src.write_bytes(b"\n".join([*_good_lines(6, 2), huge, *_good_lines(7, 2, 10)]) + b"\n")
    result = build([src], tmp_path / "out")
    assert result.counts["accepted"] == 5 and result.counts["quarantined"] == 0
    assert (
        max(
            pq.read_table(sorted((tmp_path / "out").glob("train-*.parquet")))[
                "num_tokens"
            ].to_pylist()
        )
        > 2_000_000
    )
