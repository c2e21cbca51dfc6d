"""An output directory is never a way to lose data: an ``--out`` overlapping an input or
holding files seam did not write is refused before anything is deleted, ``--overwrite``
deletes only what seam wrote, a planted ``.lock`` symlink is not followed, and a build
that fails leaves no set of shards a loader would read."""

from __future__ import annotations

import random

import polars as pl
import pytest

from pipeline.build.run import BuildConfig, BuildError, run_build
from tests.robustness.conftest import SEAM, run_seam
from tests.robustness.records import good_record, line


def _inputs(directory, n: int = 4):
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    lines = [line(good_record(rng, f"r{i}", f"task-{i % 2}")) for i in range(n)]
    path = directory / "a.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _build(inputs, out, **options):
    return run_build(
        BuildConfig(
            inputs=[str(i) for i in inputs], out=str(out), progress=False, workers=1, **options
        )
    )


def _tree(directory):
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("where", ["input dir", "parent of input dir", "inside input dir"])
def test_an_out_overlapping_the_inputs_is_refused_even_with_overwrite(tmp_path, where):
    proj = tmp_path / "proj"
    src = _inputs(proj / "data")
    (proj / "NOTES.md").write_text("my notes")
    out = {
        "input dir": proj / "data",
        "parent of input dir": proj,
        "inside input dir": proj / "data" / "out",
    }[where]
    before = _tree(proj)
    # A directory below an input directory would be read back as input by the next run;
    # a named input file next to --out is no overlap.
    for spec in (proj / "data", src) if where != "inside input dir" else (proj / "data",):
        with pytest.raises(BuildError, match="choose an --out outside the inputs"):
            _build([spec], out, overwrite=True)
    assert _tree(proj) == before


def test_overwrite_deletes_only_what_seam_wrote(tmp_path):
    src = _inputs(tmp_path / "in")
    out = tmp_path / "out"
    _build([src], out)
    (out / "NOTES.md").write_text("mine")
    (out / "keep").mkdir()
    before = _tree(out)
    with pytest.raises(BuildError, match=r"seam did not write \(NOTES.md, keep/\)"):
        _build([src], out, overwrite=True, mask_summaries=True)
    assert _tree(out) == before  # nothing deleted
    (out / "NOTES.md").unlink()
    (out / "keep").rmdir()
    # A shard of a larger earlier build that the new one does not write is seam's too.
    first = _build([src], out, overwrite=True, rows_per_shard=1)
    assert len(first.shards) > 1
    second = _build([src], out, overwrite=True)
    assert sorted(p.name for p in out.glob("*.parquet")) == second.shards


@pytest.mark.parametrize("overwrite", [True, False])
def test_another_tools_manifest_is_never_a_list_of_files_to_delete(tmp_path, overwrite):
    """A folder holding another tool's ``manifest.json`` whose ``shards`` list names the
    user's files: only ``.seam-written`` says what seam wrote, so nothing is deleted."""
    src = _inputs(tmp_path / "in")
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "manifest.json").write_text('{"shards": ["notes.txt", ".bashrc"], "tool": "x"}')
    (out / "notes.txt").write_text("my notes")
    (out / ".bashrc").write_text("alias ll='ls -l'")
    (out / "README.md").write_text("their readme")
    before = _tree(out)
    args = [*SEAM, "build-rl", str(src), "--out", str(out), "--no-progress", "--verify", "none"]
    done = run_seam(args + (["--overwrite"] if overwrite else []), tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "seam did not write (.bashrc, README.md, manifest.json, notes.txt)" in done.stderr
    assert _tree(out) == before


def test_a_planted_lock_symlink_is_not_followed(tmp_path):
    src = _inputs(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere" / "created-by-seam"
    target.parent.mkdir()
    (out / ".lock").symlink_to(target)
    with pytest.raises(BuildError, match="symlink"):
        _build([src], out)
    assert not target.exists()


class _FailingStage:
    """A build stage (the extension point build-sft uses) whose finalize fails, as a full
    disk or a bug would, after every shard has been written."""

    extra_fields: list = []

    def fingerprint(self) -> dict:
        return {"failing": True}

    def open_task(self, out, index):
        return None

    def finalize(self, out, indices, dest=None, excluded=None):
        raise OSError("the stage failed after the shards were written")


def test_a_failed_build_leaves_nothing_a_loader_reads(tmp_path):
    src = _inputs(tmp_path / "in", n=6)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="stage failed"):
        _build([src], out, rows_per_shard=1, stage=_FailingStage())
    assert not (out / "manifest.json").exists()
    assert not list(out.glob("*.parquet")) and not list(out.glob("**/[!.]*.parquet"))
    with pytest.raises(Exception, match="(?i)no such file|paths were empty"):
        pl.scan_parquet(out / "train-*.parquet").collect()


@pytest.mark.parametrize("command", ["build-rl", "ingest"])
def test_out_that_is_a_file_fails_in_one_line_naming_it(tmp_path, command):
    src = _inputs(tmp_path / "in")
    (tmp_path / "afile").write_text("x")
    for out, message in (("afile", "is a file, not a directory"), ("afile/out", "cannot create")):
        done = run_seam([*SEAM, command, str(src), "--out", out, "--no-progress"], tmp_path)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and "space" not in done.stderr
        assert "Traceback" not in done.stderr
