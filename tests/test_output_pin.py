"""The byte pin of the main jobs (issue 24): ``make build-rl-shards`` and ``make build-sft``
run in-process with the Makefile's own arguments, from a folder laid out like the
repository (the session's ``sample_outputs``, ``tests/sample_outputs.py``), and every file
they write must hash to what ``tests/pins/sample_outputs.json`` holds (this machine's cache
folder written as ``$SEAM_CACHE_DIR``). A change that alters output on purpose updates the
pin in the same commit: ``python tools/pin_outputs.py`` rewrites it (and prints what
changed)."""

from __future__ import annotations

import json
import shutil

from pipeline.core.tokenizer import cache_dir
from tests.sample_outputs import PIN


def test_the_main_jobs_write_the_pinned_bytes(sample_outputs):
    pinned = json.loads(PIN.read_text())
    got = sample_outputs.hashes()
    changed = sorted(k for k in pinned.keys() | got.keys() if pinned.get(k) != got.get(k))
    assert not changed, (
        f"output bytes changed: {changed}; if on purpose, run python tools/pin_outputs.py "
        "and commit the new pin with the change"
    )


def test_the_fingerprint_does_not_depend_on_where_the_tokenizer_is_cached(tmp_path, monkeypatch):
    """Two machines (or two ``SEAM_CACHE_DIR``) holding the same built-in tokenizer build
    the same thing: the fingerprint hashes what the tokenizer is, not its folder. Before,
    it hashed ``name_or_path`` too, so a build was never up to date under another cache."""
    from pipeline.build import worker
    from pipeline.build.run import BuildConfig, run_build
    from pipeline.core.tokenizer import load_build_tokenizer, load_tokenizer
    from tests.sample_builds import no_compaction

    def forget_loaded_tokenizers() -> None:  # the process keeps the first one it loaded
        worker._SEGMENTERS.clear()
        load_build_tokenizer.cache_clear()
        load_tokenizer.cache_clear()

    source = tmp_path / "in.jsonl"
    source.write_text(no_compaction("r1").build(reward=1.0).model_dump_json() + "\n")
    fingerprints, folders = [], []
    try:
        for name in ("cache-a", "cache-b"):
            shutil.copytree(cache_dir() / "tokenizers", tmp_path / name / "tokenizers")
            monkeypatch.setenv("SEAM_CACHE_DIR", str(tmp_path / name))
            forget_loaded_tokenizers()
            out = tmp_path / f"out-{name}"
            run_build(BuildConfig(inputs=[str(source)], out=str(out), workers=1, progress=False))
            manifest = json.loads((out / "manifest.json").read_text())
            fingerprints.append(manifest["fingerprint"])
            folders.append(manifest["tokenizer"]["name_or_path"])
    finally:
        monkeypatch.undo()
        forget_loaded_tokenizers()  # later tests load from the real cache again
    assert folders[0] != folders[1]  # the two builds did use two folders
    assert fingerprints[0] == fingerprints[1]
