"""The independent labelled set of real compactions (judge/labels/real_compactions.jsonl).

Checks that every label validates, that the split is the documented hash rule, and —
for labels whose session files the project keeps under ``../shared`` — that each
labelled compaction and each piece of evidence is where the label says. The set's
size rules (docs/labels.md) are counted here too.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from judge.calibration import CompactionLabel, Evidence, load_labels

ROOT = Path(__file__).resolve().parents[2]
LABELS = ROOT / "judge" / "labels" / "real_compactions.jsonl"
sys.path.insert(0, str(ROOT / "tools"))
import restore_labels  # noqa: E402

SHARED_DIRS = {
    "realworld": os.environ.get("SEAM_REALWORLD_DIR"),
    "realworld-new": os.environ.get("SEAM_REALWORLD_NEW_DIR"),
}


@pytest.fixture(scope="module")
def labels() -> list[CompactionLabel]:
    return load_labels(str(LABELS))


def is_defect(label: CompactionLabel) -> bool:
    """A labelled defect: a summary fault or a continuation problem (docs/labels.md)."""
    return bool(
        label.omitted
        or label.invented_paths
        or label.contradiction
        or label.wrong_state
        or label.next_step == "missing"
        or label.next_step_correct is False
        or label.continuation in ("redo", "ignores")
    )


def hash_split(session: str) -> str:
    """The split rule, fixed before any tuning: holdout when the first 8 hex digits of
    sha256(session id) are divisible by 3."""
    return (
        "holdout" if int(hashlib.sha256(session.encode()).hexdigest()[:8], 16) % 3 == 0 else "tune"
    )


def test_every_label_has_provenance(labels: list[CompactionLabel]) -> None:
    for label in labels:
        assert label.session and label.split and label.source, label.uuid
        assert all(len(s.commit) == 40 for s in label.source), label.uuid
        assert all(ev.file == label.file for ev in label.evidence), label.uuid


def test_split_is_the_hash_rule(labels: list[CompactionLabel]) -> None:
    assert all(label.split == hash_split(label.session or "") for label in labels)


def test_labels_are_unique_per_boundary(labels: list[CompactionLabel]) -> None:
    keys = [(label.session, label.uuid) for label in labels]
    assert len(keys) == len(set(keys))


def test_every_positive_has_evidence(labels: list[CompactionLabel]) -> None:
    for label in labels:
        assert bool(label.evidence) == is_defect(label), label.uuid


def test_evidence_needs_a_location() -> None:
    with pytest.raises(ValidationError, match="uuid or a line"):
        Evidence(what="x", file="f.jsonl")
    assert Evidence(what="x", file="f.jsonl", line=3).line == 3


def _shared_file(label: CompactionLabel) -> Path | None:
    shared = label.source[0].shared
    if not shared:
        return None
    top, rest = shared.split("/", 1)
    base = SHARED_DIRS.get(top)
    return Path(base) / rest if base else None


def _records(path: Path) -> dict[str, dict]:
    """Claude Code records by uuid (a JSONL line that is not JSON is skipped)."""
    out = {}
    for raw in path.read_bytes().splitlines():
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("uuid"):
            out[record["uuid"]] = record
    return out


def test_shared_labels_point_at_real_records(labels: list[CompactionLabel]) -> None:
    """Each label on a file in ../shared names an isCompactSummary record of the
    labelled session, and each evidence uuid is a record of that file."""
    checked = 0
    for label in labels:
        path = _shared_file(label)
        if path is None:
            continue
        if not path.is_file():
            pytest.fail(f"{label.file}: shared copy {path} is missing")
        records = _records(path)
        summary = records.get(label.uuid)
        assert summary is not None and summary.get("isCompactSummary"), label.uuid
        assert summary.get("sessionId") == label.session
        for ev in label.evidence:
            assert ev.uuid in records, (label.uuid, ev)
        checked += 1
    if not checked:
        pytest.skip("SEAM_REALWORLD_DIR / SEAM_REALWORLD_NEW_DIR not set")


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, check=True, text=True
    )
    return done.stdout.strip()


def test_restore_writes_files_and_the_restored_labels(tmp_path: Path, monkeypatch) -> None:
    """tools/restore_labels.py against a real git repository: a file from the clone, a
    file from the shared copy, and a label it cannot restore (named, not written)."""
    repo = tmp_path / "clone"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "ab").mkdir()
    (repo / "ab" / "full.jsonl").write_bytes(b'{"uuid":"u1"}\n')
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    commit = _git(repo, "rev-parse", "HEAD")
    shared = tmp_path / "realworld" / "claude_code"
    shared.mkdir(parents=True)
    (shared / "s.jsonl").write_bytes(b'{"uuid":"u2"}\n')
    monkeypatch.setenv("SEAM_REALWORLD_DIR", str(tmp_path / "realworld"))

    def lab(file: str, repo_name: str, path: str, shared_rel: str | None = None) -> dict:
        return {
            "file": file, "uuid": "u", "trigger": "budget", "history_complete": True,
            "omitted": [], "next_step": "present", "next_step_correct": True,
            "invented_paths": 0, "contradiction": False, "wrong_state": False,
            "continuation": "follows", "policy_trigger": None, "session": "s", "split": "tune",
            "source": [{"repo": repo_name, "commit": commit, "path": path, "shared": shared_rel}],
        }  # fmt: skip

    labels_path = tmp_path / "labels.jsonl"
    labels_path.write_bytes(
        b"".join(
            orjson.dumps(x) + b"\n"
            for x in [
                lab("claude_code/a.jsonl", "o/r", "ab/full.jsonl"),
                lab("claude_code/s.jsonl", "o/other", "x", "realworld/claude_code/s.jsonl"),
                lab("claude_code/gone.jsonl", "o/absent", "x"),
                lab("claude_code/bad.jsonl", "o/r", "no/such/path"),
            ]
        )
    )
    out = tmp_path / "out"
    assert restore_labels.main([str(labels_path), str(out), "--clone", f"o/r={repo}"]) == 0
    assert (out / "claude_code" / "a.jsonl").read_bytes() == b'{"uuid":"u1"}\n'
    assert (out / "claude_code" / "s.jsonl").read_bytes() == b'{"uuid":"u2"}\n'
    assert not (out / "claude_code" / "gone.jsonl").exists()
    kept = load_labels(str(out / "labels.jsonl"))
    assert [label.file for label in kept] == ["claude_code/a.jsonl", "claude_code/s.jsonl"]


def test_the_set_is_big_enough(labels: list[CompactionLabel]) -> None:
    """docs/labels.md: at least 60 compactions, 15 with a defect; a holdout part of at
    least 20 with at least 5 defects."""
    holdout = [label for label in labels if label.split == "holdout"]
    assert len(labels) >= 60
    assert sum(map(is_defect, labels)) >= 15
    assert len(holdout) >= 20
    assert sum(map(is_defect, holdout)) >= 5


@pytest.mark.skipif(
    not all(SHARED_DIRS.values()), reason="SEAM_REALWORLD_DIR / SEAM_REALWORLD_NEW_DIR not set"
)
def test_eval_finds_every_label_of_the_shared_part_and_the_defaults_raise_no_flag(
    tmp_path: Path,
) -> None:
    """What CI can run (docs/labels.md): the labels whose files are in ../shared, restored
    without a clone and scored by --eval's scoring; every label is found by session and
    uuid, and no check on by default flags any of them."""
    from collections import Counter

    from judge.calibration import evaluate
    from judge.rules import DEFAULT_CHECKS, judge_rollout
    from pipeline.cli.judge import iter_input_sources

    restore_labels.main([str(LABELS), str(tmp_path)])
    restored = load_labels(str(tmp_path / "labels.jsonl"))
    assert len(restored) == 8
    sources = list(iter_input_sources([str(tmp_path / "claude_code")], "auto", Counter()))
    result = evaluate(restored, sources, lambda rollout: judge_rollout(rollout, DEFAULT_CHECKS))
    assert result.labelled == 8 and result.missing == []
    assert all(result.scores[c].as_dict()["flags"] == 0 for c in DEFAULT_CHECKS)
