"""The build's first pass over its inputs in child processes (``input_hashes``): the same
digests as ``read_hash.file_digests`` in this process, computed by the children when they
can, by this process when they cannot (with its errors)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pipeline.build import input_hashes
from pipeline.sources.read_hash import BLOCK, file_digests


def _inputs(tmp_path: Path) -> list[Path]:
    sizes = [0, 1, BLOCK - 1, BLOCK, 2 * BLOCK + 17]
    files = []
    for i, size in enumerate(sizes):
        f = tmp_path / f"in-{i}.jsonl"
        f.write_bytes(bytes((i * 31 + j) % 251 for j in range(size)))
        files.append(f)
    return files


def test_the_children_give_file_digests_of_every_file_in_order(tmp_path, monkeypatch):
    files = _inputs(tmp_path)
    want = [file_digests(f) for f in files]

    def not_here(*args):  # every digest must come from a child
        raise AssertionError("hashed in the build process")

    monkeypatch.setattr(input_hashes, "file_digests", not_here)
    futures = input_hashes.start_digests(files, threading.Event())
    assert [f.result(timeout=60) for f in futures] == want


def test_a_file_the_children_cannot_hash_is_hashed_here_with_its_error(tmp_path, monkeypatch):
    files = _inputs(tmp_path)
    files.insert(2, tmp_path / "gone.jsonl")
    futures = input_hashes.start_digests(files, threading.Event())
    for f, future in zip(files, futures):
        if f.name == "gone.jsonl":
            with pytest.raises(FileNotFoundError):
                future.result(timeout=60)
        else:
            assert future.result(timeout=60) == file_digests(f)


def test_no_child_at_all_still_gives_the_digests(tmp_path, monkeypatch):
    files = _inputs(tmp_path)
    monkeypatch.setattr(input_hashes.sys, "executable", str(tmp_path / "no-python"))
    futures = input_hashes.start_digests(files, threading.Event())
    assert [f.result(timeout=60) for f in futures] == [file_digests(f) for f in files]


def test_a_stopped_build_hashes_nothing_more(tmp_path, monkeypatch):
    files = _inputs(tmp_path)
    stop = threading.Event()
    stop.set()
    monkeypatch.setattr(input_hashes.sys, "executable", str(tmp_path / "no-python"))
    futures = input_hashes.start_digests(files, stop)
    for future in futures:
        with pytest.raises(RuntimeError, match="stopped before hashing"):
            future.result(timeout=60)
