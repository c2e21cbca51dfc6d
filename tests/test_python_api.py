"""`import seam`: the README's and docs/python.md's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import seam

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def run_blocks(blocks: list[str], rl_build: Path, tmp_path: Path, monkeypatch) -> None:
    """Run the blocks in order in one namespace, from a directory laid out like the
    repository after `make build-rl-shards` (data/ and out/rl)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "rl").symlink_to(rl_build)
    (tmp_path / "data").symlink_to(ROOT / "data")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "<example>", "exec"), namespace)


def test_docs_python_examples_run(rl_build, tmp_path, monkeypatch):
    blocks = python_blocks((ROOT / "docs" / "python.md").read_text())
    assert len(blocks) == 4
    run_blocks(blocks, rl_build, tmp_path, monkeypatch)


def test_readme_python_api_example_runs(rl_build, tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    blocks = python_blocks(section)
    assert len(blocks) == 1
    run_blocks(blocks, rl_build, tmp_path, monkeypatch)


def test_one_public_module():
    assert sorted(seam.__all__) == seam.__all__
    for name in seam.__all__:
        assert getattr(seam, name).__doc__, name
