"""``fidelity.REASONS`` is the one vocabulary of context_fidelity: every reader's output
names only its reasons, the docs list each one, and a rollout naming another reason is
quarantined with a line naming it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from pipeline.core.fidelity import EXACT, REASONS, entries
from pipeline.inspect.verify import iter_input_records
from tests.core.test_fidelity import _build, _with
from tests.core.test_segments_hand_checked import three_call_rollout

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "raw"


def _real_dirs() -> list[Path]:
    found = []
    for var in ("SEAM_REALWORLD_DIR", "SEAM_REALWORLD_NEW_DIR"):
        root = os.environ.get(var)
        if root and Path(root).is_dir():
            found.append(Path(root))
    return found


def _reasons_read_from(root: Path) -> set[str]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".md")
    return {
        str(e["reason"]) for _, _, rollout in iter_input_records(files) for e in entries(rollout)
    }


def test_every_reader_names_only_known_reasons_on_the_fixtures():
    found = _reasons_read_from(FIXTURES)
    assert found, "the fixtures exercise no fidelity reason at all"
    assert found <= REASONS.keys(), found - REASONS.keys()


@pytest.mark.skipif(not _real_dirs(), reason="SEAM_REALWORLD_DIR / _NEW_DIR not set")
def test_every_reader_names_only_known_reasons_on_the_real_files():
    for root in _real_dirs():
        found = _reasons_read_from(root)
        assert found <= REASONS.keys(), (root, found - REASONS.keys())


def test_the_docs_list_every_reason():
    data = (ROOT / "docs" / "data.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", data.split("## Context fidelity")[1], re.M))
    assert REASONS.keys() <= documented, REASONS.keys() - documented
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `context_fidelity`"))
    assert all(f"`{reason}`" in row for reason in REASONS), row
    assert EXACT not in REASONS


def test_a_rollout_naming_an_unknown_reason_is_quarantined_with_the_reason(tmp_path):
    made_up = {"reason": "felt_wrong", "event_id": None, "detail": "?"}
    bad = _with(three_call_rollout(rollout_id="bad"), {"fidelity": [made_up]})
    result, rows, quarantine = _build(tmp_path, [three_call_rollout(rollout_id="good"), bad])
    assert {r["rollout_id"] for r in rows} == {"good"}
    [entry] = quarantine
    assert entry["reason"].startswith(
        "rollout bad: context fidelity reason(s) 'felt_wrong' not known to seam "
        "(pipeline/core/fidelity.py REASONS: slice_start, "
    )
    assert json.dumps(entry)  # one JSON line, as every quarantine entry
    assert result.counts["quarantined"] == 1
