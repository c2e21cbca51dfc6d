"""``seam ingest`` writes like a build: under the output lock, through temporary names,
never over files it did not write, and every failure is one line with an exit code."""

from __future__ import annotations

import json
import random
from pathlib import Path

from pipeline.build.run import OutputLock
from pipeline.cli import main
from pipeline.readers import REGISTRY, Accepted, Reader
from pipeline.sources.canonical_io import parse_rollout
from tests.robustness.records import good_record, line

FIXTURES = Path(__file__).parents[1] / "fixtures" / "raw"


def _inputs(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(5)
    path = directory / "a.jsonl"
    path.write_bytes(b"".join(line(good_record(rng, f"r{i}", "t")) + b"\n" for i in range(3)))
    return path


def ingest(*args) -> int:
    return main(["ingest", "--no-progress", *map(str, args)])


def test_a_second_ingest_into_a_directory_in_use_is_refused(tmp_path, capsys):
    src = _inputs(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    with OutputLock(out):  # an ingest (or build) running there
        assert ingest(src, "--out", out) == 2
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # the holder's, untouched
    assert "in use by another seam build" in capsys.readouterr().err
    assert ingest(src, "--out", out) == 0  # once it is free
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_ingest_refuses_out_over_inputs_or_foreign_files_and_overwrites_only_its_own(tmp_path):
    src = _inputs(tmp_path / "proj" / "data")
    (tmp_path / "proj" / "NOTES.md").write_text("mine")
    for out in (tmp_path / "proj", tmp_path / "proj" / "data"):
        assert ingest(tmp_path / "proj" / "data", "--out", out, "--overwrite") == 2
    assert (tmp_path / "proj" / "NOTES.md").read_text() == "mine" and src.exists()
    out = tmp_path / "out"
    assert ingest(src, "--out", out) == 0
    assert ingest(src, "--out", out) == 2  # exists: --overwrite needed
    (out / "NOTES.md").write_text("mine")
    assert ingest(src, "--out", out, "--overwrite") == 2
    (out / "NOTES.md").unlink()
    assert ingest(src, "--out", out, "--overwrite") == 0
    assert json.loads((out / "ingest.json").read_text())["total"]["accepted"] == 3


def test_a_deeply_nested_record_is_quarantined_and_the_rest_ingested(tmp_path):
    src = _inputs(tmp_path / "in")
    rows = src.read_bytes().splitlines()
    deep = '{"a": ' * 1000 + "1" + "}" * 1000  # orjson refuses past 1024 levels
    shallow_but_deep = "[" * 300 + "1" + "]" * 300  # parses, over --max-depth
    rows[0] = rows[0][:-1] + b', "meta": {"x": ' + deep.encode() + b"}}"
    rows[1] = rows[1][:-1] + b', "meta": {"x": ' + shallow_but_deep.encode() + b"}}"
    src.write_bytes(b"\n".join(rows) + b"\n")
    out = tmp_path / "out"
    assert ingest(src, "--out", out) == 0
    summary = json.loads((out / "ingest.json").read_text())
    assert summary["total"]["accepted"] == 1 and summary["total"]["rejected"] == 2
    reasons = [json.loads(q)["reason"] for q in (out / "quarantine.jsonl").open()]
    assert "depth" in reasons[0] and "max_depth" in reasons[1]


class _LossyReader(Reader):
    """A reader with the bug the lines check exists for: it reads a three-line file and
    accounts for one line."""

    name = "lossy-test-reader"

    def sniff(self, path, head):
        return False

    def read(self, path):
        first = path.read_bytes().splitlines()[0]
        yield Accepted(parse_rollout(first), line=1, records=1)


def test_lines_left_unaccounted_for_fail_the_ingest(tmp_path, capsys):
    src = _inputs(tmp_path / "in")
    REGISTRY[_LossyReader.name] = _LossyReader()
    try:
        code = ingest(src, "--out", tmp_path / "out", "--format", _LossyReader.name)
    finally:
        del REGISTRY[_LossyReader.name]
    assert code == 1
    assert "2 input line(s) ended in no rollout" in capsys.readouterr().err


def test_a_flood_of_bad_lines_leaves_a_bounded_ingest_quarantine(tmp_path, capsys):
    """seam ingest wrote every entry with its raw text, without caps (the build's were
    added first): 20,000 ``{}`` lines now leave a sample within the caps and the exact
    count of the rest in ingest.json."""
    from tests.robustness.test_memory_bombs import _good, _write_zst

    rng = random.Random(3)
    flood = 20_000
    path = tmp_path / "flood.jsonl.zst"
    _write_zst(path, [_good(rng, "first"), b"{}\n" * flood, _good(rng, "last")])
    out = tmp_path / "out"
    caps = ["--max-quarantine-entries", "300", "--max-quarantine-mb", "0.0625"]
    assert ingest(path, "--out", out, *caps) == 0
    written = (out / "quarantine.jsonl").read_bytes()
    entries = written.count(b"\n")
    assert 0 < entries <= 300 and len(written) <= 64 << 10
    total = json.loads((out / "ingest.json").read_text())["total"]
    assert total["rejected"] == flood and total["accepted"] == 2
    assert total["quarantine_not_written"] == flood - entries
    assert f"{flood - entries:,} quarantine entries not written" in capsys.readouterr().out
