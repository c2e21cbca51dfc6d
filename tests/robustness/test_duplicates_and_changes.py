"""A rollout read twice joins its GRPO group once: later copies are quarantined with both
places named, and the shards are those of a build without the copy. An input that
changes while the build reads it fails the build instead of being described by a hash
of bytes the build did not read."""

from __future__ import annotations

import json
import os
import random

import pyarrow.parquet as pq
import pytest

from pipeline.build.run import BuildConfig, BuildError, run_build
from tests.robustness.records import good_record, line


def _records(rewards: list[float]) -> list[bytes]:
    rng = random.Random(3)
    records = []
    for i, reward in enumerate(rewards):
        record = good_record(rng, f"r{i}", "task-0")
        record["reward"] = reward
        records.append(line(record))
    return records


def _build(inputs, out, **options):
    return run_build(
        BuildConfig(
            inputs=[str(i) for i in inputs], out=str(out), progress=False, workers=1, **options
        )
    )


def _rows(out):
    return pq.read_table(sorted(out.glob("train-*.parquet"))).to_pylist()


def test_a_duplicate_rollout_is_quarantined_and_its_group_counts_it_once(tmp_path):
    records = _records([1.0, 0.0, 0.0, 0.0])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(b"\n".join(records) + b"\n")
    (tmp_path / "in" / "b.jsonl").write_bytes(records[0] + b"\n")  # r0 again, elsewhere
    once = tmp_path / "once.jsonl"
    once.write_bytes(b"\n".join(records) + b"\n")
    reference = _build([once], tmp_path / "reference")
    result = _build([tmp_path / "in"], tmp_path / "out", rows_per_shard=1)
    rows = _rows(tmp_path / "out")
    assert rows == _rows(tmp_path / "reference")
    assert {r["group_size"] for r in rows} == {4}
    # A = (R - mean) / std over the 4 rollouts: 1.732 for the 1, -0.577 for the 0s.
    assert {round(r["advantage"], 3) for r in rows} == {1.732, -0.577}
    assert result.counts["accepted"] == 4 and result.counts["quarantined"] == 1
    assert result.counts["read"] == 5
    for key in ("segments", "tokens", "trainable_tokens", "calls"):
        assert result.counts[key] == reference.counts[key], key
    assert result.seams == reference.seams
    (entry,) = [json.loads(q) for q in (tmp_path / "out" / "quarantine.jsonl").open()]
    assert entry["file"].endswith("b.jsonl") and entry["line"] == 1
    assert f"{tmp_path}/in/a.jsonl:1" in entry["reason"] and "b.jsonl:1" in entry["reason"]
    assert result.per_file[str(tmp_path / "in" / "b.jsonl")]["quarantined"] == 1


class _ChangesInput:
    """A build stage (the extension point build-sft uses) that edits an input as the
    first task starts, as a writer still appending to the file would."""

    extra_fields: list = []

    def __init__(self, path, change):
        self.path, self.change = path, change

    def fingerprint(self) -> dict:
        return {}

    def open_task(self, out, index):
        if index == 0:
            self.change(self.path)

    def finalize(self, out, indices, dest=None, excluded=None):
        return {}


@pytest.mark.parametrize("how", ["appended", "shuffled", "truncated"])
def test_an_input_that_changes_during_the_build_fails_it(tmp_path, how):
    records = _records([1.0, 0.0, 1.0, 0.0])
    src = tmp_path / "a.jsonl"
    src.write_bytes(b"\n".join(records) + b"\n")
    change = {
        "appended": lambda p: p.write_bytes(p.read_bytes() + records[0] + b"\n"),
        "shuffled": lambda p: p.write_bytes(b"\n".join(reversed(records)) + b"\n"),
        "truncated": lambda p: p.write_bytes(p.read_bytes()[:100]),
    }[how]
    with pytest.raises(BuildError, match="changed while the build read it"):
        _build([src], tmp_path / "out", stage=_ChangesInput(src, change))
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not list((tmp_path / "out").glob("*.parquet"))


def _rewrite_in_place(path, data: bytes) -> None:
    """Overwrite ``path`` with ``data`` (its size): same inode, same size, and the
    modification time put back, as ``touch -r`` would."""
    st = path.stat()
    assert len(data) == st.st_size
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


class _EditsInPlace(_ChangesInput):
    """Edits the input in place (a reward flipped) as task 0 starts; with ``revert``, puts
    the original bytes back as task 1 starts (after task 0 read the edited ones), so
    nothing on disk shows it at the end."""

    def __init__(self, path, revert: bool):
        super().__init__(path, None)
        self.revert = revert
        self.original = path.read_bytes()

    def open_task(self, out, index):
        if index == 0:
            edited = self.original.replace(b'"reward": 1.0', b'"reward": 0.0', 1)
            assert edited != self.original
            _rewrite_in_place(self.path, edited)
        elif index == 1 and self.revert:
            _rewrite_in_place(self.path, self.original)


@pytest.mark.parametrize("verify", ["none", "sample", "all"])
@pytest.mark.parametrize("revert", [False, True], ids=["edited", "edited-then-reverted"])
def test_an_input_edited_in_place_with_its_mtime_restored_fails_before_publishing(
    tmp_path, verify, revert
):
    """Same inode, size and mtime: only the bytes say it. What the tasks read is hashed as
    they read it and compared with the first hash before anything is published, in every
    --verify mode (it was: --verify none published shards the manifest's sha256 does not
    describe; --verify sample published, then failed)."""
    from pipeline.cli.build_rl import run_configured_build
    from pipeline.common.errors import SeamError

    records = _records([1.0, 0.0, 0.0, 0.0])
    src = tmp_path / "a.jsonl"
    src.write_bytes(b"\n".join(records) + b"\n")
    out = tmp_path / "out"
    stage = _EditsInPlace(src, revert)
    config = BuildConfig(
        inputs=[str(src)],
        out=str(out),
        progress=False,
        workers=1,
        chunk_bytes=len(records[0]) + 2,  # two tasks at least: task 1 may revert the edit
        stage=stage,
    )
    before = src.read_bytes(), src.stat().st_mtime_ns
    with pytest.raises(SeamError, match="changed while the build read it .* nothing was published"):
        run_configured_build(config, "seam build-rl", verify)
    if revert:  # nothing on disk shows the edit: only what the tasks read does
        assert (src.read_bytes(), src.stat().st_mtime_ns) == before
    assert not (out / "manifest.json").exists()
    assert not list(out.glob("*.parquet")) and not (out / "quarantine.jsonl").exists()


def test_an_input_read_outside_read_hash_is_hashed_again(tmp_path):
    """A canonical Parquet input is read by Arrow, not block by block through
    ``read_hash``: edited in place (mtime put back) as the build reads it, it fails the
    build too, by its sha256 taken again before publishing."""
    from pipeline.sources.canonical_io import write_canonical_parquet
    from schemas.rollout import Rollout

    src = tmp_path / "a.parquet"
    rollouts = [Rollout.model_validate_json(r) for r in _records([1.0, 0.0])]
    write_canonical_parquet(rollouts, src)
    data = src.read_bytes()
    flipped = data[:-20] + bytes([data[-20] ^ 1]) + data[-19:]  # inside the footer

    class _FlipsAByte(_ChangesInput):
        def open_task(self, out, index):
            _rewrite_in_place(self.path, flipped)

    with pytest.raises(BuildError, match=r"changed while the build read it \(its sha256"):
        _build([src], tmp_path / "out", stage=_FlipsAByte(src, None))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_duplicate_rollouts_preference_pairs_go_with_its_rows(tmp_path):
    """build-sft: the later copy of a corrected rollout leaves neither rows nor pairs;
    the pairs are those of a build that read it once."""
    from pipeline.sft.stage import SftStage
    from tests.sample_builds import corrected, one_compaction

    good = corrected("good")
    other = one_compaction("other").build(reward=0.0, resolved=False)
    record = good.model_dump_json(exclude_none=True)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(
        record + "\n" + other.model_dump_json(exclude_none=True) + "\n"
    )
    (tmp_path / "in" / "b.jsonl").write_text(record + "\n")  # "good" again, elsewhere
    (tmp_path / "once.jsonl").write_text((tmp_path / "in" / "a.jsonl").read_text())

    def build(inputs, out):
        return _build(inputs, out, kind="sft", stage=SftStage())

    reference = build([tmp_path / "once.jsonl"], tmp_path / "reference")
    result = build([tmp_path / "in"], tmp_path / "out")
    assert result.counts["quarantined"] == 1 and result.counts["accepted"] == 2
    assert result.counts["preference_pairs"] == reference.counts["preference_pairs"] == 1
    (shard,) = (tmp_path / "out" / "pairs").glob("*.parquet")
    pairs = pq.read_table(shard)
    (reference_shard,) = (tmp_path / "reference" / "pairs").glob("*.parquet")
    assert pairs.to_pylist() == pq.read_table(reference_shard).to_pylist()
    assert pairs["rollout_id"].to_pylist() == ["good"]
    assert "ordinal" not in pairs.schema.names
