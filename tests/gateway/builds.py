"""Build what a gateway collected and read the rows back (shared by the gateway tests)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import orjson

from pipeline.build.run import BuildConfig, run_build


def rewards_file(tmp_path: Path, *rollouts: str) -> str:
    path = tmp_path / "rewards.jsonl"
    path.write_text("".join(json.dumps({"rollout_id": r, "reward": 1.0}) + "\n" for r in rollouts))
    return str(path)


def build_collection(tmp_path: Path, collect: Path, name="rl", **options):
    out = tmp_path / name
    config = BuildConfig(
        inputs=[str(collect / "calls")], out=str(out), progress=False, workers=1, **options
    )
    return out, run_build(config)


def rows_of(out: Path) -> list[dict]:
    sql = f"SELECT * FROM '{out}/train-*.parquet' ORDER BY rollout_id, segment_index"
    return duckdb.sql(sql).pl().to_dicts()


def trained_ids(row: dict) -> list[int]:
    return [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]


def calls_of(log: Path) -> list[dict]:
    """A gateway call log's records, whole: delta records resolved against their base
    (pipeline/readers/call_delta.py), as the build reads them."""
    from pipeline.readers.call_delta import Resolver

    resolver, out = Resolver(), []
    for line in log.read_bytes().splitlines():
        full = resolver.resolve(orjson.loads(line))
        resolver.accept(full)
        out.append(full)
    return out
