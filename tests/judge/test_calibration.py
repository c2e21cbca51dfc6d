"""``seam judge --eval``: the rule judge scored against hand labels of compactions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from judge.calibration import CompactionLabel, evaluate, load_labels
from judge.rules import ALL_CHECKS, DEFAULT_CHECKS
from tests.readers.util import fixture, only

LABELS = Path(__file__).resolve().parents[2] / "judge" / "labels" / "claude_code_realworld.jsonl"
FIXTURE = fixture("claude_code", "judge_compactions.jsonl")
REAL = Path(os.environ["SEAM_REALWORLD_DIR"]) if os.environ.get("SEAM_REALWORLD_DIR") else None


def label(uuid: str, **changes) -> CompactionLabel:
    base = {
        "file": "claude_code/judge_compactions.jsonl",
        "uuid": uuid,
        "trigger": "budget",
        "history_complete": True,
        "omitted": [],
        "next_step": "present",
        "next_step_correct": True,
        "invented_paths": 0,
        "contradiction": False,
        "wrong_state": False,
        "continuation": "follows",
        "policy_trigger": None,
    }
    return CompactionLabel.model_validate({**base, **changes})


def test_scores_count_flags_against_labels_per_check():
    rollout = only("claude-code", FIXTURE)
    # s1 labelled with an omission the judge does not see (a miss); s2 as clean (a true
    # negative); a trigger verdict where the harness compacted does not apply.
    labels = [label("s1", omitted=["user_decision"]), label("s2", trigger="manual")]
    result = evaluate(labels, [(str(FIXTURE), rollout)])
    assert result.labelled == 2 and result.missing == [] and result.unlabelled == []
    omission = result.scores["state/omission"]
    assert (omission.tp, omission.fp, omission.fn, omission.tn) == (0, 0, 1, 1)
    assert omission.recall == 0.0 and omission.precision is None
    assert result.scores["trigger/too_early"].as_dict()["tn"] == 0
    assert result.misses == ["state/omission judge_compactions.jsonl s1 missed"]


def test_a_flag_on_a_clean_label_is_a_false_positive():
    # Renaming the settings file in the edit, and no commit after it, makes the second
    # summary omit an uncommitted written file.
    text = (
        FIXTURE.read_text()
        .replace(
            '"name": "Edit", "input": {"file_path": "/work/app/.claude/settings.json',
            '"name": "Edit", "input": {"file_path": "/work/app/.claude/hooks_config.json',
        )
        .replace("git commit -am 'Fix RunHook' && ", "")
    )
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"judge_compactions-{os.getpid()}.jsonl"
    path.write_text(text)
    try:
        rollout = only("claude-code", path)
    finally:
        path.unlink()
    named = str(FIXTURE)  # labels match by file name
    result = evaluate([label("s1"), label("s2")], [(named, rollout)])
    assert result.scores["state/omission"].fp == 1
    assert result.scores["continuation/redo"].as_dict()["flags"] == 1


def test_labels_that_are_not_labels_fail_with_their_line(tmp_path):
    bad = tmp_path / "labels.jsonl"
    bad.write_text(LABELS.read_text().splitlines()[0] + "\n" + '{"file": "x"}\n')
    with pytest.raises(ValueError, match=r"labels.jsonl:2: not a compaction label"):
        load_labels(str(bad))


def test_the_shipped_labels_parse_and_copy_no_session_text():
    labels = load_labels(str(LABELS))
    assert len(labels) == 6
    assert len({(lab.file, lab.uuid) for lab in labels}) == 6
    assert all(len(lab.note) < 600 for lab in labels)


@pytest.mark.skipif(REAL is None, reason="SEAM_REALWORLD_DIR is not set")
def test_every_default_check_is_calibrated_on_the_real_sessions():
    env = {**os.environ, "PYTHONPATH": str(LABELS.parents[2])}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pipeline.cli import main; sys.exit(main())",
            "judge",
            "--eval",
            str(LABELS),
            "--json",
            str(REAL / "claude_code"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    scores = json.loads(run.stdout)
    assert scores["labelled"] == 6 and scores["labels_not_found"] == []
    assert set(scores["checks"]) == set(ALL_CHECKS)
    for check in DEFAULT_CHECKS:
        row = scores["checks"][check]
        assert row["precision"] is None or row["precision"] >= 0.8, (check, row)
        assert row["recall"] is None or row["recall"] >= 0.6, (check, row)
        assert row["fp"] == 0, (check, row)


def test_a_label_naming_no_compaction_fails_the_eval(tmp_path):
    labels = tmp_path / "labels.jsonl"
    labels.write_text(label("nope").model_dump_json() + "\n")
    env = {**os.environ, "PYTHONPATH": str(LABELS.parents[2])}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pipeline.cli import main; sys.exit(main())",
            "judge",
            "--eval",
            str(labels),
            str(FIXTURE),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 1
    assert "1 label(s) name no compaction of the inputs" in run.stderr


SESSION = "7c2f0d1e-0000-4000-8000-00000000ju18"  # the fixture's sessionId


def test_labels_on_any_file_of_a_multi_file_session_are_found(tmp_path):
    """A session saved as two files is read as one rollout named after its first file;
    a label on the second file finds its boundary by session and uuid."""
    from collections import Counter

    from pipeline.cli.judge import iter_input_sources

    lines = FIXTURE.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"uuid": "cb2"' in line)
    (tmp_path / "part_a.jsonl").write_text("".join(lines[:cut]))
    (tmp_path / "part_b.jsonl").write_text("".join(lines[cut:]))
    sources = list(iter_input_sources([str(tmp_path)], "auto", Counter()))
    assert [Path(p).name for p, _ in sources] == ["part_a.jsonl"]  # one merged rollout
    on_first = label("s1", file="claude_code/part_a.jsonl", session=SESSION)
    on_second = label("s2", file="claude_code/part_b.jsonl", session=SESSION, omitted=["finding"])
    result = evaluate([on_first, on_second], sources)
    assert result.labelled == 2 and result.missing == [] and result.unlabelled == []
    assert result.misses == ["state/omission part_b.jsonl s2 missed"]
    # Without its session, a label is matched by file name: the second part is not found.
    old_style = label("s2", file="claude_code/part_b.jsonl")
    assert evaluate([old_style], sources).missing == ["part_b.jsonl s2"]
    # A label of another session with the same boundary id does not match.
    other = label("s2", file="claude_code/part_b.jsonl", session="another-session")
    assert evaluate([other], sources).missing == ["part_b.jsonl s2"]


def test_a_boundary_in_two_snapshots_is_scored_once_on_the_labelled_file(tmp_path):
    from collections import Counter

    from pipeline.cli.judge import iter_input_sources

    sources = []
    for name in ("snap_1.jsonl", "snap_2.jsonl"):
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / name).write_text(FIXTURE.read_text())
        sources += list(iter_input_sources([str(folder)], "auto", Counter()))
    assert len(sources) == 2
    result = evaluate([label("s1", file="claude_code/snap_2.jsonl", session=SESSION)], sources)
    assert result.labelled == 1 and result.missing == []
    assert result.unlabelled == ["snap_1.jsonl s2", "snap_2.jsonl s2"]
