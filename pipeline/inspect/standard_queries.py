"""The standard tables over a build's views (``pipeline/inspect/duckdb_views.py``).

``seam stats`` prints them, ``seam report`` shows them next to its plots, and the
example queries of docs/data.md are the first five, verbatim; the tests run each one
on a real build. A query names the views it needs: the judge tables only exist for SFT
builds, and the callers skip a query whose views are absent. ``build_counts`` is the
build summary (read, accepted, quarantined, segments, ...) recomputed from the views.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pipeline.build.manifest import Manifest
from pipeline.core.fidelity import COUNT_PREFIX
from pipeline.core.rows import EXCLUDED, EXCLUDED_PREFIX
from pipeline.core.witness import GAP_TOKENS, WITNESSED_CALLS


@dataclass(frozen=True)
class StandardQuery:
    title: str
    sql: str
    needs: tuple[str, ...]


PASS_RATE_BY_COMPACTIONS = StandardQuery(
    "Pass rate by number of compactions (CompactionRL's table)",
    """SELECT num_compactions,
       count(*) AS rollouts,
       round(avg(passed::INT), 3) AS pass_rate,
       round(avg(reward), 3) AS mean_reward
FROM rollouts
GROUP BY num_compactions
ORDER BY num_compactions""",
    ("rollouts",),
)

SUMMARY_LENGTH_PERCENTILES = StandardQuery(
    "Summary length in tokens (percentiles)",
    """SELECT count(*) AS summaries,
       min(tokens) AS min,
       quantile_disc(tokens, 0.10) AS p10,
       quantile_disc(tokens, 0.50) AS p50,
       quantile_disc(tokens, 0.90) AS p90,
       quantile_disc(tokens, 0.99) AS p99,
       max(tokens) AS max
FROM calls
WHERE kind = 'summary'""",
    ("calls",),
)

TOOL_CALLS_PER_ROLLOUT = StandardQuery(
    "Tool calls per rollout",
    """SELECT count(*) AS rollouts,
       round(avg(tool_calls), 1) AS mean,
       quantile_disc(tool_calls, 0.50) AS p50,
       quantile_disc(tool_calls, 0.90) AS p90,
       max(tool_calls) AS max,
       round(avg(action_calls), 1) AS mean_action_calls,
       round(avg(summary_calls), 2) AS mean_summary_calls
FROM rollouts""",
    ("rollouts",),
)

SEAMS_BY_KIND_AND_SOURCE = StandardQuery(
    "Seams by kind and source",
    """SELECT source, seam_kind, coalesce(seam_trigger, '-') AS trigger,
       count(*) AS segments,
       count(DISTINCT rollout_id) AS rollouts
FROM segments
WHERE seam_kind <> 'none'
GROUP BY ALL
ORDER BY source, segments DESC""",
    ("segments",),
)

QUARANTINE_REASONS = StandardQuery(
    "Quarantine reasons",
    """SELECT record, reason_kind, count(*) AS records, any_value(file) AS example_file
FROM quarantine
GROUP BY record, reason_kind
ORDER BY records DESC, reason_kind
LIMIT 20""",
    ("quarantine",),
)

CORRECTION_TYPES = StandardQuery(
    "Judge corrections by type and verdict",
    """SELECT type, verdict, count(*) AS corrections, count(DISTINCT rollout_id) AS rollouts
FROM corrections
GROUP BY type, verdict
ORDER BY corrections DESC, type, verdict""",
    ("corrections",),
)

AUDIT_RATES = StandardQuery(
    "Summary audit rates (AutoCompact's measures)",
    """SELECT count(*) AS summaries,
       round(avg(key_state_omitted::INT), 3) AS key_state_omission_rate,
       round(avg(next_step_omitted::INT), 3) AS next_step_omission_rate,
       round(avg(inconsistent::INT), 3) AS self_consistency_violation_rate,
       round(avg(invented_path::INT), 3) AS invented_path_rate,
       round(avg(words), 1) AS mean_words
FROM audit""",
    ("audit",),
)

CONTEXT_FIDELITY = StandardQuery(
    "Context fidelity of segments (exact, or why not)",
    """SELECT reason,
       count(*) AS segments,
       count(DISTINCT rollout_id) AS rollouts
FROM fidelity
GROUP BY reason
ORDER BY reason = 'exact' DESC, segments DESC, reason""",
    ("fidelity",),
)

REPORTED_VS_REBUILT = StandardQuery(
    "Input tokens per call: reported vs rebuilt",
    """SELECT count(*) AS calls,
       count(reported_input_tokens) AS calls_with_usage,
       sum(reported_input_tokens) AS reported,
       sum(start) FILTER (WHERE reported_input_tokens IS NOT NULL) AS rebuilt,
       round(median(reported_input_tokens / greatest(start, 1)), 2) AS median_ratio,
       round(max(reported_input_tokens / greatest(start, 1)), 2) AS max_ratio
FROM calls""",
    ("calls",),
)

SECOND_WITNESS = StandardQuery(
    "Second witness per source (the harness's reported input tokens)",
    """SELECT source,
       sum(calls) AS calls,
       sum(witnessed_calls) AS witnessed_calls,
       round(sum(witnessed_calls) / sum(calls), 3) AS witnessed_share,
       count(*) AS segments,
       count(*) FILTER (WHERE flagged) AS flagged_segments,
       round(avg(flagged::INT), 3) AS flagged_share,
       coalesce(sum(gap_tokens), 0) AS gap_tokens
FROM witness
GROUP BY source
ORDER BY source""",
    ("witness",),
)

# The README's five example queries, in the order it shows them.
EXAMPLES = [
    PASS_RATE_BY_COMPACTIONS,
    SUMMARY_LENGTH_PERCENTILES,
    TOOL_CALLS_PER_ROLLOUT,
    SEAMS_BY_KIND_AND_SOURCE,
    QUARANTINE_REASONS,
]
STANDARD = [
    *EXAMPLES,
    CONTEXT_FIDELITY,
    SECOND_WITNESS,
    REPORTED_VS_REBUILT,
    CORRECTION_TYPES,
    AUDIT_RATES,
]


def available(queries: list[StandardQuery], views: list[str]) -> list[StandardQuery]:
    """The queries whose views all exist on this connection."""
    return [q for q in queries if set(q.needs) <= set(views)]


def build_counts(con, out: Path) -> tuple[Counter, Counter, int]:
    """(counts, seams by kind, task groups of one) from the views, not from the manifest:
    a check that the shards hold what the build reported."""
    row = con.execute("""
        SELECT count(DISTINCT rollout_id), count(*), sum(num_calls), sum(num_tokens), sum(num_trainable_tokens),
               sum(drift_realigned), count(DISTINCT task_id) FILTER (WHERE group_size = 1)
        FROM segments""").fetchone()
    rollouts, segments, calls, tokens, trainable, drift, groups_of_one = (int(v or 0) for v in row)
    seams = Counter(
        dict(con.execute("SELECT seam_kind, count(*) FROM segments GROUP BY 1").fetchall())
    )
    # Correction records rejected by an SFT build are in quarantine.jsonl too, but they are
    # not input rollouts: only rollout records count towards read = accepted + quarantined.
    quarantined = con.execute(
        "SELECT count(*) FROM quarantine WHERE record = 'rollout'"
    ).fetchone()[0]
    # (a directory of shards without a manifest: nothing the manifest counts is known)
    manifest_counts = Manifest.read(out).counts if (out / "manifest.json").exists() else {}
    empty = manifest_counts.get("rollouts_without_segments", 0)
    counts = Counter(
        read=rollouts + empty + quarantined,
        accepted=rollouts + empty,
        quarantined=quarantined,
        segments=segments,
        calls=calls,
        tokens=tokens,
        trainable_tokens=trainable,
        drift_realigned=drift,
    )
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
    if "fidelity" in views:
        for reason, n in con.execute("SELECT reason, count(*) FROM fidelity GROUP BY 1").fetchall():
            counts[f"{COUNT_PREFIX}{reason}"] = n
    if "witness" in views:
        witnessed, gap = con.execute(
            "SELECT sum(witnessed_calls), sum(gap_tokens) FROM witness"
        ).fetchone()
        if witnessed:  # as the build counts them: only where some log reports usage
            counts[WITNESSED_CALLS] = int(witnessed)
            counts[GAP_TOKENS] = int(gap or 0)
    # Segments left out by --exclude-fidelity are in no shard: the manifest counts them.
    for key, n in manifest_counts.items():
        if key == EXCLUDED or key.startswith(EXCLUDED_PREFIX):
            counts[key] = n
    return counts, seams, groups_of_one
