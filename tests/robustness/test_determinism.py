"""Same input and configuration → the same bytes, whatever the number of workers, and a
manifest that says whether a directory is up to date."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from pipeline.build.run import BuildConfig, BuildError, run_build
from pipeline.core.shard_schema import SHARD_SCHEMA_VERSION
from tests.robustness.conftest import BUILD_OPTIONS, SEAM, run_seam, snapshot


def _without_command(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files with the recorded command line taken out (it names --workers)."""
    manifest = json.loads(files["manifest.json"])
    command = manifest.pop("command")
    return {
        **files,
        "manifest.json": json.dumps(manifest, sort_keys=True).encode(),
        "README.md": files["README.md"].replace(command.encode(), b""),
    }


@pytest.mark.slow
def test_one_worker_writes_the_bytes_two_workers_write(reference, tmp_path):
    options = [o if o != "2" else "1" for o in BUILD_OPTIONS]
    done = run_seam([*SEAM, "build-rl", str(reference.corpus), "--out", "out", *options], tmp_path)
    assert done.returncode == 0, done.stderr
    one = snapshot(tmp_path / "out")
    assert one.keys() == reference.files.keys()
    for name in one:
        if name.startswith("train-") or name == "quarantine.jsonl":
            assert one[name] == reference.files[name], name
    assert _without_command(one) == _without_command(reference.files)


@pytest.mark.slow
def test_a_finished_build_rerun_is_up_to_date_and_untouched(reference, tmp_path):
    shutil.copytree(reference.out, tmp_path / "out")
    done = run_seam(
        [*SEAM, "build-rl", str(reference.corpus), "--out", "out", *BUILD_OPTIONS], tmp_path
    )
    assert done.returncode == 0 and "is up to date" in done.stdout
    assert snapshot(tmp_path / "out") == reference.files


def test_the_manifest_records_everything_the_bytes_depend_on(reference):
    manifest = json.loads(reference.files["manifest.json"])
    assert manifest["shard_schema_version"] == SHARD_SCHEMA_VERSION and manifest["seam_version"]
    assert {"tokenizer_sha256", "chat_template_sha256"} <= manifest["tokenizer"].keys()
    assert {"rows_per_shard", "chunk_bytes", "mask_summaries", "format"} <= manifest[
        "config"
    ].keys()
    for entry in manifest["inputs"]:
        with open(entry["path"], "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == entry["sha256"]
    assert manifest["shard_sha256"] == {
        s: hashlib.sha256(reference.files[s]).hexdigest() for s in manifest["shards"]
    }


@pytest.mark.parametrize("change", ["input", "option"])
def test_a_changed_input_or_option_is_not_up_to_date(reference, tmp_path, change):
    corpus = tmp_path / "in"
    shutil.copytree(reference.corpus, corpus)
    shutil.copytree(reference.out, tmp_path / "out")
    if change == "input":
        (corpus / "a.jsonl").write_bytes((corpus / "a.jsonl").read_bytes() + b"\n")
    config = BuildConfig(
        [str(corpus)],
        str(tmp_path / "out"),
        chunk_bytes=int(float(BUILD_OPTIONS[1]) * (1 << 20)),
        rows_per_shard=6 if change == "input" else 7,
        workers=1,
        progress=False,
    )
    with pytest.raises(BuildError, match="already holds a different build; pass --overwrite"):
        run_build(config)
