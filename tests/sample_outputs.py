"""The main jobs on the embedded sample, run once per test session.

``make build-rl-shards`` and ``make build-sft`` run in-process with the Makefile's own
arguments, from a folder laid out like the repository (``data/sample`` copied there, so
the manifests record the same command and inputs). The byte pin
(``tests/test_output_pin.py``) hashes what they write; every other test that needs the
sample built as those commands build it (the SFT re-render, the λ credit on each of the
256 rollouts, ...) reads the same directories instead of building the sample again
(about 25 s of CPU per build on this machine).

The directories are shared read-only: the fixture hashes every file when it builds them
and again at the end of the session, and reports an error naming the files a test changed
(``seam verify`` records its result in the build directory, for one: a test that verifies
copies the build first).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.built_once import built_once

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
PIN = ROOT / "tests" / "pins" / "sample_outputs.json"
# The Makefile's commands (make build-rl-shards; make build-sft, whose audit only reads).
COMMANDS = [
    ["build-rl", "data/sample", "--out", "out/rl", "--overwrite"],
    ["build-sft", "data/sample", "--out", "out/sft", "--overwrite"],
]


@dataclass(frozen=True)
class SampleOutputs:
    """Where the main jobs wrote: ``workdir/out/rl`` and ``workdir/out/sft``."""

    workdir: Path

    @property
    def rl(self) -> Path:
        return self.workdir / "out" / "rl"

    @property
    def sft(self) -> Path:
        return self.workdir / "out" / "sft"

    def files(self) -> list[Path]:
        return sorted(p for p in (self.workdir / "out").rglob("*") if p.is_file())

    def hashes(self) -> dict[str, str]:
        """``{path under workdir: sha256}`` of every file the main jobs wrote (machine-free)."""
        return {
            str(p.relative_to(self.workdir)): hashlib.sha256(_machine_free(p)).hexdigest()
            for p in self.files()
        }


def _machine_free(path: Path) -> bytes:
    """The file's bytes, with this machine's seam cache folder written as
    ``$SEAM_CACHE_DIR``: the manifest and the card name the folder the built-in tokenizer
    was materialised in (``tokenizer.name_or_path``), which is where seam runs, not what
    it built, so the pin holds on every machine and under any ``SEAM_CACHE_DIR``."""
    from pipeline.core.tokenizer import cache_dir

    data = path.read_bytes()
    if path.suffix in (".json", ".md"):
        data = data.replace(str(cache_dir()).encode(), b"$SEAM_CACHE_DIR")
    return data


def run_main_jobs(workdir: Path) -> SampleOutputs:
    """Run the main jobs in ``workdir`` (the sample copied to ``data/sample`` there)."""
    from pipeline.cli import main

    shutil.copytree(SAMPLE, workdir / "data" / "sample")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        for argv in COMMANDS:
            patch.setattr("sys.argv", ["seam", *argv])  # the manifest records the command
            assert main(argv) == 0, argv
    return SampleOutputs(workdir)


def build_and_hash(workdir: Path) -> dict[str, str]:
    """The main jobs' files and their hashes (``tools/pin_outputs.py`` writes these)."""
    return run_main_jobs(workdir).hashes()


@pytest.fixture(scope="session")
def sample_outputs(tmp_path_factory) -> Iterator[SampleOutputs]:
    """The main jobs' outputs on ``data/sample``, shared read-only by the whole session
    (built once for all xdist workers)."""
    if not SAMPLE.exists():
        pytest.skip("data/sample is missing")

    def build(workdir: Path) -> None:
        # The hashes as built, beside out/: every xdist worker compares with these.
        hashes = run_main_jobs(workdir).hashes()
        (workdir / "built-hashes.json").write_text(json.dumps(hashes))

    outputs = SampleOutputs(built_once(tmp_path_factory, "main-jobs", build))
    built = json.loads((outputs.workdir / "built-hashes.json").read_text())
    yield outputs
    now = outputs.hashes()
    changed = sorted(k for k in built.keys() | now.keys() if built.get(k) != now.get(k))
    assert not changed, f"a test changed the shared sample outputs (copy them first): {changed}"
