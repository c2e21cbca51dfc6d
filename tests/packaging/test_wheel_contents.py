"""What the wheel holds (fast: the wheel is built, not installed; tests/packaging/
test_wheel.py installs it and runs the commands from it)."""

from __future__ import annotations

import subprocess
import zipfile

from pipeline import __version__
from tests.packaging.wheel_venv import ROOT, build_wheel, packages

# Files under the packages that the wheel leaves out on purpose: the labelled sets the
# tests and `seam judge --eval` read from the repository (docs/labels.md).
NOT_PACKAGED = {"judge/labels/claude_code_realworld.jsonl", "judge/labels/real_compactions.jsonl"}


def test_the_wheel_holds_every_data_file_of_the_packages(tmp_path):
    """Every non-Python file under the packages is in the wheel (a template, prompt or
    label file read through ``Path(__file__)`` would be missing in an install)."""
    with zipfile.ZipFile(build_wheel(tmp_path)) as zf:
        names = set(zf.namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "--", *packages()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    data = {f for f in tracked if not f.endswith(".py") and (ROOT / f).exists()}
    assert data - NOT_PACKAGED <= names, sorted(data - NOT_PACKAGED - names)
    assert f"seam_rl-{__version__}.dist-info/METADATA" in names
    assert f"seam_rl-{__version__}.dist-info/entry_points.txt" in names
