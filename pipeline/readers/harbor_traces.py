"""Harbor trace exports (``harbor traces export``: ``traces.json`` or JSON Lines).

One row per model call ("episode"): ``conversations`` is the whole conversation up to
and including that call's reply (``{"role", "content"}`` messages, the reply last), with
``episode`` (``episode-N``), ``trial_name``, ``run_id``, ``task``, ``agent``, ``model``,
``result`` (the trial's reward as a string, e.g. ``"1.0"``, or the name of the exception
that ended it) and, when sub-agent traces were merged, ``trace_source`` (``main`` or the
sub-agent trajectory's type).

The rows of one trial and source are one rollout, in episode order; each row's
conversation minus its last message is that call's input, compared with the live
context like a gateway log (``openai_messages.apply_request``): an extension appends, a
context the export rebuilt differently (a summarization continuation) is a rewrite. The
last message is the call. ``task`` is the GRPO group key; a numeric ``result`` is the
reward, any other is recorded as ``meta.outcome.exception``. A sub-agent source is its
own rollout whose ``parent_rollout_id`` is the trial's main rollout. ``tool_definitions``
are not the rollout's ``tools``: the export writes them into the first message already.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.readers import Accepted, Reader, ReadItem, Rejected, register
from pipeline.readers.builder import RolloutBuilder
from pipeline.readers.common import (
    BAD_CONTENT,
    first_array_item,
    first_json_object,
    is_json_document,
    iter_json_records,
    load_json,
    read_head,
    reason_of,
)
from pipeline.readers.openai_messages import apply_request, chat_messages

MAIN = "main"
_EPISODE = re.compile(r"(\d+)$")


def _is_row(item: Any) -> bool:
    return (
        isinstance(item, dict) and isinstance(item.get("conversations"), list) and "episode" in item
    )


def _episode(row: dict) -> int:
    found = _EPISODE.search(str(row.get("episode") or ""))
    if found is None:
        raise ValueError(f"episode {row.get('episode')!r} has no number")
    return int(found.group(1))


def _reward(result: Any) -> tuple[float | None, dict]:
    """(reward, outcome) from a row's ``result``."""
    if result is None:
        return None, {}
    try:
        return float(result), {"result": result}
    except (TypeError, ValueError):
        return None, {"exception": str(result)}


@register
class HarborTracesReader(Reader):
    name = "harbor-traces"
    description = "Harbor trace exports (traces.json or JSONL): one row per call, with result"

    def sniff(self, path: Path, head: bytes) -> bool:
        first = first_array_item(head)
        return _is_row(first if first is not None else first_json_object(head))

    def read(self, path: Path) -> Iterator[ReadItem]:
        groups: dict[tuple[str, str], list[tuple[int | None, dict]]] = {}
        for where, row, error in self._rows(path):
            if error:
                yield Rejected(where, error)
                continue
            if not _is_row(row):
                yield Rejected(where, "not a trace row: no 'conversations' list and 'episode'")
                continue
            trial = str(row.get("trial_name") or row.get("run_id") or path.stem)
            groups.setdefault((trial, str(row.get("trace_source") or MAIN)), []).append(
                (where, row)
            )
        for (trial, source), rows in groups.items():
            yield self._rollout(trial, source, rows)

    @staticmethod
    def _rows(path: Path) -> Iterator[tuple[int | None, Any, str | None]]:
        """(1-based row number or line, row, error) for a JSON array or JSON Lines."""
        try:
            document = is_json_document(read_head(path, 1 << 16))
        except (OSError, EOFError, ValueError) as exc:
            yield None, None, f"cannot read the file: {exc}"
            return
        if not document:
            for line, rec, error, _ in iter_json_records(path):
                yield line, rec, error
            return
        try:
            doc = load_json(path)
        except ValueError as exc:
            yield None, None, f"cannot read the JSON document: {exc}"
            return
        if not isinstance(doc, list) or not any(_is_row(row) for row in doc):
            yield None, None, "expected a list of trace rows"
            return
        yield from ((i + 1, row, None) for i, row in enumerate(doc))

    def _rollout(self, trial: str, source: str, rows: list[tuple[int | None, dict]]) -> ReadItem:
        first = rows[0][0]
        rollout_id = trial if source == MAIN else f"{trial}/{source}"
        try:
            rows = sorted(rows, key=lambda r: _episode(r[1]))
            builder = RolloutBuilder()
            for where, row in rows:
                sent = chat_messages(row["conversations"], f"r{where}")
                if not sent or sent[-1].role != "assistant":
                    raise ValueError(f"row {where}: the conversation does not end with the reply")
                apply_request(builder, sent[:-1], where)
                builder.append(sent[-1])
            row = rows[-1][1]
            reward, outcome = _reward(row.get("result"))
            meta = {k: row[k] for k in ("agent", "run_id", "model_provider", "date") if row.get(k)}
            if outcome:
                meta["outcome"] = outcome
            if source != MAIN:
                meta["trace_source"] = source
            rollout = builder.build(
                rollout_id=rollout_id,
                task_id=str(row.get("task") or trial),
                source=self.name,
                model=row.get("model"),
                reward=reward,
                parent_rollout_id=trial if source != MAIN else None,
                meta=meta,
            )
        except BAD_CONTENT as exc:
            return Rejected(first, f"trial {rollout_id}: {reason_of(exc)}", records=len(rows))
        return Accepted(rollout, first, records=len(rows))
