"""End-to-end builds: real JSONL in, real Parquet shards out, read back by every consumer."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.build.run import BuildConfig, BuildError, OutputLock, run_build
from pipeline.core.shard_schema import SHARD_SCHEMA
from pipeline.sources.canonical_io import rollout_to_json, write_canonical_parquet
from tests.strategies import rollouts


def write_rollouts(path: Path, items, broken: dict[int, bytes] | None = None) -> None:
    lines = [rollout_to_json(r) for r in items]
    for at, raw in sorted((broken or {}).items()):
        lines.insert(at, raw)
    path.write_bytes(b"\n".join(lines) + b"\n")


SAMPLE = Path(__file__).parents[1] / "data" / "sample" / "rollouts.jsonl.zst"


@pytest.fixture(scope="module")
def sample_rollouts():
    """24 rollouts of the embedded sample (6 tasks, compactions, edits, logged ids,
    drift), the last one moved to a task of its own (a group of one)."""
    from pipeline.sources.canonical_io import iter_canonical_records

    items = []
    for _, r in iter_canonical_records(SAMPLE):
        items.append(r)
        if len(items) == 24:
            break
    items[-1] = items[-1].model_copy(update={"task_id": "task-alone"})
    return items


def build(tmp_path: Path, inputs, name="out", **options) -> tuple:
    out = tmp_path / name
    result = run_build(
        BuildConfig(
            inputs=[str(i) for i in inputs], out=str(out), progress=False, workers=1, **options
        )
    )
    return out, result


def test_quarantine_accounts_for_every_line_and_good_rows_survive(tmp_path, sample_rollouts):
    src = tmp_path / "mixed.jsonl"
    write_rollouts(
        src,
        sample_rollouts[:6],
        broken={
            1: b'{"rollout_id": "x", "task_id"',  # truncated JSON
            3: b'{"rollout_id": "y", "task_id": "t", "source": "s", "events": [{"type": "teleport"}]}',
            5: b"[1, 2, 3]",
            7: json.dumps(
                {
                    "rollout_id": "z",
                    "task_id": "t",
                    "source": "s",
                    "reward": 1,
                    "events": [
                        {
                            "type": "message",
                            "id": "a",
                            "role": "assistant",
                            "content": "",
                            "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}],
                        },
                        {"type": "message", "id": "b", "role": "user", "content": "hi"},
                        {"type": "message", "id": "d", "role": "assistant", "content": "x"},
                    ],
                }
            ).encode(),
        },
    )
    out, result = build(tmp_path, [src])
    assert result.counts["read"] == 10
    assert result.counts["accepted"] == 6 and result.counts["quarantined"] == 4
    entries = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [e["line"] for e in entries] == [2, 4, 6, 8]
    assert all(e["file"] == str(src) for e in entries)
    assert "invalid JSON" in entries[0]["reason"]
    assert "teleport" in entries[1]["reason"] or "events.0" in entries[1]["reason"]
    assert "expected a JSON object" in entries[2]["reason"]
    assert "without a result" in entries[3]["reason"]
    clean_out, _ = build(tmp_path, [_clean(tmp_path, sample_rollouts[:6])], name="clean")
    assert _rows(out) == _rows(clean_out)


def _clean(tmp_path, items) -> Path:
    path = tmp_path / "clean.jsonl"
    write_rollouts(path, items)
    return path


def _rows(out: Path) -> list[dict]:
    table = pl.read_parquet(sorted(out.glob("train-*.parquet")))
    return table.drop("source").to_dicts()


def test_shards_load_unchanged_in_datasets_polars_and_duckdb(tmp_path, sample_rollouts):
    out, result = build(tmp_path, [_clean(tmp_path, sample_rollouts)], rows_per_shard=16)
    shards = sorted(out.glob("train-*.parquet"))
    assert [s.name for s in shards] == result.shards
    assert len(shards) == -(-result.counts["segments"] // 16)
    assert all(s.name.endswith(f"-of-{len(shards):05d}.parquet") for s in shards)
    arrow = pq.read_table(shards)
    assert arrow.schema.equals(SHARD_SCHEMA, check_metadata=False)

    from datasets import load_dataset

    ds = load_dataset("parquet", data_dir=str(out), split="train")
    assert ds.num_rows == arrow.num_rows
    assert ds[0]["input_ids"] == arrow["input_ids"][0].as_py()
    assert str(ds.features["loss_mask"].feature.dtype) == "int8"

    lazy = (
        pl.scan_parquet(str(out / "train-*.parquet")).select(pl.col("num_tokens").sum()).collect()
    )
    assert lazy.item() == sum(len(x) for x in arrow["input_ids"].to_pylist())

    con = duckdb.connect()
    n, bad = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE len(input_ids) <> len(loss_mask)) "
        f"FROM read_parquet('{out}/train-*.parquet')"
    ).fetchone()
    assert n == arrow.num_rows and bad == 0


@pytest.fixture(scope="module")
def plain_build(tmp_path_factory, sample_rollouts) -> tuple:
    """The 24 rollouts built with the default options, once for the module; the tests
    that only read the default build share it (and must not write into it)."""
    tmp = tmp_path_factory.mktemp("plain")
    return build(tmp, [_clean(tmp, sample_rollouts)])


def test_advantages_are_per_rollout_and_sum_to_zero_per_task(plain_build):
    out, result = plain_build
    con = duckdb.connect()
    per_rollout = con.execute(f"""
        SELECT task_id, rollout_id, min(advantage) AS a, max(advantage) AS b, any_value(group_size) AS g
        FROM read_parquet('{out}/train-*.parquet') GROUP BY ALL""").fetchall()
    assert all(a == b for _, _, a, b, _ in per_rollout)  # one value per rollout, all segments
    sums = con.execute(f"""
        SELECT task_id, sum(a) FROM (SELECT task_id, rollout_id, any_value(advantage) a
        FROM read_parquet('{out}/train-*.parquet') GROUP BY ALL) GROUP BY task_id""").fetchall()
    assert all(abs(s) < 1e-4 for _, s in sums)
    assert result.group_of_one == 1
    alone = [a for t, _, a, _, g in per_rollout if t == "task-alone"]
    assert alone == [0.0]
    assert sum(1 for *_, a, _, _ in per_rollout if a != 0) > 0


def test_more_segments_never_change_a_rollouts_advantage(tmp_path, sample_rollouts):
    # Two tasks of the sample: one with rewards 1, 0, 1, 1 (advantages that are not zero)
    # and three of its rollouts reasoning, one all 0. The reasoning-dropping template
    # renders every call in full, so the 24 rollouts cost ~4x as much for the same claim.
    items = sample_rollouts[4:12]
    assert len({r.task_id for r in items}) == 2
    src = _clean(tmp_path, items)
    plain, _ = build(tmp_path, [src], name="plain")
    split, result = build(
        tmp_path, [src], name="split", chat_template="chatml-tools-drop-reasoning"
    )
    assert result.seams.get("template", 0) > 0
    q = "SELECT rollout_id, any_value(advantage), count(*) FROM read_parquet('{}/train-*.parquet') GROUP BY 1 ORDER BY 1"
    a = duckdb.sql(q.format(plain)).fetchall()
    b = duckdb.sql(q.format(split)).fetchall()
    assert [(r, adv) for r, adv, _ in a] == [(r, adv) for r, adv, _ in b]
    assert any(adv != 0 for _, adv, _ in a)
    assert sum(n for *_, n in b) > sum(n for *_, n in a)


def test_trainable_tokens_after_and_loss_weights_are_consistent(plain_build):
    out, _ = plain_build
    df = pl.read_parquet(sorted(out.glob("train-*.parquet")))
    for (_rid,), group in df.group_by(["rollout_id"]):
        group = group.sort("segment_index")
        n = group["num_trainable_tokens"].to_list()
        assert group["trainable_tokens_after"].to_list() == [sum(n[i + 1 :]) for i in range(len(n))]
        assert set(group["rollout_trainable_tokens"].to_list()) == {sum(n)}
        assert np.allclose(group["loss_weight_per_rollout"].to_numpy(), 1 / len(group))
        assert group["segment_index"].to_list() == list(range(len(group)))
    for ids, mask, n in zip(df["input_ids"], df["loss_mask"], df["num_trainable_tokens"]):
        assert len(ids) == len(mask) and sum(mask) == n


def test_canonical_inputs_in_gzip_zstd_and_parquet_give_identical_shards(
    tmp_path, sample_rollouts, plain_build
):
    import zstandard

    plain = _clean(tmp_path, sample_rollouts)
    gz = tmp_path / "r.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    zst = tmp_path / "r.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    parquet = tmp_path / "r.parquet"
    write_canonical_parquet(sample_rollouts, parquet)
    assert plain.read_bytes() == (plain_build[0].parent / "clean.jsonl").read_bytes()
    base = _rows(plain_build[0])
    for i, path in enumerate((gz, zst, parquet)):
        assert _rows(build(tmp_path, [path], name=f"o{i + 1}")[0]) == base


def test_workers_and_chunking_do_not_change_a_single_byte(tmp_path, sample_rollouts):
    # 8 rollouts three times (18.6 MB planned in 16 KB ranges; each id read three times)
    src = _clean(tmp_path, sample_rollouts[:8] * 3)
    one, _ = build(tmp_path, [src], name="w1")
    out = tmp_path / "w2"
    run_build(
        BuildConfig(inputs=[str(src)], out=str(out), progress=False, workers=2, chunk_bytes=1 << 14)
    )
    chunked_manifest = json.loads((out / "manifest.json").read_text())
    assert _rows(one) == _rows(out)
    again, _ = build(tmp_path, [src], name="w1-again")
    for shard in json.loads((one / "manifest.json").read_text())["shards"]:
        assert (one / shard).read_bytes() == (again / shard).read_bytes()
    assert chunked_manifest["counts"] == json.loads((one / "manifest.json").read_text())["counts"]


def test_bad_configuration_fails_fast_with_one_line(tmp_path, sample_rollouts):
    from pipeline.core.tokenizer import TokenizerError
    from pipeline.sources.files import InputError

    src = _clean(tmp_path, sample_rollouts[:2])
    with pytest.raises(InputError, match="does not exist"):
        build(tmp_path, [tmp_path / "missing.jsonl"])
    with pytest.raises(TokenizerError, match="not a directory"):
        build(tmp_path, [src], tokenizer=str(tmp_path / "no-such-tokenizer"))
    out, _ = build(tmp_path, [src], name="taken")
    with pytest.raises(BuildError, match="different build"):
        build(tmp_path, [src], name="taken", mask_summaries=True)
    with pytest.raises(BuildError, match="in use by another seam build"), OutputLock(out):
        build(tmp_path, [src], name="taken")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(BuildError, match="holds files seam did not write"):
        build(tmp_path, [src], name="foreign")
    with pytest.raises(BuildError, match="holds files seam did not write"):
        build(tmp_path, [src], name="foreign", overwrite=True)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_rerun_of_a_finished_build_is_up_to_date(tmp_path, sample_rollouts):
    src = _clean(tmp_path, sample_rollouts[:4])
    out, first = build(tmp_path, [src])
    _, second = build(tmp_path, [src])
    assert second.up_to_date and second.counts == first.counts
    # no lock, no temporary files, no parts left: only the record of what seam wrote
    assert [p.name for p in out.glob(".*")] == [".seam-written"]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(rollouts(), min_size=1, max_size=5), st.lists(st.binary(max_size=60), max_size=4))
def test_read_equals_accepted_plus_quarantined_for_any_mix(tmp_path_factory, items, junk):
    tmp = tmp_path_factory.mktemp("mix")
    items = [r.model_copy(update={"rollout_id": f"r{i}"}) for i, r in enumerate(items)]
    lines = [rollout_to_json(r) for r in items] + [
        j.replace(b"\n", b" ") for j in junk if j.strip()
    ]
    src = tmp / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    out, result = build(tmp, [src])
    c = result.counts
    assert c["read"] == len(lines) == c["accepted"] + c["quarantined"]
    assert c["accepted"] >= len(items)
    assert len((out / "quarantine.jsonl").read_text().splitlines()) == c["quarantined"]


@pytest.mark.slow
def test_a_compressed_file_is_split_into_ranges_fed_in_order_with_exact_line_numbers(
    tmp_path, sample_rollouts
):
    import zstandard

    from pipeline.sources.canonical_io import RangeFeeder, iter_jsonl_lines
    from pipeline.sources.files import plan_tasks

    plain = tmp_path / "mixed.jsonl"
    write_rollouts(plain, sample_rollouts[:12], broken={9: b'{"rollout_id": "cut", "task_id"'})
    data = plain.read_bytes()
    sources = {
        ".jsonl.gz": gzip.compress(data),
        ".jsonl.zst": zstandard.ZstdCompressor().compress(data),
    }
    reference, _ = build(tmp_path, [plain], name="plain")
    for suffix, blob in sources.items():
        src = tmp_path / f"mixed{suffix}"
        src.write_bytes(blob)
        tasks = plan_tasks([src], "auto", 1 << 14)
        assert len(tasks) > 3 and tasks[0].start == 0 and tasks[-1].end is None
        assert all(a.end == b.start for a, b in zip(tasks, tasks[1:]))
        feeder = RangeFeeder()
        pieces = [feeder.data_for(str(src), t.start, t.end) for t in tasks]
        feeder.close()
        assert b"".join(pieces) == data and all(p.endswith(b"\n") for p in pieces)
        assert [p.count(b"\n") for p in pieces] == [
            b.first_line - a.first_line for a, b in zip(tasks, tasks[1:])
        ] + [data.count(b"\n") + 1 - tasks[-1].first_line]
        # A worker that is not fed its range reads the stream itself: same records.
        whole = [(r.line, r.data) for r in iter_jsonl_lines(plain)]
        assert [
            (r.line, r.data)
            for t in tasks
            for r in iter_jsonl_lines(src, t.start, t.end, t.first_line)
        ] == whole
        for workers in (1, 2):
            out = tmp_path / f"out{suffix}{workers}"
            run_build(
                BuildConfig(
                    inputs=[str(src)],
                    out=str(out),
                    progress=False,
                    workers=workers,
                    chunk_bytes=1 << 14,
                )
            )
            assert _rows(out) == _rows(reference)
            entries = [
                json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()
            ]
            assert [(e["line"], e["file"]) for e in entries] == [(10, str(src))]


def test_a_canonical_parquet_file_is_split_by_row_groups_with_exact_row_numbers(
    tmp_path, sample_rollouts
):
    from pipeline.sources.files import plan_tasks

    plain = tmp_path / "mixed.jsonl"
    write_rollouts(plain, sample_rollouts[:12])
    reference, _ = build(tmp_path, [plain], name="plain")
    src = tmp_path / "r.parquet"
    write_canonical_parquet(sample_rollouts[:12], src, rows_per_group=2)
    tasks = plan_tasks([src], "auto", 1 << 14)
    assert len(tasks) > 2 and tasks[0].start == 0 and tasks[-1].end == 6
    assert all(a.end == b.start for a, b in zip(tasks, tasks[1:]))
    assert [t.first_line for t in tasks] == [2 * t.start + 1 for t in tasks]
    for workers in (1, 2):
        out = tmp_path / f"pq{workers}"
        result = run_build(
            BuildConfig(
                inputs=[str(src)],
                out=str(out),
                progress=False,
                workers=workers,
                chunk_bytes=1 << 14,
            )
        )
        assert _rows(out) == _rows(reference) and result.counts["read"] == 12
