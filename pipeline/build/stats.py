"""What a build counts, typed: ``BuildStats`` (the tasks' counts added up for the
manifest, ``merge``) and the names the build's readers show first (``HEADLINE_COUNTS``:
the dataset card, ``seam report``, the stats test).

Every record the build reads is ``accepted`` or ``quarantined``, so
``read = accepted + quarantined`` holds per file and for the build."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.build.worker import TaskResult

# The manifest's counts every build has, in the order the card and the report list them:
# records read, accepted and quarantined, then what the rows hold (segments, model calls,
# tokens, trained tokens, outputs whose logged ids the template re-tokenizes differently).
HEADLINE_COUNTS = (
    "read",
    "accepted",
    "quarantined",
    "segments",
    "calls",
    "tokens",
    "trainable_tokens",
    "drift_realigned",
)
# Per input file (``manifest["per_file"]``): its records read, accepted, quarantined and
# skipped (not model calls).
PER_FILE_COUNTS = ("read", "accepted", "quarantined", "skipped")


@dataclass
class BuildStats:
    """What tasks report for the manifest, typed: ``counts`` (the manifest's ``counts``:
    read, accepted, quarantined, tokens, ... and the steps' own counts), ``seams`` (rows
    per seam kind), ``skipped`` (records that are not model calls, by reason) and
    ``per_file`` (read, accepted, quarantined, skipped per input file; a session read
    from several files is counted under its first, which lists the others).

    ``merge`` adds another task's in place (and returns self), keeping a key whose count
    is 0 (``Counter.update``): the manifest lists the counts the tasks reported, zeros
    included, so merging in any grouping gives the same bytes."""

    counts: Counter = field(default_factory=Counter)
    seams: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    per_file: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of_task(cls, r: TaskResult) -> BuildStats:
        counts = r.counts
        entry: dict[str, Any] = {"format": r.format}
        entry.update({k: counts.get(k, 0) for k in ("read", "accepted", "quarantined")})
        entry["skipped"] = sum(r.skipped.values())
        if r.session_files:  # one session's files, read together: counted here
            entry["session_files"] = r.session_files
        return cls(Counter(counts), Counter(r.seams), Counter(r.skipped), {r.file: entry})

    def merge(self, other: BuildStats) -> BuildStats:
        self.counts.update(other.counts)
        self.seams.update(other.seams)
        self.skipped.update(other.skipped)
        for name, theirs in other.per_file.items():
            mine = self.per_file.setdefault(
                name, {"format": theirs["format"], **dict.fromkeys(PER_FILE_COUNTS, 0)}
            )
            for k in PER_FILE_COUNTS:
                mine[k] += theirs[k]
            if "session_files" in theirs:
                mine["session_files"] = theirs["session_files"]
        return self
