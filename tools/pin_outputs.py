"""Rewrite ``tests/pins/sample_outputs.json`` from a fresh run of the main jobs, and print
which files changed. Only for a change that alters output on purpose (issue 24's rule:
the pin moves in the same commit as the change)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.sample_outputs import PIN, build_and_hash


def main() -> int:
    old = json.loads(PIN.read_text()) if PIN.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        new = build_and_hash(Path(tmp))
    for key in sorted(old.keys() | new.keys()):
        if old.get(key) != new.get(key):
            print(f"changed: {key}")
    PIN.parent.mkdir(parents=True, exist_ok=True)
    PIN.write_text(json.dumps(new, indent=2, sort_keys=True) + "\n")
    print(f"wrote {PIN} ({len(new)} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
