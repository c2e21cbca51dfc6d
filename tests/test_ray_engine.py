"""The Ray Data engine runs the same stage functions and gives the same rows as local."""

from __future__ import annotations

import pytest

from pipeline.build.run import BuildConfig, run_build
from tests.test_build import _rows, sample_rollouts, write_rollouts  # noqa: F401  (fixture reuse)

# A local Ray cluster (the session's, tests/conftest.py: ~25 s to start) and a build: slow.
pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray Data is optional: pip install 'seam-rl[ray]'")


def test_ray_output_equals_local_output_row_for_row(tmp_path, sample_rollouts, local_ray):  # noqa: F811
    src = tmp_path / "in.jsonl"
    write_rollouts(src, sample_rollouts * 2)
    common = dict(inputs=[str(src)], progress=False, chunk_bytes=1 << 14, rows_per_shard=20)
    local = run_build(BuildConfig(out=str(tmp_path / "local"), workers=1, **common))
    remote = run_build(BuildConfig(out=str(tmp_path / "ray"), workers=2, engine="ray", **common))
    assert remote.shards == local.shards and len(local.shards) > 1
    assert _rows(tmp_path / "ray") == _rows(tmp_path / "local")
    for shard in local.shards:
        assert (tmp_path / "ray" / shard).read_bytes() == (tmp_path / "local" / shard).read_bytes()
    assert remote.counts == local.counts
