"""Who can read a build: shards, manifest and card are created with the user's umask (a
trainer running as another user reads them under the usual 022), while the quarantine,
which holds raw session text, stays 0600 whatever the umask."""

from __future__ import annotations

import os
import random
import stat

import pytest

from pipeline.build.run import BuildConfig, run_build
from tests.robustness.records import broken_line, good_record, line


@pytest.fixture
def umask():
    """Set the process's umask for one test, restored after."""
    saved = os.umask(0o077)
    os.umask(saved)
    yield os.umask
    os.umask(saved)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    ("mask", "public"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"]
)
def test_outputs_follow_the_umask_and_the_quarantine_stays_private(tmp_path, umask, mask, public):
    rng = random.Random(1)
    src = tmp_path / "a.jsonl"
    records = [line(good_record(rng, f"r{i}", "task")) for i in range(2)]
    src.write_bytes(b"\n".join([*records, broken_line(0, 0, "bad", "bad-task")]) + b"\n")
    umask(mask)
    out = tmp_path / "out"
    result = run_build(BuildConfig(inputs=[str(src)], out=str(out), progress=False, workers=1))
    assert result.counts["quarantined"] == 1
    for name in [*result.shards, "manifest.json", "README.md"]:
        assert _mode(out / name) == public, name
    assert _mode(out / "quarantine.jsonl") == 0o600
