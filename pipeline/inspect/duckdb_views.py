"""SQL views over a build directory: the one place that knows how to query shards.

``connect(DIR)`` opens an in-memory DuckDB connection whose views read the build's
files lazily (nothing is copied), so ``seam stats``, ``seam sql``, ``seam report`` and
the README's example queries all see the same tables:

- ``segments``: the shard rows as written (one row per segment, every column).
- ``calls``: one row per generated output (``call_spans`` unnested): which rollout,
  segment and call, ``kind`` (action | summary), ``tokens`` (output length, end-of-turn
  token included), ``start`` (= the rebuilt input length), ``trained``, ``truncated``,
  ``tool_calls`` (tool calls the output made; null when the tokenizer has no single
  ``<tool_call>`` token to count) and ``reported_input_tokens`` (the provider's count).
- ``rollouts``: one row per rollout, aggregated from its segments and calls; ``passed``
  is ``resolved`` when recorded, else ``reward > 0``.
- ``fidelity``: one row per (segment, ``context_fidelity`` value): ``exact`` or a reason
  the segment's context is not exactly what the model received.
- ``witness``: one row per segment, its second witness (``pipeline/core/witness.py``):
  ``calls``, ``witnessed_calls`` (calls whose reported input and the previous call's
  are both known), ``gap_tokens`` (``context_gap_tokens``) and ``flagged``
  (``unexplained_context_gap`` in ``context_fidelity``).
- ``quarantine``: ``quarantine.jsonl``, one row per rejected record, with
  ``reason_kind``: the reason with ids, quoted values and numbers blanked, for grouping.
- SFT builds only: ``corrections`` (one row per attached judge correction) and
  ``audit`` (one row per audited summary, with the flags the audit rates count).

``connect(DIR, locked=Limits(...))`` is the connection ``seam view`` runs strangers'
filters on: once the views exist, DuckDB may open only the build's own files
(``allowed_paths``, then ``enable_external_access = false``: no other file, no URL, no
``COPY``/``ATTACH``), never installs or loads an extension, holds ``memory_limit`` and
``threads``, spills nothing to disk, and ``lock_configuration`` keeps a query from
setting any of it back.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import duckdb

from pipeline.common.errors import SeamError

TOOL_CALL_TOKEN = "<tool_call>"

QUARANTINE_COLUMNS = {
    "file": "VARCHAR",
    "line": "BIGINT",
    "format": "VARCHAR",
    "record": "VARCHAR",
    "origin": "VARCHAR",
    "reason": "VARCHAR",
    "raw": "JSON",
}


class BuildDirError(SeamError, ValueError):
    """The directory is not a readable seam build; the message says what to do."""


@dataclass(frozen=True)
class Limits:
    """What a locked connection may use: DuckDB's ``memory_limit`` (its buffer manager;
    a query over it fails with an out-of-memory error) and worker ``threads``."""

    memory_mb: int = 1024
    threads: int = 2

    def config(self) -> dict[str, str | bool | int | float | list[str]]:
        """Settings DuckDB takes only when the database starts."""
        return {
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "memory_limit": f"{self.memory_mb}MB",
            "threads": self.threads,
            "temp_directory": "",  # no spilling: nothing written, the memory limit is the limit
        }


def connect(build_dir: str | Path, locked: Limits | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the views above defined over ``build_dir``; ``locked``:
    one that can read nothing but the build's files (see the module's docstring)."""
    out = Path(build_dir)
    if not out.is_dir():
        raise BuildDirError(f"{out} is not a directory")
    manifest = _manifest(out)
    shards = (
        [out / s for s in manifest["shards"]] if manifest else sorted(out.glob("train-*.parquet"))
    )
    if not shards:
        raise BuildDirError(
            f"{out} holds no train-*.parquet shards; build it first with seam build-rl or seam build-sft"
        )
    missing = [s.name for s in shards if not s.exists()]
    if missing:
        raise BuildDirError(
            f"{out}: shard(s) listed in manifest.json are missing: {', '.join(missing[:3])}; rebuild it"
        )
    con = duckdb.connect(config=locked.config() if locked else {})
    con.execute(f"CREATE VIEW segments AS SELECT * FROM read_parquet({_sql_list(shards)})")
    columns = {row[0] for row in con.execute("DESCRIBE segments").fetchall()}
    con.execute(_calls_sql(_tool_call_token_id(manifest), "reported_input_tokens" in columns))
    edits = "num_context_edits" if "num_context_edits" in columns else "CAST(NULL AS INTEGER)"
    con.execute(ROLLOUTS_SQL.format(edits=edits))
    con.execute(_quarantine_sql(out / "quarantine.jsonl"))
    if "context_fidelity" in columns:
        con.execute(FIDELITY_SQL)
    if "context_gap_tokens" in columns:
        con.execute(WITNESS_SQL)
    if "corrections" in columns:
        con.execute(CORRECTIONS_SQL)
    if "summary_audit" in columns:
        con.execute(AUDIT_SQL)
    if locked:
        # The views read these files when a query runs, so they stay allowed; the order
        # matters: allowed_paths cannot change once external access is off.
        readable = [str(s) for s in shards] + [str(out / "quarantine.jsonl")]
        con.execute("SET allowed_paths = ?", [readable])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    return con


def view_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [
        row[0]
        for row in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
        ).fetchall()
    ]


def _manifest(out: Path) -> dict | None:
    path = out / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else None


def _tool_call_token_id(manifest: dict | None) -> int | None:
    """The id of ``<tool_call>`` in the build's tokenizer, read from its tokenizer.json
    (loading the tokenizer itself would cost seconds on every query)."""
    path = Path((manifest or {}).get("tokenizer", {}).get("name_or_path", "")) / "tokenizer.json"
    if not path.is_file():
        return None
    stat = path.stat()
    return _added_token_id(str(path), stat.st_mtime_ns, stat.st_size, TOOL_CALL_TOKEN)


@functools.lru_cache(maxsize=8)
def _added_token_id(path: str, mtime_ns: int, size: int, content: str) -> int | None:
    """The id of the added token ``content`` in the tokenizer.json at ``path``, parsed once
    per process for each version of the file (mtime and size are part of the key): the
    file is ~7 MB of JSON, ~1 s to parse, and a process that opens many connections (the
    Python API in a notebook, the test suite) would parse it on every one."""
    added = json.loads(Path(path).read_text()).get("added_tokens", [])
    return next((t["id"] for t in added if t.get("content") == content), None)


def _sql_list(paths) -> str:
    return "[" + ", ".join(_sql_str(str(p)) for p in paths) + "]"


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _calls_sql(tool_call_id: int | None, has_reported: bool = True) -> str:
    # DuckDB lists are 1-based and slices inclusive: the output is [start+1, start+length].
    tool_calls = (
        f"len(list_filter(s.input_ids[c.start + 1 : c.start + c.length], lambda t: t = {tool_call_id}))"
        if tool_call_id is not None
        else "CAST(NULL AS INTEGER)"
    )
    # reported_input_tokens is aligned with call_spans: index i of one is call i of the other.
    reported = "s.reported_input_tokens[i]" if has_reported else "CAST(NULL AS INTEGER)"
    return f"""
    CREATE VIEW calls AS
    SELECT s.rollout_id, s.task_id, s.source, s.segment_index, s.seam_kind, s.num_compactions,
           c.call_index, c.kind, c.length AS tokens, c.start, c.trained, c.truncated,
           {tool_calls} AS tool_calls, {reported} AS reported_input_tokens
    FROM segments s,
         (SELECT unnest(s.call_spans) AS c, generate_subscripts(s.call_spans, 1) AS i) AS u"""


# DuckDB lists are 1-based: call i (i >= 2) is witnessed when its count and call i-1's are known.
WITNESS_SQL = """
CREATE VIEW witness AS
SELECT rollout_id, task_id, source, model, segment_index,
       len(call_spans) AS calls,
       len(list_filter(range(2, len(reported_input_tokens) + 1),
                       lambda i: reported_input_tokens[i] IS NOT NULL
                                 AND reported_input_tokens[i - 1] IS NOT NULL)) AS witnessed_calls,
       context_gap_tokens AS gap_tokens,
       list_contains(context_fidelity, 'unexplained_context_gap') AS flagged
FROM segments"""

ROLLOUTS_SQL = """
CREATE VIEW rollouts AS
WITH per_segment AS (
    SELECT rollout_id,
           any_value(task_id) AS task_id, any_value(source) AS source, any_value(model) AS model,
           any_value(parent_rollout_id) AS parent_rollout_id,
           any_value(reward) AS reward, any_value(advantage) AS advantage, any_value(group_size) AS group_size,
           any_value(resolved) AS resolved, any_value(num_compactions) AS num_compactions,
           any_value({edits}) AS num_context_edits,
           count(*) AS num_segments,
           count(*) FILTER (WHERE seam_kind <> 'none') AS num_seams,
           count(*) FILTER (WHERE seam_kind = 'template') AS template_seams,
           sum(num_tokens) AS tokens, sum(num_trainable_tokens) AS trainable_tokens,
           bool_or(truncated) AS truncated
    FROM segments GROUP BY rollout_id),
per_call AS (
    SELECT rollout_id, count(*) AS num_calls,
           count(*) FILTER (WHERE kind = 'action') AS action_calls,
           count(*) FILTER (WHERE kind = 'summary') AS summary_calls,
           sum(tool_calls) AS tool_calls,
           sum(tokens) FILTER (WHERE kind = 'summary') AS summary_tokens
    FROM calls GROUP BY rollout_id)
SELECT s.rollout_id, s.task_id, s.source, s.model, s.parent_rollout_id, s.reward, s.advantage, s.group_size,
       s.resolved, coalesce(s.resolved, s.reward > 0) AS passed, s.num_compactions, s.num_context_edits,
       s.num_segments, s.num_seams,
       s.template_seams, c.num_calls, c.action_calls, c.summary_calls, c.tool_calls, c.summary_tokens,
       s.tokens, s.trainable_tokens, s.truncated
FROM per_segment s JOIN per_call c USING (rollout_id)"""


def _quarantine_sql(path: Path) -> str:
    columns = ", ".join(f"CAST(NULL AS {t}) AS {name}" for name, t in QUARANTINE_COLUMNS.items())
    source = (
        f"read_json({_sql_str(str(path))}, format = 'newline_delimited', columns = {QUARANTINE_COLUMNS})"
        if path.exists()
        else f"(SELECT {columns} WHERE false)"
    )
    # Blank the parts of a reason that name one record (rollout ids, quoted values,
    # numbers) so that reasons of the same kind group together. A word holding a digit
    # (a session id such as 5b1d6c2e-…, a line number, a size) becomes one N: blanking
    # only the digit runs left ids' letters behind, so one reason made many kinds.
    reason_kind = r"""left(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        reason, '^rollout \S+: ', ''), '''[^'']*''', '''…''', 'g'), '"[^"]*"', '"…"', 'g'), '[\w.-]*\d[\w.-]*', 'N', 'g'), 120)"""
    return f"""
    CREATE VIEW quarantine AS
    SELECT file, line, format, coalesce(record, 'rollout') AS record, origin, reason,
           {reason_kind} AS reason_kind, raw
    FROM {source}"""


FIDELITY_SQL = """
CREATE VIEW fidelity AS
SELECT s.rollout_id, s.task_id, s.source, s.segment_index, f AS reason
FROM segments s, unnest(s.context_fidelity) AS u(f)"""

CORRECTIONS_SQL = """
CREATE VIEW corrections AS
SELECT s.rollout_id, s.task_id, s.source, s.segment_index, c.*
FROM segments s, unnest(s.corrections) AS u(c)"""

AUDIT_SQL = """
CREATE VIEW audit AS
SELECT s.rollout_id, s.task_id, s.source, s.segment_index, a.*,
       len(a.omitted) > 0 AS key_state_omitted,
       NOT a.has_next_step AS next_step_omitted,
       len(a.contradictions) + len(a.wrong_state) > 0 AS inconsistent,
       len(a.invented_paths) > 0 AS invented_path
FROM segments s, unnest(s.summary_audit) AS u(a)"""
