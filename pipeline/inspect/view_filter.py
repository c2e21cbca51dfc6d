"""The ``seam view`` filter: one SQL condition over the build's views, nothing else.

``rollout_list_sql(where)`` is the only SQL the filter reaches, and ``check_filter``
accepts it only when DuckDB's own parser reads ``where`` as one expression
(``duckdb.SQLExpression``) and the whole query, parsed by ``json_serialize_sql``, is one
statement whose every table is one of the build's views: a table function
(``read_text``, ``read_csv``, ``glob``, ``query``...), a file named as a table
(``FROM '/etc/passwd'``) or another catalog is refused with a one-line reason. A
subquery over the views is fine (``rollout_id IN (SELECT rollout_id FROM calls WHERE
truncated)``).

The check is for clear errors; the wall is the connection it runs on
(``views.connect(..., locked=...)``), which cannot open any file but the build's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import duckdb

from pipeline.common.errors import SeamError

LIST_LIMIT = 1000  # rollouts listed per page: a filter finds the others

LIST_COLUMNS = [
    "rollout_id",
    "task_id",
    "source",
    "reward",
    "passed",
    "num_compactions",
    "num_segments",
    "num_calls",
    "tokens",
    "trainable_tokens",
]


class FilterError(SeamError, ValueError):
    """A filter that is refused, failed or was stopped; the message is one line."""


def rollout_list_sql(where: str, limit: int = LIST_LIMIT) -> tuple[str, str]:
    """The count query and the list query (the first ``limit`` by id) of the rollouts
    ``where`` selects. The
    condition sits on lines of its own so a trailing ``--`` comment cannot eat the
    closing parenthesis."""
    rows = f"SELECT {', '.join(LIST_COLUMNS)} FROM rollouts"
    if where:
        rows += f" WHERE (\n{where}\n)"
    return f"SELECT count(*) FROM ({rows})", f"{rows} ORDER BY rollout_id LIMIT {int(limit)}"


def check_filter(con: duckdb.DuckDBPyConnection, where: str, views: list[str]) -> None:
    """Raise ``FilterError`` unless ``where`` is one condition that reads only ``views``."""
    if not where:
        return
    try:
        duckdb.SQLExpression(where)
    except duckdb.Error as exc:
        raise FilterError(f"not one SQL condition: {_first_line(exc)}") from None
    for sql in rollout_list_sql(where):
        (serialized,) = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone() or ("{}",)
        tree = json.loads(serialized)
        if tree.get("error") or len(tree.get("statements", [])) != 1:
            message = tree.get("error_message", "more than one statement")
            raise FilterError(f"not one SQL condition: {message}")
        for node in _nodes(tree):
            kind = node.get("type")
            if kind == "TABLE_FUNCTION":
                name = node.get("function", {}).get("function_name", "?")
                raise FilterError(
                    f"{name}() is not allowed: a filter reads only the build's views ({', '.join(views)})"
                )
            if kind == "BASE_TABLE":
                name = node.get("table_name", "")
                qualified = node.get("schema_name") or node.get("catalog_name")
                if qualified or name.lower() not in views:
                    raise FilterError(
                        f"{name!r} is not one of the build's views ({', '.join(views)})"
                    )


def _nodes(tree) -> Iterator[dict]:
    """Every JSON object of a parse tree, depth first."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]
