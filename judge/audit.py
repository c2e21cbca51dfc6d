"""Summary audit: the measures AutoCompact reports for working-state summaries, per
summary and in aggregate (``seam audit``; also columns of the SFT shards).

Rates are over summaries (AutoCompact, SFT → RL): key-state omission — the share of
summaries that drop at least one key item (3.1% → 0.2%); next-step omission — the
share without a concrete next step (8.2% → 2.2%). Also reported: the share of key
items dropped, self-consistency violations (contradictions and wrong workspace state),
invented paths, and summary length in words and characters. The checks are those of
``summary.py``: a floor, not a ceiling (docs/summaries.md).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass

import pyarrow as pa

from judge.facts import paths_memo
from judge.history import Compaction, compactions
from judge.summary import SummaryCheck, check_summary
from judge.workspace import workspace_state
from schemas.replay import replay
from schemas.rollout import Rollout

SUMMARY_AUDIT = pa.struct(
    [
        ("call_index", pa.int32()),  # the summary call (null: a summary a rewrite inserted)
        ("opens_call_index", pa.int32()),  # first call of the window it opens (null: none)
        ("message_id", pa.string()),
        ("words", pa.int32()),
        ("chars", pa.int32()),
        ("key_items", pa.int32()),  # key-state items in the history it summarizes
        ("omitted", pa.list_(pa.struct([("kind", pa.string()), ("value", pa.string())]))),
        ("has_next_step", pa.bool_()),  # a concrete next step, or "none needed" when done
        ("next_step_none", pa.bool_()),  # the next step says nothing is left to do
        ("history_complete", pa.bool_()),  # all history before it is in the rollout
        ("contradictions", pa.list_(pa.string())),
        ("wrong_state", pa.list_(pa.string())),
        ("invented_paths", pa.list_(pa.string())),
    ]
)


@dataclass
class SummaryAudit:
    rollout_id: str
    call_index: int | None
    opens_call_index: int | None
    message_id: str
    words: int
    chars: int
    key_items: int
    omitted: list[dict]
    has_next_step: bool
    next_step_none: bool
    history_complete: bool
    contradictions: list[str]
    wrong_state: list[str]
    invented_paths: list[str]

    def as_struct(self) -> dict:
        row = asdict(self)
        del row["rollout_id"]
        return row


def audit_rollout(rollout: Rollout) -> list[SummaryAudit]:
    """One audit per summary of the rollout (``history.summary_of`` decides what one is:
    summary calls and rewrite-inserted summaries alike), in order. An opaque summary
    (Codex's encrypted remote compaction) has no text to check and is not audited."""
    with paths_memo():
        return _audit_rollout(rollout)


def _audit_rollout(rollout: Rollout) -> list[SummaryAudit]:
    audits = []
    for comp in compactions(rollout, replay(rollout)):
        if comp.opaque:
            continue
        check = summary_check(comp)
        audits.append(
            SummaryAudit(
                rollout_id=rollout.rollout_id,
                call_index=comp.summary_call.index if comp.summary_call else None,
                opens_call_index=comp.opens.index if comp.opens else None,
                message_id=comp.message_id,
                words=check.words,
                chars=check.chars,
                key_items=check.key_items,
                omitted=[o.model_dump() for o in check.omitted],
                has_next_step=check.has_next_step,
                next_step_none=check.next_step_none,
                history_complete=comp.history_complete,
                contradictions=check.contradictions,
                wrong_state=check.wrong_state,
                invented_paths=check.invented_paths,
            )
        )
    return audits


def call_findings(rollout: Rollout) -> list[tuple[int | None, dict]]:
    """``(summary call index, its audit as a SUMMARY_AUDIT struct)`` per summary: what
    ``seam show`` prints under the call (``pipeline/inspect/show/audits.py``; None for a
    summary a rewrite inserted, which is no call)."""
    return [(a.call_index, a.as_struct()) for a in audit_rollout(rollout)]


def summary_check(comp: Compaction) -> SummaryCheck:
    """The summary checks of one compaction: its live context is the state it must keep,
    its whole prior history the truth its claims are held to."""
    return check_summary(
        comp.summary,
        workspace_state(comp.history),
        workspace_state(comp.prior),
        history_complete=comp.history_complete,
    )


def aggregate(audits: list[dict]) -> dict:
    """Aggregate measures over audit records (``SummaryAudit.as_struct()`` dicts)."""
    n = len(audits)
    if n == 0:
        return {"summaries": 0}
    key_items = sum(a["key_items"] for a in audits)
    omitted_items = sum(len(a["omitted"]) for a in audits)
    words = [a["words"] for a in audits]

    def rate(pred) -> float:
        return round(sum(1 for a in audits if pred(a)) / n, 4)

    return {
        "summaries": n,
        "key_state_omission_rate": rate(lambda a: a["omitted"]),
        "key_item_omission_rate": round(omitted_items / key_items, 4) if key_items else 0.0,
        "next_step_omission_rate": rate(lambda a: not a["has_next_step"]),
        "self_consistency_violation_rate": rate(lambda a: a["contradictions"] or a["wrong_state"]),
        "contradiction_rate": rate(lambda a: a["contradictions"]),
        "wrong_state_rate": rate(lambda a: a["wrong_state"]),
        "invented_path_rate": rate(lambda a: a["invented_paths"]),
        # Summaries after an incomplete history (a slice): invented paths are not judged.
        "history_incomplete": sum(1 for a in audits if a.get("history_complete") is False),
        "omitted_by_kind": dict(
            sorted(Counter(o["kind"] for a in audits for o in a["omitted"]).items())
        ),
        "words_mean": round(statistics.fmean(words), 1),
        "words_median": statistics.median(words),
        "chars_mean": round(statistics.fmean(a["chars"] for a in audits), 1),
    }


def audit_table(agg: dict, title: str = "summary audit"):
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("AutoCompact (SFT → RL)", justify="right")
    reference = {"key_state_omission_rate": "3.1% → 0.2%", "next_step_omission_rate": "8.2% → 2.2%"}
    for key, value in agg.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
        elif isinstance(value, float) and key.endswith("rate"):
            value = f"{value:.1%}"
        table.add_row(key.replace("_", " "), str(value), reference.get(key, ""))
    return table
