"""How `seam verify` reads a build: only the row groups holding the rollouts it checks,
the token columns as numpy views of Arrow's buffers, without importing pandas, and with
the tokenizer the process already loaded for the build."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.build.worker import segmenter_with
from pipeline.core.tokenizer import DEFAULT_TOKENIZER, default_tokenizer_dir
from pipeline.inspect import verify
from pipeline.inspect.verify import list_values, verify_build

ROOT = Path(__file__).resolve().parents[2]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([pa.int8(), pa.int32(), pa.int64(), pa.float32(), pa.float64()]),
    st.lists(st.lists(st.integers(-100, 100), max_size=6), min_size=1, max_size=6),
    st.data(),
)
def test_list_values_equal_to_numpy_for_every_cell_of_a_sliced_column(arrow_type, cells, data):
    column = pa.array(cells, pa.list_(arrow_type))
    start = data.draw(st.integers(0, len(cells) - 1))
    sliced = column.slice(start)  # a cell's values then start at an offset into the buffer
    for i, cell in enumerate(sliced):
        have = list_values(cell.values)
        want = cell.values.to_numpy(zero_copy_only=False)
        assert have.dtype == want.dtype and np.array_equal(have, want), (i, start)
        assert have.tolist() == cells[start + i]


def test_list_values_with_nulls_still_reads_them():
    values = pa.array([1.5, None, 2.0], pa.float32())
    assert np.isnan(list_values(values)[1]) and list_values(values)[2] == 2.0


def _regroup(build: Path, rows_per_group: int) -> None:
    """Rewrite every shard in row groups of ``rows_per_group`` (same rows, same order)."""
    for name in json.loads((build / "manifest.json").read_text())["shards"]:
        pq.write_table(pq.read_table(build / name), build / name, row_group_size=rows_per_group)


def test_rollouts_split_across_row_groups_are_read_whole_and_in_order(rl_build, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(rl_build, copy)
    before = verify_build(copy, "all")
    _regroup(copy, 2)  # rl_build's 3-segment rollout now spans two row groups
    shard = next(copy.glob("*.parquet"))
    assert pq.ParquetFile(shard).num_row_groups > 1
    after = verify_build(copy, "all")
    assert after.ok and after.by_rollout == before.by_rollout


def test_a_flipped_bit_in_a_later_row_group_names_its_row(rl_build, tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(rl_build, copy)
    shards = json.loads((copy / "manifest.json").read_text())["shards"]
    flipped = []
    for name in shards:  # the last row of every shard
        table = pq.read_table(copy / name)
        rows = table.to_pylist()
        rows[-1]["loss_mask"][0] = 1 - rows[-1]["loss_mask"][0]
        schema = table.schema
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), copy / name, row_group_size=2)
        flipped.append((name, len(rows) - 1))
    here = verify_build(copy, "all", workers=1)
    assert sorted({(m.shard, m.row) for m in here.mismatches}) == flipped
    assert any(m.what.startswith("loss_mask[0] = ") for m in here.mismatches)
    # Checked on two forked processes (however small the build): the same result, the
    # mismatches in the same order.
    monkeypatch.setattr(verify, "PARALLEL_MIN_SPANS", 0)
    forked = verify_build(copy, "all", workers=2)
    assert forked.as_manifest() == here.as_manifest() and forked.mismatches == here.mismatches


def test_the_build_and_its_verify_share_one_loaded_tokenizer():
    # The build names the built-in tokenizer by nothing, its manifest (read by verify) by
    # the directory: one segmenter for both, not a second 0.6 s load.
    built = segmenter_with(None, None)
    assert segmenter_with(str(default_tokenizer_dir()), None) is built
    assert segmenter_with(DEFAULT_TOKENIZER, None) is built


@pytest.mark.slow  # a fresh interpreter loads the tokenizer: ~3 s on two loaded cores
def test_verify_never_imports_pandas(rl_build):
    script = (
        "import sys\n"
        "from pipeline.inspect.verify import verify_build\n"
        f"assert verify_build({str(rl_build)!r}, 'all').ok\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'\n"
        "      or m == 'pyarrow.dataset'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def _recut(build: Path, sizes: list[int]) -> list[list[str]]:
    """Rewrite the build's shards as shards of ``sizes`` rows (same rows, same order); each
    new shard's rollout ids."""
    manifest = json.loads((build / "manifest.json").read_text())
    table = pa.concat_tables(pq.read_table(build / name) for name in manifest["shards"])
    assert sum(sizes) == table.num_rows
    for name in manifest["shards"]:
        (build / name).unlink()
    names, ids, at = [], [], 0
    for i, size in enumerate(sizes):
        names.append(f"train-{i:05d}-of-{len(sizes):05d}.parquet")
        pq.write_table(table.slice(at, size), build / names[-1])
        ids.append(table.slice(at, size)["rollout_id"].to_pylist())
        at += size
    manifest["shards"] = names
    (build / "manifest.json").write_text(json.dumps(manifest))
    return ids


def test_a_rollout_whose_rows_span_two_shards_is_one_group_read_on_any_threads(rl_build, tmp_path):
    """The shards' rows are read on threads, one shard each, while the inputs are read;
    a rollout cut between two shards is still checked as one group, whatever the thread
    count."""
    copy = tmp_path / "copy"
    shutil.copytree(rl_build, copy)
    rows = json.loads((copy / "manifest.json").read_text())["counts"]["segments"]
    ids = _recut(copy, [rows // 3 + 2, rows // 3 - 1, rows - 2 * (rows // 3) - 1])
    spanning = {a[-1] for a, b in zip(ids, ids[1:]) if a[-1] == b[0]}
    assert spanning  # some rollout's rows are in two shards
    results = [verify_build(copy, "all", workers=n) for n in (1, 2, 3)]
    assert all(r.ok for r in results), results[1].mismatches[:3]
    assert results[0].by_rollout == results[1].by_rollout == results[2].by_rollout
    for rollout_id in spanning:
        assert results[1].by_rollout[rollout_id]["rows"] == sum(i.count(rollout_id) for i in ids)
