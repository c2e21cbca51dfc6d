"""The byte pin of the main jobs (issue 24): ``make build-rl-shards`` and ``make build-sft``
run in-process with the Makefile's own arguments, from a folder laid out like the
repository, and every file they write must hash to what ``tests/pins/sample_outputs.json``
holds. A change that alters output on purpose updates the pin in the same commit:
``python tools/pin_outputs.py`` rewrites it (and prints what changed)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main

ROOT = Path(__file__).resolve().parents[1]
PIN = ROOT / "tests" / "pins" / "sample_outputs.json"
# The Makefile's commands (make build-rl-shards; make build-sft, whose audit only reads).
COMMANDS = [
    ["build-rl", "data/sample", "--out", "out/rl", "--overwrite"],
    ["build-sft", "data/sample", "--out", "out/sft", "--overwrite"],
]


def build_and_hash(workdir: Path) -> dict[str, str]:
    """Run the main jobs in ``workdir`` (the sample copied to ``data/sample`` there) and
    return ``{path under workdir: sha256}`` of every file they wrote."""
    shutil.copytree(ROOT / "data" / "sample", workdir / "data" / "sample")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        for argv in COMMANDS:
            patch.setattr("sys.argv", ["seam", *argv])  # the manifest records the command
            assert main(argv) == 0, argv
    out = workdir / "out"
    return {
        str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


@pytest.mark.skipif(not (ROOT / "data" / "sample").exists(), reason="data/sample is missing")
def test_the_main_jobs_write_the_pinned_bytes(tmp_path):
    pinned = json.loads(PIN.read_text())
    got = build_and_hash(tmp_path)
    changed = sorted(k for k in pinned.keys() | got.keys() if pinned.get(k) != got.get(k))
    assert not changed, (
        f"output bytes changed: {changed}; if on purpose, run python tools/pin_outputs.py "
        "and commit the new pin with the change"
    )
