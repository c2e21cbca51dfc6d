"""`seam verify`: the mask audit passes on real builds and names the row of any mismatch."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from pipeline.inspect.verify import verify_build

REALWORLD = os.environ.get("SEAM_REALWORLD_DIR")


def _copy(build: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(build, copy)
    return copy


def _edit_row(build: Path, rollout_id: str, segment: int, edit) -> tuple[str, int]:
    """Apply ``edit(row)`` to one shard row in place; returns (shard name, row index)."""
    manifest = json.loads((build / "manifest.json").read_text())
    for name in manifest["shards"]:
        table = pq.read_table(build / name)
        rows = table.to_pylist()
        for i, row in enumerate(rows):
            if row["rollout_id"] == rollout_id and row["segment_index"] == segment:
                edit(row)
                pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), build / name)
                return name, i
    raise AssertionError(f"no row {rollout_id}/{segment}")


def test_verify_passes_on_rl_and_sft_builds_and_records_counts(
    rl_build, sft_build, tmp_path, capsys
):
    for build in (rl_build, sft_build):
        copy = _copy(build, tmp_path / build.parent.name)
        assert main(["verify", str(copy)]) == 0
        manifest = json.loads((copy / "manifest.json").read_text())
        recorded = manifest["verify"]
        assert recorded["mode"] == "all" and recorded["ok"] and recorded["mismatches"] == []
        rows = sum(pq.read_metadata(copy / s).num_rows for s in manifest["shards"])
        assert recorded["totals"]["rows"] == rows and recorded["totals"]["mismatches"] == 0
    out = capsys.readouterr().out
    assert "verified 6 rollout(s)" in out  # the RL build: 6 accepted rollouts, all checked


def test_rl_counts_per_rollout_and_source(rl_build):
    result = verify_build(rl_build, "all")
    assert result.ok
    assert set(result.by_rollout) == {"a0", "a1", "a2", "a3", "b0", "b1"}
    # two_compactions: 5 calls in 3 segments; no_compaction: 2 calls in 1 segment.
    assert dict(result.by_rollout["a2"]) | {"trained_tokens": 0} == {
        "rows": 3,
        "spans": 5,
        "mismatches": 0,
        "trained_tokens": 0,
    }
    assert result.by_rollout["a0"]["rows"] == 1 and result.by_rollout["a0"]["spans"] == 2
    assert result.by_source["test"]["rollouts"] == 6


def test_one_flipped_loss_mask_bit_fails_naming_the_row(rl_build, tmp_path, capsys):
    copy = _copy(rl_build, tmp_path)

    def flip(row):
        row["loss_mask"][3] = 1 - row["loss_mask"][3]  # a system-prompt token ("You")

    shard, index = _edit_row(copy, "a2", 1, flip)
    assert main(["verify", str(copy)]) == 1
    out = capsys.readouterr().out
    assert (
        f"MISMATCH {shard} row {index} (rollout a2 segment 1): loss_mask[3] = 1, should be 0 "
        "(token 2610 'You')" in out
    )
    assert json.loads((copy / "manifest.json").read_text())["verify"]["ok"] is False


def test_a_changed_trained_token_and_a_changed_context_token_are_both_found(rl_build, tmp_path):
    copy = _copy(rl_build, tmp_path)

    def change(row):
        span = row["call_spans"][0]
        row["input_ids"][span["start"]] = 40  # another token inside the first output
        row["input_ids"][5] = 41  # and one in the system prompt

    _edit_row(copy, "a1", 0, change)
    result = verify_build(copy, "all")
    whats = [m.what for m in result.mismatches]
    assert any(w.startswith("call 0: trained span decodes to") for w in whats), whats
    assert any(w.startswith("call 0: the context differs from the rollout's") for w in whats), whats
    assert {m.rollout_id for m in result.mismatches} == {"a1"}


def test_logged_output_ids_are_compared_as_ids(rl_build, tmp_path):
    copy = _copy(rl_build, tmp_path)

    def change(row):
        span = row["call_spans"][-1]
        row["input_ids"][span["start"] + 1] += 1

    _edit_row(copy, "b0", 0, change)
    whats = [m.what for m in verify_build(copy, "all").mismatches]
    assert any("differ from the logged output_ids at token 1" in w for w in whats), whats


def test_a_changed_input_stops_the_audit_with_one_line(rl_build, tmp_path, capsys):
    copy = _copy(rl_build, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    moved = tmp_path / "in.jsonl"
    moved.write_text(Path(manifest["inputs"][0]["path"]).read_text() + "\n")
    manifest["inputs"][0]["path"] = str(moved)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["verify", str(copy)]) == 2
    assert "changed since the build (sha256 differs)" in capsys.readouterr().err


def test_build_rl_audits_a_sample_by_default(rl_build, tmp_path):
    source = rl_build.parent / "in.jsonl"
    out = tmp_path / "out"
    argv = ["build-rl", str(source), "--out", str(out), "--workers", "1", "--no-progress"]
    assert main(argv) == 0
    recorded = json.loads((out / "manifest.json").read_text())["verify"]
    assert recorded["mode"] == "sample" and recorded["ok"]
    assert recorded["totals"]["rollouts"] == 6  # a sample covers at least 16 rollouts
    argv[argv.index(str(out))] = str(tmp_path / "unverified")
    assert main([*argv, "--verify", "none"]) == 0
    assert "verify" not in json.loads((tmp_path / "unverified" / "manifest.json").read_text())


@pytest.mark.slow
@pytest.mark.skipif(not REALWORLD, reason="SEAM_REALWORLD_DIR is not set")
def test_verify_passes_on_real_claude_code_and_codex_sessions(tmp_path, capsys):
    real = Path(REALWORLD)
    inputs = [
        real / "claude_code" / "real-entireio-cli_44-785715c3f5_2_full.jsonl",
        real / "codex" / "agentv_rollout-00-34f597b72d-1.jsonl",
    ]
    out = tmp_path / "out"
    keep = ["--keep-malformed", "--keep-summary-loops"]  # train on everything: audit it all
    argv = ["build-sft", *map(str, inputs), "--out", str(out), *keep, "--no-progress"]
    assert main([*argv, "--verify", "all"]) == 0
    recorded = json.loads((out / "manifest.json").read_text())["verify"]
    assert set(recorded["by_source"]) == {"claude-code", "codex"}
    assert recorded["totals"]["spans"] > 10 and recorded["totals"]["mismatches"] == 0


def test_a_wrong_context_fidelity_is_a_mismatch(rl_build, tmp_path):
    copy = _copy(rl_build, tmp_path)

    def claim(row):
        row["context_fidelity"] = ["slice_start"]  # the rollout records nothing missing

    shard, index = _edit_row(copy, "a3", 1, claim)
    [mismatch] = verify_build(copy, "all").mismatches
    assert (mismatch.shard, mismatch.row, mismatch.rollout_id) == (shard, index, "a3")
    assert mismatch.what == "context_fidelity ['slice_start'], the rollout says ['exact']"


def test_per_rollout_counts_are_printed_on_request(rl_build, tmp_path, capsys):
    copy = _copy(rl_build, tmp_path)
    assert main(["verify", str(copy), "--per-rollout"]) == 0
    out = capsys.readouterr().out
    assert "per rollout" in out and re.search(r"a2\s+│\s+3\s+│\s+5\s+│", out), out


def test_verify_reads_a_chat_completions_log_grouped_as_the_build_grouped_it(tmp_path, capsys):
    from tests.readers.util import fixture

    out = tmp_path / "out"
    log = fixture("chat_completions", "gateway_log.jsonl")
    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text('{"rollout_id": "qwen3-8b", "reward": 1}\n')
    argv = ["build-rl", str(log), "--out", str(out), "--group-by", "request.model"]
    argv += ["--rewards", str(rewards)]
    assert main([*argv, "--workers", "1", "--no-progress", "--verify", "none"]) == 0
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    recorded = json.loads((out / "manifest.json").read_text())["verify"]
    assert recorded["ok"] and recorded["totals"]["rollouts"] == 1  # the rollout "qwen3-8b"


def test_verify_reads_the_inputs_under_the_limits_the_build_used(
    rl_build, tmp_path, capsys, monkeypatch
):
    from pipeline.sources import limits

    lines = (rl_build.parent / "in.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    deep: dict = {}
    for _ in range(150):  # deeper than the default --max-depth (100), within the build's 300
        deep = {"d": deep}
    lines[0] = json.dumps({**first, "meta": deep})
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = ["build-rl", str(source), "--out", str(out), "--max-depth", "300"]
    assert main([*argv, "--workers", "1", "--no-progress", "--verify", "none"]) == 0
    capsys.readouterr()
    assert limits.current() == limits.Limits()  # the build left nothing set for verify
    assert main(["verify", str(out)]) == 0
    assert "verified 6 rollout(s)" in capsys.readouterr().out  # the deep one among them


def _drop_rows(build: Path, rollout_id: str) -> None:
    manifest = json.loads((build / "manifest.json").read_text())
    for name in manifest["shards"]:
        table = pq.read_table(build / name)
        kept = [r for r in table.to_pylist() if r["rollout_id"] != rollout_id]
        pq.write_table(pa.Table.from_pylist(kept, schema=table.schema), build / name)


def test_a_rollout_that_vanished_without_a_counted_reason_is_a_mismatch(rl_build, tmp_path):
    copy = _copy(rl_build, tmp_path)
    _drop_rows(copy, "a2")  # line 6 of in.jsonl (after a0, a1 and the three broken lines)
    result = verify_build(copy, "all")
    lines = [m.line() for m in result.mismatches]
    assert lines == [
        f"{rl_build.parent / 'in.jsonl'}:6 (rollout a2): no rows and no quarantine entry: the "
        "build lost it without a counted reason (1 such input rollouts, the manifest counts 0 "
        "without rows)"
    ]
    assert verify_build(copy, "sample").ok  # only the full audit reads every input rollout


def test_a_rejected_rollout_is_accounted_for_by_its_quarantine_entry(sft_build, tmp_path):
    copy = _copy(sft_build, tmp_path)
    assert verify_build(copy, "all").ok  # "loop" was filtered: quarantined at its line
    entries = (copy / "quarantine.jsonl").read_text().splitlines()
    (loop,) = [e for e in entries if "summary" in json.loads(e)["reason"]]
    (copy / "quarantine.jsonl").write_text("".join(e + "\n" for e in entries if e != loop))
    (mismatch,) = verify_build(copy, "all").mismatches
    assert mismatch.rollout_id == "loop" and mismatch.shard.endswith("in.jsonl:3")


def test_rollouts_whose_segments_were_all_dropped_are_counted_not_lost(tmp_path, renderer):
    from pipeline.build.run import BuildConfig, run_build
    from tests.judge.rollouts import Story
    from tests.sample_builds import cut_at_max_tokens

    cut = Story("cut").say("Let me").build(reward=1.0)
    cut = cut_at_max_tokens(cut.model_copy(update={"events": cut.events[:-1]}))
    plain = Story("plain").say("Fixed it.").build(reward=0.0)
    (tmp_path / "in.jsonl").write_text(
        "\n".join(r.model_dump_json(exclude_none=True) for r in (cut, plain)) + "\n"
    )
    out = tmp_path / "out"
    result = run_build(
        BuildConfig(
            inputs=[str(tmp_path / "in.jsonl")],
            out=str(out),
            workers=1,
            progress=False,
            drop_truncated=True,
        )
    )
    assert result.counts["rollouts_without_segments"] == 1
    assert verify_build(out, "all").ok
    _drop_rows(out, "plain")  # now two rollouts have no rows, and the build counted one
    (mismatch,) = verify_build(out, "all").mismatches
    assert mismatch.rollout_id == "plain" and "the manifest counts 1 without rows" in mismatch.what


def test_relative_inputs_are_found_from_any_directory_while_build_and_inputs_stay_together(
    rl_build, tmp_path, monkeypatch, capsys
):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    shutil.copy(rl_build.parent / "in.jsonl", project / "data" / "in.jsonl")
    monkeypatch.chdir(project)
    argv = ["build-rl", "data/in.jsonl", "--out", "out", "--workers", "1", "--no-progress"]
    assert main([*argv, "--verify", "none"]) == 0
    (entry,) = json.loads((project / "out" / "manifest.json").read_text())["inputs"]
    assert entry["path"] == "data/in.jsonl" and entry["from_out"] == "../data/in.jsonl"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = verify_build(project / "out", "all")  # the quarantine names "data/in.jsonl"
    assert result.ok and result.totals()["rollouts"] == 6
    assert main(["show", str(project / "out"), "a1"]) == 0
    assert "not in the build's inputs" not in capsys.readouterr().out
    # moved together, they are still found; the input alone gone: one line saying where
    shutil.move(project, tmp_path / "moved")
    assert verify_build(tmp_path / "moved" / "out", "all").ok
    (tmp_path / "moved" / "data" / "in.jsonl").unlink()
    assert main(["verify", str(tmp_path / "moved" / "out")]) == 2
    err = capsys.readouterr().err
    assert "input data/in.jsonl of the build is gone (looked from here and from" in err


def test_row_text_slices_are_the_slices_decoded_alone_also_across_a_cut_character(renderer):
    """``_RowText`` hands out a slice of the row decoded once only where the pieces
    provably add up to the row (byte-level decoder, no U+FFFD); a cut inside a
    multi-byte character, or a U+FFFD in the text itself, decodes every slice alone."""
    from pipeline.inspect.verify import _pieces_add_up, _RowText

    cut_inside = 0
    for text in ("plain ascii, then a call", "naïve café — 🦜 parrot 𝔘 龘 ꙮ", "a \ufffd already"):
        tokens = renderer.encode(text).astype(np.int64)
        n = len(tokens)
        for cut in range(1, n):
            spans = [{"start": cut, "length": n - cut}]
            row = _RowText(renderer, tokens, spans)
            assert row.between(0, cut) == renderer.decode(tokens[:cut])
            assert row.between(cut, n) == renderer.decode(tokens[cut:])
            assert row.exact == (row.full == renderer.decode(tokens))
            if _pieces_add_up(renderer, row.full):
                assert row.full == renderer.decode(tokens)
            cut_inside += not row.exact
    assert cut_inside  # the emoji and the rare characters are byte tokens: some cuts split one


def test_names_one_of_finds_any_rollout_id_field_as_the_regex_does():
    from pipeline.inspect.verify import ROLLOUT_ID_FIELD, _names_one_of

    def by_regex(record: bytes, ids: set[str]) -> bool:
        for value in ROLLOUT_ID_FIELD.findall(record):
            try:
                if json.loads(value) in ids:
                    return True
            except ValueError:
                return True
        return False

    records = [
        b'{"rollout_id": "a", "meta": {"rollout_id": "b"}}',
        b'{"parent_rollout_id": "b", "rollout_id" :\t"c"}',
        b'"rollout_id""rollout_id": "b"',
        b'{"rollout_id": "a\\"b"}',
        b'{"rollout_id": "bad \\u12"}',
        b'{"rollout_id": 7, "x": "rollout_id"}',
        b'{"events": []}',
    ]
    for record in records:
        for ids in ({"a"}, {"b"}, {"c"}, {'a"b'}, set()):
            assert _names_one_of(record, ids) == by_regex(record, ids), (record, ids)


def test_rows_read_up_to_a_wanted_row_are_the_row_groups_rows(tmp_path):
    """``_read_rows_to`` stops at the batch holding the last wanted row: the rows it
    returns are the row group's, in order, with its schema (list and struct columns too)."""
    from pipeline.inspect.verify import ROWS_PER_BATCH, _read_rows_to

    n = 5 * ROWS_PER_BATCH + 3
    table = pa.table(
        {
            "rollout_id": [f"r{i}" for i in range(n)],
            "input_ids": [list(range(i % 7)) for i in range(n)],
            "call_spans": [[{"start": i, "trained": i % 2 == 0}] for i in range(n)],
        }
    )
    path = tmp_path / "s.parquet"
    pq.write_table(table, path, row_group_size=2 * ROWS_PER_BATCH + 1)
    with pq.ParquetFile(path) as f:
        columns = ["rollout_id", "input_ids", "call_spans"]
        for group in range(f.num_row_groups):
            whole = f.read_row_group(group, columns=columns)
            for last in range(whole.num_rows):
                got = _read_rows_to(f, group, last, columns)
                assert last < got.num_rows <= whole.num_rows
                assert got.schema == whole.schema
                assert got.equals(whole.slice(0, got.num_rows))
