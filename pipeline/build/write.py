"""The end of a build: GRPO advantages over every rollout, and the shards.

Part files hold every row except the group-dependent columns. Each task returns a small
group table (one row per rollout with rows: task id, reward, ordinal, rollout and parent
ids); ``compute_group_stats`` computes the advantages over rollouts (``advantage.py``; a
rollout and its sub-agents vote once, ``vote_roots``). ``write_shards`` then cuts the
parts, in task order, into ``train-XXXXX-of-NNNNN.parquet`` shards of at most
``rows_per_shard`` rows (equal sizes), filling ``advantage`` and ``group_size`` by
rollout ordinal; they are written in parallel (``atomic.py``) into the build's staging
directory, which ``build.py`` publishes once the set is complete before it writes the
dataset card (``card.py``) and the manifest; the quarantine is ``quarantine.py``'s.
Memory is one shard (and the parts it spans) per writer thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq

from pipeline.build.worker import TaskResult, part_paths
from pipeline.common.atomic import atomic_write
from pipeline.common.hashing import file_sha256
from pipeline.core.advantage import group_advantages
from pipeline.core.rows import ROLLOUT_ORDINAL
from pipeline.core.shard_schema import SHARD_SCHEMA, dictionary_columns

SHARD_PATTERN = "train-{index:05d}-of-{total:05d}.parquet"


def compute_group_stats(
    results: Sequence[TaskResult],
    use_std: bool,
    ddof: int = 0,
    excluded: dict[int, set[int]] | None = None,
) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], int]:
    """Per task: (advantage, group_size) indexed by rollout ordinal; and how many task
    groups hold a single rollout (advantage 0, reported in the summary).

    ``results`` are the tasks' results (``worker.TaskResult``), each with its ``groups`` table (task id, reward,
    ordinal of every rollout that has rows; ``worker.group_table``); ``excluded``: the
    ordinals, per task, of rollouts left out of the shards and their groups (duplicates)."""
    excluded = excluded or {}
    keys: list[str] = []
    rewards: list[float] = []
    owners: list[tuple[int, int]] = []
    ids: list[str | None] = []
    parents: list[str | None] = []
    for r in results:
        groups = r.groups
        left_out = excluded.get(r.task, set())
        # Parts written before sub-agents were linked carry no ids: every rollout votes.
        n = len(groups["task_id"])
        for key, reward, o, rid, parent in zip(
            groups["task_id"],
            groups["reward"],
            groups["ordinal"],
            groups.get("rollout_id") or [None] * n,
            groups.get("parent_rollout_id") or [None] * n,
        ):
            if o in left_out:
                continue
            keys.append(key)
            rewards.append(np.nan if reward is None else reward)
            owners.append((r.task, o))
            ids.append(rid)
            parents.append(parent)
    result: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if not keys:
        return result, 0
    root = vote_roots(ids, parents)
    voters = sorted(set(root))
    vote_adv, vote_sizes = group_advantages(
        np.array([keys[i] for i in voters], dtype=object),
        np.array([rewards[i] for i in voters], dtype=np.float64),
        use_std,
        ddof,
    )
    by_voter = {v: (a, n) for v, a, n in zip(voters, vote_adv, vote_sizes)}
    adv = [by_voter[root[i]][0] for i in range(len(keys))]
    sizes = [by_voter[root[i]][1] for i in range(len(keys))]
    groups_of_one = len({keys[v] for v in voters if by_voter[v][1] == 1})
    per_task: dict[int, list[tuple[int, float, int]]] = {}
    for (t, o), a, s in zip(owners, adv, sizes):
        per_task.setdefault(t, []).append((o, a, s))
    for t, items in per_task.items():
        n = max(o for o, _, _ in items) + 1
        a_arr, s_arr = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.int32)
        for o, a, s in items:
            a_arr[o], s_arr[o] = a, s
        result[t] = (a_arr, s_arr)
    return result, groups_of_one


def vote_roots(ids: list[str | None], parents: list[str | None]) -> list[int]:
    """For each rollout, the index of the rollout that votes for it in its GRPO group.

    A rollout and its sub-agents (``parent_rollout_id``, followed up to the top) are one
    vote: counting each sub-agent as a rollout would give a session with k sub-agents
    k+1 votes in its group's mean and std (the segment-count bias again). A sub-agent
    whose parent is not in the build votes for itself. Index order decides nothing but
    which row stands for the vote, so the result is independent of the task order.
    """
    index = {rid: i for i, rid in enumerate(ids) if rid is not None}
    roots = []
    for i in range(len(ids)):
        at, seen = i, {i}
        while (parent := parents[at]) is not None and index.get(parent, at) not in seen:
            at = index[parent]
            seen.add(at)
        roots.append(at)
    return roots


def plan_shards(
    part_rows: list[tuple[int, int]], rows_per_shard: int
) -> list[list[tuple[int, int, int]]]:
    """Cut the parts' rows, in task order, into as few shards as hold at most
    ``rows_per_shard`` rows each, of equal size (±1 row, so that shards written in parallel
    finish together): for each shard the ``(task, offset, length)`` slices it is made of."""
    total = sum(rows for _, rows in part_rows)
    count = max(1, -(-total // rows_per_shard))
    sizes = [total // count + (1 if i < total % count else 0) for i in range(count)]
    shards: list[list[tuple[int, int, int]]] = [[]]
    room = sizes[0]
    for task, rows in part_rows:
        offset = 0
        while offset < rows:
            if room == 0:
                shards.append([])
                room = sizes[len(shards) - 1]
            take = min(room, rows - offset)
            shards[-1].append((task, offset, take))
            offset += take
            room -= take
    return shards


def write_shards(
    out: str,
    results: list[TaskResult],
    rows_per_shard: int,
    use_std: bool,
    extra_fields=(),
    workers: int = 1,
    std_ddof: int = 0,
    dest: Path | None = None,
    excluded: dict[int, set[int]] | None = None,
) -> tuple[dict[str, str], int]:
    """Write every shard from the tasks' results (in task order) into ``dest`` (default
    ``out``), without the rows of the rollouts in ``excluded`` (ordinals per task);
    returns ``{shard name: sha256}`` in shard order and the number of task groups of one.

    Shards are independent once the group advantages are known, so they are written in
    parallel — the serial part of finalizing is the tiny group table. Threads, not
    processes: Arrow reads, compresses and writes with the GIL released, and a forked
    writer spent ten times longer reading its parts (0.29 s vs 0.03 s per shard),
    faulting in fresh memory the parent process already had.
    """
    schema = pa.schema([*SHARD_SCHEMA, *extra_fields], metadata=SHARD_SCHEMA.metadata)
    excluded = excluded or {}
    stats, groups_of_one = compute_group_stats(results, use_std, std_ddof, excluded)
    rows = [
        (
            r.task,
            r.rows - sum(r.rollouts[o][3]["segments"] for o in excluded.get(r.task, ())),
        )
        for r in results
    ]
    plan = plan_shards(rows, rows_per_shard)
    names = [SHARD_PATTERN.format(index=i, total=len(plan)) for i in range(len(plan))]
    jobs = [
        (
            out,
            Path(dest or out) / name,
            pieces,
            {t: (stats.get(t), excluded.get(t)) for t, _, _ in pieces},
            schema,
        )
        for name, pieces in zip(names, plan)
    ]
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(
            max_workers=min(workers, len(jobs)), thread_name_prefix="seam-shard"
        ) as pool:
            hashes = list(pool.map(_write_shard, jobs))
    else:
        hashes = [_write_shard(job) for job in jobs]
    return dict(zip(names, hashes)), groups_of_one


def _write_shard(job) -> str:
    out, path, pieces, stats, schema = job
    tables = []
    for task, offset, length in pieces:
        (adv, sizes), left_out = stats[task]
        # On this thread: the shards are already written on one thread each, and Arrow's
        # pool decompressing a part's buffers cost a third more CPU (0.13 vs 0.08 s for
        # the 60 parts of text-500, median of 5).
        part = feather.read_table(part_paths(out, task)[0], memory_map=False, use_threads=False)
        if left_out:
            keep = pc.invert(pc.is_in(part[ROLLOUT_ORDINAL], pa.array(sorted(left_out))))
            part = part.filter(keep)
        part = part.slice(offset, length)
        ordinals = np.asarray(part[ROLLOUT_ORDINAL].to_pylist(), dtype=np.int64)
        part = part.set_column(
            part.schema.get_field_index("advantage"),
            SHARD_SCHEMA.field("advantage"),
            numpy_array(adv[ordinals], pa.float32()),
        )
        part = part.set_column(
            part.schema.get_field_index("group_size"),
            SHARD_SCHEMA.field("group_size"),
            numpy_array(sizes[ordinals], pa.int32()),
        )
        tables.append(part.drop_columns([ROLLOUT_ORDINAL]).cast(schema))
    # Chunks stay as they are (one per part slice): the writer cuts row groups by row
    # count, and copying every token once more into one chunk doubled the write time.
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    _write_parquet(path, table)
    return file_sha256(path)


def numpy_array(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """A non-null Arrow array over a numpy array's buffer. ``pa.array()`` and
    ``to_numpy()`` import pandas on first use (0.33 s of every build's finalize)."""
    values = np.ascontiguousarray(values, dtype=arrow_type.to_pandas_dtype())
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def _write_parquet(path: Path, table: pa.Table) -> None:
    atomic_write(
        path,
        lambda tmp: pq.write_table(
            table,
            tmp,
            compression="zstd",
            row_group_size=256,
            use_dictionary=dictionary_columns(table.schema),
        ),
    )
