"""Finalize a build: group advantages, shards, quarantine, manifest, dataset card.

Part files hold every row except the group-dependent columns. Finalizing reads the
tiny rollout table (one row per rollout: task, reward) from all parts, computes GRPO
advantages over rollouts (``pipeline/advantage.py``), then streams the parts in task
order into ``train-XXXXX-of-NNNNN.parquet`` shards of ``rows_per_shard`` rows, each
written to a temporary name and renamed. Memory is one part plus one shard.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.advantage import group_advantages
from pipeline.rows import ROLLOUT_ORDINAL
from pipeline.shard_schema import SHARD_SCHEMA
from pipeline.worker import part_paths

SHARD_PATTERN = "train-{index:05d}-of-{total:05d}.parquet"


def compute_group_stats(out: str, task_indices: list[int], use_std: bool) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per task: (advantage, group_size) indexed by rollout ordinal."""
    keys, rewards, owners = [], [], []
    for t in task_indices:
        part = part_paths(out, t)[0]
        table = pq.read_table(part, columns=["task_id", "reward", "segment_index", ROLLOUT_ORDINAL])
        first = table.filter(pc.equal(table["segment_index"], 0))
        keys.extend(first["task_id"].to_pylist())
        rewards.extend(first["reward"].to_pylist())
        owners.extend((t, o) for o in first[ROLLOUT_ORDINAL].to_pylist())
    result: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if not keys:
        return result
    adv, sizes = group_advantages(np.array(keys, dtype=object), np.array(rewards, dtype=np.float64), use_std)
    per_task: dict[int, list[tuple[int, float, int]]] = {}
    for (t, o), a, s in zip(owners, adv, sizes):
        per_task.setdefault(t, []).append((o, a, s))
    for t, items in per_task.items():
        n = max(o for o, _, _ in items) + 1
        a_arr, s_arr = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.int32)
        for o, a, s in items:
            a_arr[o], s_arr[o] = a, s
        result[t] = (a_arr, s_arr)
    return result


def write_shards(out: str, task_indices: list[int], total_rows: int, rows_per_shard: int, use_std: bool,
                 extra_fields=()) -> list[str]:
    schema = pa.schema([*SHARD_SCHEMA, *extra_fields], metadata=SHARD_SCHEMA.metadata)
    stats = compute_group_stats(out, task_indices, use_std)
    num_shards = max(1, -(-total_rows // rows_per_shard))
    names = [SHARD_PATTERN.format(index=i, total=num_shards) for i in range(num_shards)]
    pending: list[pa.Table] = []
    pending_rows, shard = 0, 0

    def flush(tables: list[pa.Table]) -> None:
        nonlocal shard
        table = pa.concat_tables(tables) if tables else schema.empty_table()
        _write_parquet(Path(out) / names[shard], table.combine_chunks())
        shard += 1

    for t in task_indices:
        part = pq.read_table(part_paths(out, t)[0])
        if part.num_rows == 0:
            continue
        adv, sizes = stats[t]
        ordinals = part[ROLLOUT_ORDINAL].to_numpy()
        part = part.set_column(part.schema.get_field_index("advantage"), SHARD_SCHEMA.field("advantage"),
                               pa.array(adv[ordinals], type=pa.float32()))
        part = part.set_column(part.schema.get_field_index("group_size"), SHARD_SCHEMA.field("group_size"),
                               pa.array(sizes[ordinals], type=pa.int32()))
        part = part.drop_columns([ROLLOUT_ORDINAL]).cast(schema)
        offset = 0
        while offset < part.num_rows:
            take = min(rows_per_shard - pending_rows, part.num_rows - offset)
            pending.append(part.slice(offset, take))
            pending_rows += take
            offset += take
            if pending_rows == rows_per_shard:
                flush(pending)
                pending, pending_rows = [], 0
    if pending or shard == 0:
        flush(pending)
    return names


def _write_parquet(path: Path, table: pa.Table) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd", row_group_size=256)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def merge_quarantine(out: str, task_indices: list[int]) -> int:
    path = Path(out) / "quarantine.jsonl"
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    n = 0
    with open(tmp, "wb") as dst:
        for t in task_indices:
            data = part_paths(out, t)[1].read_bytes()
            n += data.count(b"\n")
            dst.write(data)
    os.replace(tmp, path)
    return n


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
