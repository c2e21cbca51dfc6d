"""Restore the public session files that a labels file refers to, for ``seam judge --eval``.

    python tools/restore_labels.py LABELS.jsonl OUT [--clone OWNER/NAME=DIR ...]

Each label's ``source`` names a public repository, a commit and a path (docs/labels.md).
A file is taken from its copy under ``../shared`` when the label says there is one and
``SEAM_REALWORLD_DIR`` / ``SEAM_REALWORLD_NEW_DIR`` point there; otherwise from a local
clone given with ``--clone`` that already holds the commit (``git show COMMIT:PATH``;
nothing is fetched here). It is written to ``OUT/<label.file>``, and the labels whose
files were all restored go to ``OUT/labels.jsonl``, so that

    seam judge --eval OUT/labels.jsonl OUT/claude_code

scores exactly the restored part. Labels whose files cannot be restored are counted and
named, never silently dropped. Nothing outside OUT is written; nothing is deleted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

# Run as a script from the repository root: make the project importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from judge.calibration import CompactionLabel, SourceFile, load_labels

SHARED_ENV = {"realworld": "SEAM_REALWORLD_DIR", "realworld-new": "SEAM_REALWORLD_NEW_DIR"}


def shared_copy(source: SourceFile) -> Path | None:
    """The file's copy under ../shared, when the label names one and its folder is set."""
    if not source.shared:
        return None
    top, rest = source.shared.split("/", 1)
    base = os.environ.get(SHARED_ENV.get(top, ""), "")
    path = Path(base) / rest if base else None
    return path if path and path.is_file() else None


def restore_one(source: SourceFile, target: Path, clones: dict[str, Path]) -> str | None:
    """Write one source file to ``target``; the reason it could not be, or None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    copy = shared_copy(source)
    if copy is not None:
        shutil.copyfile(copy, target)
        return None
    clone = clones.get(source.repo)
    if clone is None:
        return f"no --clone for {source.repo} and no shared copy"
    shown = subprocess.run(
        ["git", "-C", str(clone), "show", f"{source.commit}:{source.path}"],
        capture_output=True,
        check=False,
    )
    if shown.returncode != 0:
        first = shown.stderr.decode(errors="replace").strip().splitlines()[:1]
        return f"git show {source.commit[:12]}:{source.path} failed: {' '.join(first)}"
    target.write_bytes(shown.stdout)
    return None


def restore(
    labels: list[CompactionLabel], out: Path, clones: dict[str, Path]
) -> tuple[list[CompactionLabel], dict[str, str]]:
    """Restore every label's files into ``out``: (labels fully restored, {file: reason})."""
    done: dict[str, str | None] = {}
    kept = []
    for label in labels:
        if label.file not in done:
            # A session is one file here (its longest snapshot); sources[0] is that file.
            done[label.file] = restore_one(label.source[0], out / label.file, clones)
        if done[label.file] is None:
            kept.append(label)
    missing = {name: why for name, why in done.items() if why is not None}
    return kept, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labels")
    parser.add_argument("out")
    parser.add_argument("--clone", action="append", default=[], metavar="OWNER/NAME=DIR")
    args = parser.parse_args(argv)
    clones = {}
    for item in args.clone:
        repo, sep, path = item.partition("=")
        if not sep:
            parser.error(f"--clone wants OWNER/NAME=DIR, got {item!r}")
        clones[repo] = Path(path)
    labels = [label for label in load_labels(args.labels) if label.source]
    out = Path(args.out)
    kept, missing = restore(labels, out, clones)
    out.mkdir(parents=True, exist_ok=True)
    (out / "labels.jsonl").write_text("".join(label.model_dump_json() + "\n" for label in kept))
    files = len({label.file for label in labels})
    print(
        f"restored {files - len(missing)} of {files} files; "
        f"{len(kept)} of {len(labels)} labels -> {out / 'labels.jsonl'}"
    )
    for name, why in sorted(missing.items()):
        print(f"  not restored: {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
