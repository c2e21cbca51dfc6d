"""Bad content never escapes a reader: every fixture, with values swapped for values of
the wrong type, reads to Accepted / Rejected / Skipped items; damaged files too."""

import gzip
import json
import random

import pytest

from pipeline.readers import REGISTRY, Accepted, Rejected, Skipped
from tests.readers.util import FIXTURES, read

WRONG = [None, 0, -1, 2.5, "", "x", [], {}, [1], {"a": 1}, True, [None], [{}], {"type": "text"}]
FIXTURE_FILES = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name != "result.json")


def scramble(value, rng: random.Random, rate: float):
    if isinstance(value, dict):
        return {
            k: rng.choice(WRONG) if rng.random() < rate else scramble(v, rng, rate)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [rng.choice(WRONG) if rng.random() < rate else scramble(v, rng, rate) for v in value]
    return value


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_values_of_the_wrong_type_are_rejected_not_raised(path, tmp_path):
    fmt = path.relative_to(FIXTURES).parts[0].replace("_", "-")
    rng = random.Random(path.name)
    for attempt in range(12):
        out = tmp_path / f"{attempt}-{path.name}"
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            out.write_text("\n".join(json.dumps(scramble(r, rng, 0.15)) for r in rows) + "\n")
        else:
            out.write_text(json.dumps(scramble(json.loads(path.read_text()), rng, 0.15)))
        items = list(REGISTRY[fmt].read(out))
        assert all(isinstance(i, (Accepted, Rejected, Skipped)) for i in items)


def test_a_truncated_archive_keeps_what_was_read_and_rejects_the_rest(tmp_path):
    data = gzip.compress((FIXTURES / "codex" / "two_sessions.jsonl").read_bytes())
    path = tmp_path / "rollout.jsonl.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    rollouts, rejected, _ = read("codex", path)
    assert any(r.reason.startswith("cannot read past line") for r in rejected)


def test_a_json_file_that_is_not_json_is_one_rejection(tmp_path):
    path = tmp_path / "trajectory.json"
    path.write_text('{"schema_version": "ATIF-v1.7", "steps": [')
    rollouts, rejected, _ = read("atif", path)
    assert not rollouts and rejected[0].reason.startswith("cannot read ATIF file: invalid JSON")
