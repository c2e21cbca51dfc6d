"""Measure every rule check on the labelled real compactions and write the table that
decides which checks are on by default (``judge/labels/measured.json``; ``judge/measured.py``).

    python tools/restore_labels.py judge/labels/real_compactions.jsonl /tmp/real --clone ...
    python tools/measure_checks.py /tmp/real/labels.jsonl /tmp/real/claude_code \\
        --out judge/labels/measured.json

Scores each part of the set (``split``: tune, holdout) separately with
``judge.calibration.evaluate`` — the scoring of ``seam judge --eval`` — and prints the
table; refuses when a label names no compaction of the inputs (the table would count
fewer compactions than the set has). Writes no session text: counts only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

from judge.calibration import evaluate, load_labels
from judge.measured import BAR_FLAGS, BAR_PRECISION, BAR_SPLIT, UNMEASURED_ON_REAL
from judge.rules import ALL_CHECKS, RULE_JUDGE
from pipeline.cli.judge import iter_input_sources


def measure(labels_path: str, inputs: list[str]) -> dict:
    labels = load_labels(labels_path)
    sources = list(iter_input_sources(inputs, "auto", Counter()))
    table: dict = {
        "judge": RULE_JUDGE,
        "labels": Path(labels_path).name,
        "labels_sha256": hashlib.sha256(Path(labels_path).read_bytes()).hexdigest(),
        "bar": {"precision": BAR_PRECISION, "min_flags": BAR_FLAGS, "split": BAR_SPLIT},
        "unmeasured_on_real": list(UNMEASURED_ON_REAL),
        "compactions": {},
        "checks": {c: {} for c in ALL_CHECKS},
    }
    for split in ("tune", "holdout"):
        part = [lab for lab in labels if lab.split == split]
        result = evaluate(part, sources)
        if result.missing:
            raise SystemExit(
                f"{len(result.missing)} {split} label(s) name no compaction of the inputs: "
                + "; ".join(result.missing[:3])
            )
        table["compactions"][split] = result.labelled
        for check, score in result.scores.items():
            table["checks"][check][split] = score.as_dict()
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labels")
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    table = measure(args.labels, args.inputs)
    Path(args.out).write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    for check, rows in table["checks"].items():
        cells = [
            f"{split} {r['flags']} flags TP {r['tp']} FP {r['fp']} FN {r['fn']}"
            for split, r in rows.items()
        ]
        print(f"{check:32s} " + " | ".join(cells), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
