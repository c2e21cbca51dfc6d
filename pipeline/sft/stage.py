"""The SFT stage of the build: corrections, filters, audit columns, preference pairs.

``seam build-sft`` is the ordinary build (``pipeline/build/run.py``) with this stage plugged
in. Per rollout, inside the build's workers (``TaskStage``):

1. attach corrections (embedded, and from ``--corrections FILE``); the ones that do not
   fit go to quarantine with their reason (``attach.py``);
2. trim a last call left waiting for its tool result (a transcript saved mid-tool;
   counted as ``trimmed_dangling_calls``), then run the filters; a filtered rollout goes
   to quarantine as ``filtered (REASON): ...`` and is counted by reason, so
   ``read = accepted + quarantined`` still holds; with ``--synthesize-summary-calls``,
   add a summary call before each harness-inserted summary whose history is complete
   (``synthesize.py``; counted as ``synthesized_summary_calls``);
3. after segmenting and masking (the same rows as RL), drop over-length segments and
   add the SFT columns: ``messages``, ``corrections``, ``summary_audit``, ``tools``;
4. collect one preference pair per attached correction: the call's context (what the
   policy saw), ``chosen`` = the executed replacement, ``rejected`` = the original.

The original proposal of a corrected call is never in ``input_ids``: rows are built
from the rollout, which holds what was executed. Once all tasks are done,
``SftStage.finalize`` writes ``pairs/`` and reports corrections that named no accepted
rollout or were not valid records.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from judge.audit import SUMMARY_AUDIT, audit_rollout
from judge.measured import OPT_IN_REASON
from pipeline.build.stage import PlainStage
from pipeline.common.atomic import atomic_write
from pipeline.common.options import fingerprint_of
from pipeline.core.mask import MaskedSegment
from pipeline.core.render import template_message
from pipeline.sft.attach import CorrectionsFile, attach
from pipeline.sft.config import SftOptions
from pipeline.sft.filters import FilterOptions, over_length, rollout_filter, trim_dangling_call
from pipeline.sft.synthesize import synthesize_summary_calls
from schemas.correction import executed_output_text
from schemas.replay import replay
from schemas.rollout import Rollout

_EVIDENCE = pa.struct([("message_id", pa.string()), ("quote", pa.string())])
_OMITTED = pa.struct([("kind", pa.string()), ("value", pa.string())])
CORRECTION = pa.struct(
    [
        ("call_index", pa.int32()),
        ("type", pa.string()),
        ("verdict", pa.string()),
        ("original", pa.string()),
        ("replacement", pa.string()),
        ("rationale", pa.string()),
        ("evidence", pa.list_(_EVIDENCE)),
        ("omitted", pa.list_(_OMITTED)),
        ("judge_model", pa.string()),
        ("prompt_hash", pa.string()),
    ]
)
SFT_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    (
        "messages",
        pa.string(),
        "JSON list of the segment's chat messages (its last call's context + that call), in "
        'Hugging Face chat format; assistant messages carry "train": whether this segment trains them.',
    ),
    (
        "corrections",
        pa.list_(CORRECTION),
        "Judge corrections of calls trained in this segment (original = the "
        "proposal that was replaced and is not in input_ids).",
    ),
    (
        "summary_audit",
        pa.list_(SUMMARY_AUDIT),
        "Audit of each summary written in this segment (judge/audit.py).",
    ),
    (
        "tools",
        pa.string(),
        "JSON list of the rollout's tool schemas (OpenAI style) that the chat template rendered "
        "into input_ids: apply_chat_template(messages, tools=json.loads(tools)) re-renders the row.",
    ),
]
_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
PAIR_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("call_index", pa.int32()),
        ("type", pa.string()),
        ("verdict", pa.string()),
        ("rationale", pa.string()),
        ("judge_model", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("chosen", pa.list_(_MESSAGE)),
        ("rejected", pa.list_(_MESSAGE)),
        ("tools", pa.string()),
    ]
)
# A task's side file also carries the rollout's ordinal in the task (the build's own
# numbering), so that the pairs of a rollout the build takes back out (a later copy of a
# duplicate id, ``pipeline/build/run.py``) go with its rows.
_SIDE_SCHEMA = PAIR_SCHEMA.append(pa.field("ordinal", pa.int64()))


@dataclass(frozen=True)
class SftStage(SftOptions, PlainStage):
    """Picklable configuration of the stage (its fields, each with its ``build-sft`` flag,
    are ``SftOptions``': ``pipeline/sft/config.py``); the build calls ``open_task`` in each
    worker. Registered as ``"sft"`` (``pipeline/build/stage.py``): what readers of an SFT
    build ask of it is answered here."""

    extra_fields = [
        pa.field(name, dtype, nullable=False, metadata={"doc": doc})
        for name, dtype, doc in SFT_COLUMNS
    ]
    requires_outcome = False  # SFT rows need no reward
    drops_segments = True  # the length filter (--max-length) leaves segments out
    quarantine_counts = ("corrections_quarantined",)  # corrections are not rollouts
    trl_mode = "sft"
    side_datasets = {"pairs": "preference pairs"}  # pairs/pairs-*.parquet

    @classmethod
    def from_manifest(cls, recorded: Mapping[str, Any]) -> SftStage:
        """The stage as ``fingerprint()`` recorded it: its filters and the synthesis
        prompt (the corrections file is recorded by hash only; reading a build does not
        need it — attached corrections are in the inputs as built)."""
        known = {f.name for f in fields(FilterOptions)}
        given = {k: v for k, v in (recorded.get("filters") or {}).items() if k in known}
        synth = recorded.get("synthesize_summary_calls")
        return cls(
            filters=FilterOptions(**given), synthesize_prompt=synth["prompt"] if synth else None
        )

    def as_built(self, rollout: Rollout) -> Rollout:
        """The rollout as this stage turned it into rows — dangling last call trimmed,
        summary calls synthesized — for ``seam verify`` and ``show``, which replay the
        inputs."""
        trimmed = trim_dangling_call(rollout)
        rollout = trimmed if trimmed is not None else rollout
        if self.synthesize_prompt is not None:
            rollout, _ = synthesize_summary_calls(rollout, self.synthesize_prompt)
        return rollout

    def fingerprint(self) -> dict:
        """What changes the output bytes: the filter switches and the corrections file's content."""
        from pipeline.build.write import file_sha256

        digest = file_sha256(Path(self.corrections_file)) if self.corrections_file else None
        # The fields' own (SftOptions): the filters, the synthesis prompt when one is used
        # (in the manifest: what verify re-applies); the corrections by their content.
        found = fingerprint_of(self)
        return {"filters": found.pop("filters"), "corrections_sha256": digest, **found}

    def open_task(self, out: str, task_index: int) -> TaskStage:
        return TaskStage(self, _side_paths(out, task_index), _corrections(self.corrections_file))

    def finalize(
        self,
        out: str,
        task_indices: list[int],
        dest: Path | None = None,
        excluded: dict[int, set[int]] | None = None,
    ) -> dict:
        """Write ``pairs/`` and append the file's corrections no rollout claimed to
        ``quarantine.jsonl``, both in ``dest`` (default ``out``: the build passes its
        staging directory); return counts to add to the manifest. ``excluded``: per task,
        the ordinals of rollouts the build took back out; their pairs go too."""
        dest = Path(dest or out)
        excluded = excluded or {}
        claimed: set[str] = set()
        tables = []
        for index in task_indices:
            pairs_path, claimed_path = _side_paths(out, index)
            claimed.update(json.loads(claimed_path.read_text()))
            table = pq.read_table(pairs_path, schema=_SIDE_SCHEMA)
            left_out = excluded.get(index)
            if left_out:
                gone = pc.is_in(table["ordinal"], pa.array(sorted(left_out), pa.int64()))
                table = table.filter(pc.invert(gone))
            tables.append(table.drop_columns(["ordinal"]))
        counts: Counter = Counter()
        corrections = _corrections(self.corrections_file)
        if corrections is not None:
            lost = corrections.invalid + corrections.unclaimed(claimed)
            with open(dest / "quarantine.jsonl", "a") as fh:
                for rejection in lost:
                    fh.write(json.dumps(rejection.quarantine_entry(), ensure_ascii=False) + "\n")
            counts["corrections_quarantined"] += len(lost)
        pairs = pa.concat_tables(tables) if tables else PAIR_SCHEMA.empty_table()
        _write_pairs(dest / "pairs", pairs)
        counts["preference_pairs"] = pairs.num_rows
        return dict(counts)


_LOADED: dict[str, CorrectionsFile] = {}


def _corrections(path: str | None) -> CorrectionsFile | None:
    """The corrections file, read once per process."""
    if path is None:
        return None
    if path not in _LOADED:
        _LOADED[path] = CorrectionsFile(path)
    return _LOADED[path]


def _side_paths(out: str, task_index: int) -> tuple[Path, Path]:
    """(pairs, claimed rollout ids) files of one task, next to the build's part files."""
    base = Path(out) / ".parts" / f"part-{task_index:06d}"
    return base.with_name(base.name + ".sft-pairs.parquet"), base.with_name(
        base.name + ".sft-claimed.json"
    )


class TaskStage:
    """The stage for one build task: per-rollout work, then ``close`` writes its side files."""

    def __init__(
        self, stage: SftStage, side: tuple[Path, Path], corrections: CorrectionsFile | None
    ):
        self.stage, self.side, self.corrections = stage, side, corrections
        self.pairs: list[dict] = []
        self.accepted = 0  # rollouts accepted so far: the build's ordinal of the next one
        self.claimed: set[str] = set()
        self.counts: Counter = Counter()

    def prepare(self, rollout: Rollout) -> tuple[Rollout | None, str | None, list[dict]]:
        """(rollout with corrections, or None when filtered; filter reason; quarantine entries)."""
        extra = self.corrections.for_rollout(rollout.rollout_id) if self.corrections else []
        if extra:
            self.claimed.add(rollout.rollout_id)
        trimmed = trim_dangling_call(rollout)
        if trimmed is not None:
            self.counts["trimmed_dangling_calls"] += 1
            rollout = trimmed
        attached, rejected = attach(rollout, extra)
        entries = [r.quarantine_entry() for r in rejected]
        self.counts["corrections_quarantined"] += len(rejected)
        opt_in = sum(1 for r in rejected if r.reason.startswith(OPT_IN_REASON))
        if opt_in:  # (a zero would add a key to every build's counts)
            self.counts["corrections_quarantined_opt_in_check"] += opt_in
        dropped = rollout_filter(attached, self.stage.filters)
        if dropped:
            reason, detail = dropped
            self.counts[f"filtered_{reason}"] += 1
            return None, f"filtered ({reason}): {detail}", entries
        if self.stage.synthesize_prompt is not None:
            attached, added = synthesize_summary_calls(attached, self.stage.synthesize_prompt)
            self.counts["synthesized_summary_calls"] += added
        return attached, None, entries

    def keep_segment(self, num_tokens: int) -> bool:
        if over_length(num_tokens, self.stage.filters):
            self.counts["filtered_over_length_segments"] += 1
            return False
        return True

    def accept(self, rollout: Rollout, segments: Sequence[MaskedSegment]) -> dict[str, list]:
        """The rollout became rows: count its corrections, keep its pairs, and return the
        SFT column values of its rows (``segments``: its masked segments, in order)."""
        self.counts["corrections_attached"] += len(rollout.corrections)
        self.counts.update(f"corrections_{c.type}" for c in rollout.corrections)
        views = replay(rollout)
        pairs = _pairs(rollout, views)
        audit_at = _audits_by_segment(audit_rollout(rollout), segments)
        by_call: dict[int, list] = {}
        for c in rollout.corrections:
            by_call.setdefault(c.call_index, []).append(
                c.model_dump(mode="json", exclude={"rollout_id"})
            )
        tools = json.dumps(rollout.tools, ensure_ascii=False)
        values: dict[str, list] = {
            "messages": [],
            "corrections": [],
            "summary_audit": [],
            "tools": [tools] * len(segments),
        }
        for at, masked in enumerate(segments):
            spans = masked.segment.spans
            trained_ids = {
                views[s.call_index].message.id for s, t in zip(spans, masked.trained) if t
            }
            last = views[spans[-1].call_index]
            messages = []
            for msg in (*last.context, last.message):
                item = template_message(msg)
                if msg.role == "assistant":
                    item["train"] = msg.id in trained_ids
                messages.append(item)
            values["messages"].append(json.dumps(messages, ensure_ascii=False))
            values["corrections"].append([c for s in spans for c in by_call.get(s.call_index, [])])
            values["summary_audit"].append(audit_at.get(at, []))
        # Only now is the rollout accepted (a raise above quarantines it, pairs and all).
        self.pairs += [{**pair, "ordinal": self.accepted} for pair in pairs]
        self.accepted += 1
        return values

    def close(self) -> dict:
        pairs_path, claimed_path = self.side
        _atomic(
            pairs_path,
            lambda tmp: pq.write_table(pa.Table.from_pylist(self.pairs, schema=_SIDE_SCHEMA), tmp),
        )
        _atomic(claimed_path, lambda tmp: Path(tmp).write_text(json.dumps(sorted(self.claimed))))
        return dict(self.counts)


def _audits_by_segment(audits, segments) -> dict[int, list[dict]]:
    """Each summary audit on exactly one row: the segment that trains its summary call, or
    (a summary a rewrite inserted) the segment that opens with the first call that saw it;
    when that segment was dropped, the next kept one, else the rollout's last — so the
    SFT build carries an audit for every compaction ``seam audit`` finds in its inputs."""
    found: dict[int, list[dict]] = {}
    if not segments:
        return found
    firsts = [m.segment.spans[0].call_index if m.segment.spans else 0 for m in segments]
    lasts = [m.segment.spans[-1].call_index if m.segment.spans else 0 for m in segments]
    for audit in audits:
        target = audit.call_index if audit.call_index is not None else audit.opens_call_index
        at = len(segments) - 1
        if target is not None:
            holding = [
                i
                for i, m in enumerate(segments)
                if any(s.call_index == target for s in m.segment.spans)
            ]
            later = [i for i in range(len(segments)) if firsts[i] >= target or lasts[i] >= target]
            at = (holding or later or [at])[0]
        found.setdefault(at, []).append(audit.as_struct())
    return found


def _pairs(rollout: Rollout, views) -> list[dict]:
    """Preference pairs: the context the policy saw at the call, chosen = executed
    replacement, rejected = original proposal. Assistant turns of the context show their
    executed output text (tool calls inline, as the chat template writes them)."""
    rows = []
    for c in rollout.corrections:
        prompt = [
            {
                "role": m.role,
                "content": executed_output_text(m) if m.role == "assistant" else m.content,
            }
            for m in views[c.call_index].context
        ]
        rows.append(
            {
                "rollout_id": rollout.rollout_id,
                "task_id": rollout.task_id,
                "call_index": c.call_index,
                "type": c.type,
                "verdict": c.verdict,
                "rationale": c.rationale,
                "judge_model": c.judge_model,
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": c.replacement}],
                "rejected": [{"role": "assistant", "content": c.original}],
                # TRL's DPOTrainer renders the prompt with this column's tools (JSON string).
                "tools": json.dumps(rollout.tools, ensure_ascii=False),
            }
        )
    return rows


def _atomic(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write)


def _write_pairs(directory: Path, table: pa.Table) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _atomic(
        directory / "pairs-00000-of-00001.parquet",
        lambda tmp: pq.write_table(table, tmp, compression="zstd"),
    )
    card = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        '    path: "pairs-*.parquet"',
        "tags:",
        "- seam",
        "- dpo",
        "---",
        "",
        "# seam preference pairs",
        "",
        f"{table.num_rows} pairs, one per judge correction: `prompt` is the context the policy saw at the "
        "corrected call, `chosen` the executed replacement, `rejected` the original proposal. "
        "Columns map directly onto TRL's DPOTrainer (`prompt`, `chosen`, `rejected`, conversational format; "
        "`tools`, the rollout's tool schemas as JSON, which TRL renders into the prompt).",
        "",
    ]
    _atomic(directory / "README.md", lambda tmp: Path(tmp).write_text("\n".join(card)))
