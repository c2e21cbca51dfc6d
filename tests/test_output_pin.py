"""The byte pin of the main jobs (issue 24): ``make build-rl-shards`` and ``make build-sft``
run in-process with the Makefile's own arguments, from a folder laid out like the
repository (the session's ``sample_outputs``, ``tests/sample_outputs.py``), and every file
they write must hash to what ``tests/pins/sample_outputs.json`` holds. A change that alters
output on purpose updates the pin in the same commit: ``python tools/pin_outputs.py``
rewrites it (and prints what changed)."""

from __future__ import annotations

import json

from tests.sample_outputs import PIN


def test_the_main_jobs_write_the_pinned_bytes(sample_outputs):
    pinned = json.loads(PIN.read_text())
    got = sample_outputs.hashes()
    changed = sorted(k for k in pinned.keys() | got.keys() if pinned.get(k) != got.get(k))
    assert not changed, (
        f"output bytes changed: {changed}; if on purpose, run python tools/pin_outputs.py "
        "and commit the new pin with the change"
    )
