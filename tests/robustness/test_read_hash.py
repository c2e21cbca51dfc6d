"""``pipeline/sources/read_hash.py``: the block digests taken while reading are the ones the
first pass takes, whatever the reads look like (property test), and a byte changed
between the two is found."""

from __future__ import annotations

import hashlib
import io

from hypothesis import given
from hypothesis import strategies as st

from pipeline.sources import read_hash
from pipeline.sources.canonical_io import open_text_stream
from tests.robustness.records import fuzz_settings

BLOCK = 64  # small blocks, so a few hundred bytes span many


@fuzz_settings(60)
@given(
    data=st.binary(min_size=0, max_size=700),
    steps=st.lists(st.tuples(st.integers(0, 800), st.integers(0, 300)), min_size=1, max_size=8),
)
def test_digests_taken_while_reading_are_the_first_passes(
    tmp_path_factory, monkeypatch, data, steps
):
    """Any mix of seeks and reads through a buffered reader: every block it touched is
    recorded with the first pass's digest of that block, and every byte it handed out
    lies in a recorded block."""
    monkeypatch.setattr(read_hash, "BLOCK", BLOCK)
    path = tmp_path_factory.mktemp("h") / "f.bin"
    path.write_bytes(data)
    whole, blocks = read_hash.file_digests(path)
    touched: set[int] = set()
    with read_hash.recording() as log, io.BufferedReader(read_hash.open_input(path), 32) as fh:
        for offset, size in steps:
            fh.seek(offset)
            got = fh.read(size)
            assert got == data[offset : offset + size]
            touched.update(
                range(offset // BLOCK, (offset + len(got) - 1) // BLOCK + 1) if got else ()
            )
    recorded = {int(i): d for i, d in log.get(str(path), {}).items()}
    assert touched <= set(recorded)
    assert read_hash.changed_blocks({i: {d} for i, d in recorded.items()}, blocks) == []
    assert whole == hashlib.sha256(data).hexdigest()


def test_a_byte_changed_after_the_first_pass_is_found_in_its_block(tmp_path, monkeypatch):
    monkeypatch.setattr(read_hash, "BLOCK", BLOCK)
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(b'{"n": %03d}\n' % i for i in range(40)))
    _, blocks = read_hash.file_digests(path)
    with open(path, "r+b") as fh:  # same size, one digit
        fh.seek(200)
        fh.write(b"9")
    with read_hash.recording() as log, open_text_stream(path) as fh:
        lines = fh.readlines()
    assert len(lines) == 40
    recorded = {int(i): {d} for i, d in log[str(path)].items()}
    assert read_hash.changed_blocks(recorded, blocks) == [200 // BLOCK]
