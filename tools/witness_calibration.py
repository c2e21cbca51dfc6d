"""Measure the second witness (``pipeline/core/witness.py``) on real session files.

For every pair of consecutive calls of one segment whose log reports both calls' input
tokens, compare the growth of the reported input with the growth of seam's rebuilt input
(``call_spans[j].start``). A pair is *clean* when, in the raw file, nothing but the
previous call's own output and the tool results it asked for lies between the two calls
(Claude Code: no attachment, no user text, no system record the model may see, no
thinking recorded only as a signature; Codex: no compaction, user or developer message);
every other pair is *unclean*, labelled by what lies between.

Prints, per source and model: clean pairs, the measured factor (sum of reported growth /
sum of rebuilt growth on clean pairs), the factor seam uses, the |excess| percentiles on
clean pairs at seam's factor, and the share of clean pairs the witness flags (the
false-flag rate at the chosen threshold), then the flag rate per kind of unclean pair.

    python tools/witness_calibration.py [FILE_OR_DIR ...] [--pairs | --per-file]

Default inputs: the ``claude_code`` and ``codex`` folders of ``$SEAM_REALWORLD_DIR`` and
``$SEAM_REALWORLD_NEW_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from pipeline.build.worker import segmenter_with
from pipeline.core import witness
from pipeline.inspect.verify import iter_input_records

# Claude Code records the model never sees (bookkeeping), and system subtypes alike.
CLAUDE_INVISIBLE = {
    "progress",
    "file-history-snapshot",
    "last-prompt",
    "ai-title",
    "agent-name",
    "mode",
    "permission-mode",
    "summary",
}
CLAUDE_INVISIBLE_SYSTEM = {"turn_duration", "stop_hook_summary"}
# Codex items that are a call's own output or the results it asked for.
CODEX_CLEAN_ITEMS = {
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "reasoning",
}
CODEX_LINE_ID = re.compile(r"L(\d+)$")


@dataclass
class PairRow:
    file: str
    source: str
    model: str
    rollout_id: str
    call_index: int
    pair: witness.Pair
    between: tuple[str, ...]  # what made the pair unclean; empty when clean


class RawFile:
    """One raw file's records, and where each Claude Code response lies in it."""

    def __init__(self, path: Path):
        self.records: list[dict | None] = []
        with open(path, encoding="utf-8", errors="replace") as fh:
            for text in fh:
                try:
                    value = json.loads(text)
                except ValueError:
                    value = None
                self.records.append(value if isinstance(value, dict) else None)
        self.first: dict[str, int] = {}  # message id → first line (0-based)
        self.last: dict[str, int] = {}
        for i, rec in enumerate(self.records):
            if rec and rec.get("type") == "assistant":
                mid = str((rec.get("message") or {}).get("id"))
                self.first.setdefault(mid, i)
                self.last[mid] = i

    def claude_between(self, before: str, after: str) -> tuple[str, ...] | None:
        """What lies between two responses (None: not both in this file)."""
        if before not in self.last or after not in self.first:
            return None
        found = []
        for rec in self.records[self.first[before] : self.first[after]]:
            if rec is None:
                found.append("undecodable")
                continue
            kind = str(rec.get("type"))
            if kind == "assistant":
                mid = str((rec.get("message") or {}).get("id"))
                if mid == before and _signature_only(rec):
                    found.append("signature_only_thinking")
                continue
            if kind in CLAUDE_INVISIBLE:
                continue
            if kind == "system":
                if rec.get("subtype") not in CLAUDE_INVISIBLE_SYSTEM:
                    found.append(f"system:{rec.get('subtype')}")
            elif kind == "attachment":
                found.append(f"attachment:{(rec.get('attachment') or {}).get('type')}")
            elif kind == "user":
                content = (rec.get("message") or {}).get("content")
                blocks = content if isinstance(content, list) else []
                if not blocks or not all(
                    isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks
                ):
                    found.append("user_text")
                elif any(_tool_result_kinds(b) - {"text"} for b in blocks):
                    found.append("tool_result:" + ",".join(sorted(_tool_result_kinds(blocks[0]))))
            else:
                found.append(kind)
        return tuple(dict.fromkeys(found))

    def codex_between(self, before: str, after: str) -> tuple[str, ...] | None:
        a, b = CODEX_LINE_ID.search(before), CODEX_LINE_ID.search(after)
        if a is None or b is None:
            return None
        found = []
        for rec in self.records[int(a[1]) : int(b[1]) - 1]:
            if rec is None:
                found.append("undecodable")
                continue
            kind, payload = rec.get("type"), rec.get("payload") or {}
            if kind in ("event_msg", "turn_context"):
                continue
            if kind != "response_item":
                found.append(str(kind))
            elif payload.get("type") == "message":
                if payload.get("role") != "assistant":
                    found.append(f"message:{payload.get('role')}")
            elif payload.get("type") not in CODEX_CLEAN_ITEMS:
                found.append(str(payload.get("type")))
        return tuple(dict.fromkeys(found))


def _signature_only(rec: dict) -> bool:
    content = (rec.get("message") or {}).get("content")
    return any(
        isinstance(b, dict)
        and b.get("type") == "thinking"
        and not (b.get("thinking") or "").strip()
        and b.get("signature")
        for b in (content if isinstance(content, list) else [])
    )


def _tool_result_kinds(block: dict) -> set[str]:
    content = block.get("content")
    if isinstance(content, list):
        return {str(c.get("type")) for c in content if isinstance(c, dict)}
    return {"text"}


def default_inputs() -> list[Path]:
    found = []
    for var in ("SEAM_REALWORLD_DIR", "SEAM_REALWORLD_NEW_DIR"):
        root = os.environ.get(var)
        for sub in ("claude_code", "codex"):
            if root and (Path(root) / sub).is_dir():
                found.append(Path(root) / sub)
    return found


def files_under(paths: list[Path]) -> list[Path]:
    files = []
    for p in paths:
        files += sorted(q for q in p.rglob("*.jsonl")) if p.is_dir() else [p]
    return files


def measure(paths: list[Path]) -> list[PairRow]:
    """Every witnessed pair of the rollouts read from ``paths``."""
    segmenter = segmenter_with(None, None)
    files = files_under(paths)
    raws = {str(f): RawFile(f) for f in files}
    rows = []
    for file, _, rollout in iter_input_records(files):
        calls = rollout.calls()
        for seg in segmenter.segments(rollout):
            starts = [s.start for s in seg.spans]
            reported = [calls[s.call_index].meta.get("reported_input_tokens") for s in seg.spans]
            for p in witness.pairs(starts, reported, rollout.model):
                before = calls[seg.spans[p.position - 1].call_index].id
                after = calls[seg.spans[p.position].call_index].id
                if rollout.source == "codex":  # line ids: of the file the rollout is named by
                    between = raws[file].codex_between(before, after) if file in raws else None
                else:  # message ids: a session's records may lie in any of its files
                    between = next(
                        (
                            found
                            for raw in [raws.get(file), *raws.values()]
                            if raw is not None
                            and (found := raw.claude_between(before, after)) is not None
                        ),
                        None,
                    )
                rows.append(
                    PairRow(
                        file,
                        rollout.source,
                        rollout.model or "?",
                        rollout.rollout_id,
                        seg.spans[p.position].call_index,
                        p,
                        ("not_in_one_file",) if between is None else between,
                    )
                )
    return rows


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def report(rows: list[PairRow], out=sys.stdout) -> None:
    print(
        f"threshold: |excess| > max({witness.SLACK}, {witness.REL} x factor x rebuilt growth)",
        file=out,
    )
    print(
        "source       model                        clean  measured  used  |excess| p50/p90/p99"
        "      false flags  unclean flagged",
        file=out,
    )
    groups: dict[tuple[str, str], list[PairRow]] = defaultdict(list)
    for r in rows:
        groups[(r.source, r.model)].append(r)
    for (source, model), group in sorted(groups.items()):
        clean = [r for r in group if not r.between]
        unclean = [r for r in group if r.between]
        rebuilt = sum(r.pair.rebuilt_growth for r in clean)
        measured = sum(r.pair.reported_growth for r in clean) / rebuilt if rebuilt > 0 else 0.0
        excess = [abs(r.pair.excess) for r in clean]
        false_flags = sum(r.pair.flagged for r in clean)
        flagged = sum(r.pair.flagged for r in unclean)
        print(
            f"{source:12} {model[:28]:28} {len(clean):5}  {measured:8.3f}  "
            f"{witness.factor(model):4.2f}  {_pct(excess, 0.5):6.0f} {_pct(excess, 0.9):6.0f} "
            f"{_pct(excess, 0.99):6.0f}   {false_flags:4}/{len(clean):<4} "
            f"({100 * false_flags / max(1, len(clean)):4.1f}%)  {flagged:4}/{len(unclean):<4}",
            file=out,
        )
    kinds: dict[str, Counter] = defaultdict(Counter)
    gaps: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for kind in r.between:
            kinds[kind]["pairs"] += 1
            kinds[kind]["flagged"] += r.pair.flagged
            gaps[kind].append(r.pair.excess)
    if kinds:
        print("\nunclean pairs by what lies between (a pair may show several):", file=out)
        for kind, c in sorted(kinds.items(), key=lambda kv: -kv[1]["pairs"]):
            print(
                f"  {kind:40} {c['flagged']:4}/{c['pairs']:<4} flagged, "
                f"median excess {statistics.median(gaps[kind]):8.0f}",
                file=out,
            )


def per_file(paths: list[Path], out=sys.stdout) -> None:
    """Per input file: segments, witnessed calls, the segments the witness flags (and
    their gap tokens), and every context_fidelity reason with its segment count."""
    from pipeline.core.fidelity import segment_fidelity, segment_witnesses

    segmenter = segmenter_with(None, None)
    table: dict[str, Counter] = defaultdict(Counter)
    for file, _, rollout in iter_input_records(files_under(paths)):
        segments = segmenter.segments(rollout)
        row = table[file]
        row["rollouts"] += 1
        row["segments"] += len(segments)
        row["calls"] += sum(len(s.spans) for s in segments)
        for names, seen in zip(
            segment_fidelity(rollout, segments), segment_witnesses(rollout, segments)
        ):
            row["witnessed"] += seen.witnessed
            row["gap_tokens"] += seen.gap_tokens or 0
            for name in names:
                row[f"reason:{name}"] += 1
    print(
        "file | rollouts | segments | witnessed calls | flagged by the witness (tokens) | reasons",
        file=out,
    )
    for file, row in sorted(table.items()):
        reasons = ", ".join(
            f"{k.removeprefix('reason:')} {n}"
            for k, n in sorted(row.items())
            if k.startswith("reason:") and k != "reason:" + witness.GAP_REASON
        )
        print(
            f"{Path(file).name} | {row['rollouts']} | {row['segments']} | "
            f"{row['witnessed']}/{row['calls']} | "
            f"{row['reason:' + witness.GAP_REASON]} ({row['gap_tokens']:,}) | {reasons}",
            file=out,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--pairs", action="store_true", help="Also print every pair.")
    parser.add_argument(
        "--per-file",
        action="store_true",
        help="Instead: per file, the segments the witness flags and every fidelity reason.",
    )
    args = parser.parse_args(argv)
    paths = args.paths or default_inputs()
    if not paths:
        parser.error("no inputs: give files or set SEAM_REALWORLD_DIR / SEAM_REALWORLD_NEW_DIR")
    if args.per_file:
        per_file(paths)
        return 0
    rows = measure(paths)
    if args.pairs:
        for r in rows:
            p = r.pair
            print(
                f"{Path(r.file).name} {r.rollout_id} call {r.call_index}: rebuilt +{p.rebuilt_growth} "
                f"reported +{p.reported_growth} excess {p.excess:.0f} allowed {p.allowed:.0f}"
                f"{' FLAGGED' if p.flagged else ''} {','.join(r.between)}"
            )
    report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
