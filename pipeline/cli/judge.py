"""``seam judge``, ``seam audit`` and ``seam build-sft``."""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from pipeline.build.quarantine import StreamQuarantine
from pipeline.cli.aliases import deprecated_alias
from pipeline.common.errors import UsageError
from pipeline.sources.read_context import ReadContext
from schemas.rollout import Rollout


def iter_input_rollouts(specs: list[str], fmt: str, rejected: Counter, *args, **kwargs):
    """The rollouts of ``iter_input_sources`` (same arguments), without their paths."""
    return (rollout for _path, rollout in iter_input_sources(specs, fmt, rejected, *args, **kwargs))


def iter_input_sources(
    specs: list[str],
    fmt: str,
    rejected: Counter,
    context: ReadContext | None = None,
    quarantine: str | None = None,
    drop_damaged: bool = False,
) -> Iterator[tuple[str, Rollout]]:
    """``(file path, rollout)`` for every rollout of the inputs that passes the judge's
    steps (``pipeline/build/steps.py``): read as the builds read them, under ``context``
    (the limits and ``--group-by`` of the command line: ``read_context``) → drop damaged logs (audit,
    ``drop_damaged``) → drop duplicate ids. Every quarantined record is counted in
    ``rejected`` by file and reason, and written to ``quarantine`` (a file, as a build's
    ``quarantine.jsonl``) when given."""
    from pipeline.build.steps import (
        DropDamaged,
        DropDuplicates,
        Pipeline,
        ReadRecords,
        Step,
        plan_reading,
    )

    context = context or ReadContext()
    _files, tasks = plan_reading(specs, fmt, context)
    steps: list[Step] = [DropDamaged()] if drop_damaged else []
    steps.append(DropDuplicates())
    with _QuarantineFile(quarantine, rejected, context) as sink:
        pipeline = Pipeline(ReadRecords(tasks, context), steps, sink)
        for item in pipeline:
            yield item.task.path, item.rollout


class _QuarantineFile:
    """The judge's and audit's quarantine: counted by file and reason (``rejected``), and
    written as a build's ``quarantine.jsonl`` to ``path`` when one is given (bounded by the
    limits in force, like ``seam ingest``'s)."""

    def __init__(self, path: str | None, rejected: Counter, context: ReadContext):
        self.path = path
        self.limits = context.limits
        self.rejected = rejected
        self.writer: StreamQuarantine | None = None

    def __enter__(self):
        if self.path is not None:
            self._handle = open(self.path, "w", encoding="utf-8")
            self.writer = StreamQuarantine(self._handle, self.limits)
        return self

    def __exit__(self, *exc) -> None:
        if self.writer is not None:
            self._handle.close()

    def reject(self, rejection) -> None:
        self.rejected[f"{rejection.task_path}: {_reason_kind(rejection.reason)}"] += 1
        if self.writer is not None:
            self.writer.add(rejection.entry(), rejection.raw or "")


def _reason_kind(reason: str) -> str:
    """A quarantine reason to count by: a reason about one rollout without its details
    (``rollout ID: damaged log`` from ``rollout ID: damaged log (lost records); ...``),
    any other reason up to its first colon (``invalid JSON`` from ``invalid JSON: ...``)."""
    if reason.startswith("rollout ") and ": " in reason:
        head, _, rest = reason.partition(": ")
        return f"{head}: {rest.split(' (')[0].split(';')[0].strip()}"
    return reason.split(":")[0]


def read_context(args) -> ReadContext:
    """The input limits and ``--group-by`` of the command line, as the builds and ``seam
    ingest`` read under them."""
    from pipeline.common.options import config_from_args
    from pipeline.sources.input_config import InputConfig

    return config_from_args(InputConfig, args).read_context()


def _open_out(path: str):
    """The file to write, or stdout for ``-`` (left open: more output may follow)."""
    return contextlib.nullcontext(sys.stdout) if path == "-" else open(path, "w")


def _checks(spec: str) -> tuple[str, ...]:
    from judge.rules import ALL_CHECKS, DEFAULT_CHECKS

    if spec == "default":
        return DEFAULT_CHECKS
    if spec == "all":
        return ALL_CHECKS
    names = tuple(n.strip() for n in spec.split(",") if n.strip())
    unknown = [n for n in names if n not in ALL_CHECKS]
    if unknown:
        raise UsageError(
            f"--checks: unknown check {unknown[0]!r} (known: default, all, {', '.join(ALL_CHECKS)})"
        )
    return names


def _refuse_options_that_do_not_apply(args) -> None:
    """An LLM judge option without ``--llm``, or ``--json``/``--split`` without
    ``--eval``, is an error in one line, not silently ignored."""
    from judge.llm_options import ClientConfig, LlmJudgeOptions
    from pipeline.common.options import dest_of, flag_default, flagged_fields, option_of

    if not args.llm:
        for config in (ClientConfig, LlmJudgeOptions):
            for field in flagged_fields(config):
                spec = option_of(field)
                assert spec is not None and spec.flag is not None
                if getattr(args, dest_of(spec.flag)) != flag_default(field):
                    raise UsageError(
                        f"{spec.flag} applies to the LLM judge: give --llm URL --model M"
                    )
    if not args.eval and (args.json or args.split):
        raise UsageError(f"{'--json' if args.json else '--split'} goes with --eval LABELS")


def run_judge(args) -> int:
    from rich.console import Console

    from pipeline.common import extras

    if args.llm:
        extras.require("judge-llm", "judge --llm")
    _refuse_options_that_do_not_apply(args)
    rejected: Counter = Counter()
    console = Console(stderr=True)
    read_context(args)  # its limits refused before any work when out of range
    if args.eval:
        return _run_eval(args, rejected)
    rollouts = iter_input_rollouts(
        args.inputs, args.format, rejected, read_context(args), args.quarantine
    )
    checks = _checks(args.checks)
    if args.llm:
        findings, failures, usage = _llm_findings(args, rollouts)
    else:
        from judge.measured import checks_report
        from judge.rules import RULE_JUDGE, judge_rollout

        findings = [f for r in rollouts for f in judge_rollout(r, checks)]
        failures, usage = [], None
        console.print(
            f"rule judge {RULE_JUDGE}; checks that ran (measured precision, docs/sft.md):"
        )
        for line in checks_report(checks):
            console.print(f"  {line}", highlight=False, soft_wrap=True)
    with _open_out(args.out) as out:
        for f in findings:
            out.write(f.model_dump_json() + "\n")
    by_kind = Counter(f"{f.type}/{f.verdict}" for f in findings)
    console.print(
        f"{len(findings)} finding(s): "
        + (", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())) or "none")
    )
    for reason, n in sorted(rejected.items()):
        console.print(f"[yellow]skipped {n} invalid record(s)[/]: {reason}")
    if usage is not None:
        console.print("llm usage: " + json.dumps(usage))
    if failures:
        errors = args.errors or (
            args.out + ".errors.jsonl" if args.out != "-" else "judge-errors.jsonl"
        )
        Path(errors).write_text("".join(json.dumps(asdict(f)) + "\n" for f in failures))
        unjudged = [f for f in failures if not f.reason.startswith("voided ")]
        if unjudged:
            steps = usage["answered"] + usage["failures"]
            reason, n = Counter(f.reason for f in unjudged).most_common(1)[0]
            console.print(
                f"[red]{len(unjudged)} of {steps} step(s) could not be judged[/]; "
                f"most often ({n}×): {reason}",
                highlight=False,
            )
        if len(failures) > len(unjudged):
            console.print(
                f"[yellow]{len(failures) - len(unjudged)} finding(s) voided[/]: a quote not in "
                "the history"
            )
        console.print(f"see {errors}")
    # A step left unjudged fails the run: its findings are incomplete.
    return 1 if usage is not None and usage["failures"] else 0


def _run_eval(args, rejected: Counter) -> int:
    """``seam judge --eval LABELS``: precision and recall of every rule check."""
    from rich.console import Console
    from rich.table import Table

    from judge.calibration import evaluate, load_labels
    from judge.rules import DEFAULT_CHECKS, RULE_JUDGE

    if not Path(args.eval).is_file():
        raise UsageError(f"--eval {args.eval}: no such file")
    try:
        labels = load_labels(args.eval)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.split:
        labels = [lab for lab in labels if lab.split == args.split]
    sources = iter_input_sources(
        args.inputs, args.format, rejected, read_context(args), args.quarantine
    )
    failures: list = []
    if args.llm:  # calibrate an LLM judge: its findings, scored the same way
        from judge.llm import PROMPT_VERSION, judge_rollouts

        client = _chat_client(args)
        asking = _judge_options(args)
        judge_name = f"LLM judge {args.model} (prompt {PROMPT_VERSION})"

        def findings_of(rollout):
            found, failed = judge_rollouts(
                [rollout], client, asking.concurrency, False, asking.max_context_chars
            )
            failures.extend(failed)
            return found

        with client:
            result = evaluate(labels, list(sources), findings_of)
    else:
        judge_name = f"rule judge {RULE_JUDGE}"
        result = evaluate(labels, list(sources))
    voided = [f for f in failures if f.reason.startswith("voided ")]
    unjudged = len(failures) - len(voided)
    rows = {check: score.as_dict() for check, score in result.scores.items()}
    if args.json:
        print(
            json.dumps(
                {
                    "judge": judge_name,
                    "labelled": result.labelled,
                    "voided": len(voided),
                    "unjudged": unjudged,
                    "checks": rows,
                    "default_checks": list(DEFAULT_CHECKS),
                    "unlabelled": result.unlabelled,
                    "labels_not_found": result.missing,
                    "misses": result.misses,
                },
                indent=2,
            )
        )
    else:
        table = Table(
            title=f"{judge_name} on {result.labelled} labelled compactions",
            header_style="bold",
        )
        for name in (
            "check",
            "default",
            "flags",
            "positives",
            "TP",
            "FP",
            "FN",
            "precision",
            "recall",
        ):
            table.add_column(name, justify="left" if name == "check" else "right")

        def pct(value):
            return "n/a" if value is None else f"{value:.2f}"

        for check, row in rows.items():
            table.add_row(
                check,
                "on" if check in DEFAULT_CHECKS else "off",
                str(row["flags"]),
                str(row["positives"]),
                str(row["tp"]),
                str(row["fp"]),
                str(row["fn"]),
                pct(row["precision"]),
                pct(row["recall"]),
            )
        console = Console(width=max(Console().width, 110))
        console.print(table)
        for miss in result.misses:
            console.print(f"  {miss}")
        if result.unlabelled:
            console.print(f"{len(result.unlabelled)} compaction(s) without a label (not scored)")
    err = Console(stderr=True)
    if voided:
        err.print(
            f"[yellow]{len(voided)} finding(s) voided[/]: a quote not in the history "
            f"(not counted as flags); first: {voided[0].reason[:160]}",
            highlight=False,
        )
    if unjudged:
        err.print(f"[red]{unjudged} step(s) could not be judged[/]: the scores are incomplete")
    if result.missing:
        err.print(
            f"[red]{len(result.missing)} label(s) name no compaction of the inputs[/]: "
            + "; ".join(result.missing[:3])
        )
        return 1
    return 1 if unjudged else 0


def _chat_client(args):
    """The chat client of ``--llm URL --model M`` and its options (``ClientConfig``)."""
    from judge.chat_client import ChatClient
    from judge.llm_options import ClientConfig
    from pipeline.common.options import config_from_args

    if not args.model:
        raise UsageError("--llm needs --model (the model name the endpoint serves)")
    return ChatClient(config_from_args(ClientConfig, args))


def _judge_options(args):
    """How the LLM judge asks (``LlmJudgeOptions``: --concurrency, --every-call, ...)."""
    from judge.llm_options import LlmJudgeOptions
    from pipeline.common.options import config_from_args

    return config_from_args(LlmJudgeOptions, args)


def _llm_findings(args, rollouts):
    from rich.console import Console

    from judge.llm import PROMPT_VERSION, judge_rollouts

    findings, failures = [], []
    asking = _judge_options(args)
    with _chat_client(args) as client:
        Console(stderr=True).print(
            f"LLM judge {args.model} at {client.url} (prompt {PROMPT_VERSION})"
        )
        batch: list[Rollout] = []
        for rollout in [*rollouts, None]:
            if rollout is not None:
                batch.append(rollout)
            if batch and (rollout is None or len(batch) == asking.batch):  # bounded memory
                found, failed = judge_rollouts(
                    batch, client, asking.concurrency, asking.every_call, asking.max_context_chars
                )
                findings += found
                failures += failed
                batch = []
    return findings, failures, client.usage.as_dict(client.config)


def run_audit(args) -> int:
    from rich.console import Console

    from judge.audit import aggregate, audit_rollout, audit_table

    read_context(args)  # its limits refused before any work when out of range
    target = Path(args.inputs[0])
    if len(args.inputs) == 1 and (target / "manifest.json").exists():
        records = _audits_from_shards(target)
    else:
        rejected: Counter = Counter()
        records = []
        # Damaged logs are left out as the builds quarantine them, unless --keep-damaged.
        for rollout in iter_input_rollouts(
            args.inputs,
            args.format,
            rejected,
            read_context(args),
            args.quarantine,
            drop_damaged=not args.keep_damaged,
        ):
            records += [
                {"rollout_id": a.rollout_id, **a.as_struct()} for a in audit_rollout(rollout)
            ]
        for reason, n in sorted(rejected.items()):
            print(f"skipped {n} rollout(s) or record(s): {reason}", file=sys.stderr)
    if args.out:
        with _open_out(args.out) as out:
            for record in records:
                out.write(json.dumps(record) + "\n")
    agg = aggregate(records)
    if args.json:
        print(json.dumps(agg, indent=2))
    else:
        Console().print(audit_table(agg, f"summary audit of {', '.join(args.inputs)}"))
    return 0


def _audits_from_shards(build_dir: Path) -> list[dict]:
    import duckdb

    from pipeline.build.manifest import Manifest

    files = [str(build_dir / s) for s in Manifest.read(build_dir).shards]
    con = duckdb.connect()
    names = {
        r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [files]).fetchall()
    }
    if "summary_audit" not in names:
        raise UsageError(
            f"{build_dir} has no summary_audit column (an RL build?); audit its inputs instead"
        )
    rows = con.execute(
        "SELECT rollout_id, UNNEST(summary_audit, max_depth := 2) FROM read_parquet(?) "
        "WHERE len(summary_audit) > 0",
        [files],
    ).fetchall()
    columns = [d[0] for d in con.description]
    return [dict(zip(columns, row)) for row in rows]


def register(sub) -> None:
    p = sub.add_parser(
        "judge",
        help="Judge rollouts (rule judge, or an LLM judge) → findings JSONL.",
        description="Review every compaction decision, summary and post-compaction step of the input rollouts and "
        "write one finding per error (JSONL of schemas.correction.Finding). Without --llm the "
        "deterministic rule judge runs (no network). With --llm URL --model M each candidate step is "
        "sent to an OpenAI-compatible /v1/chat/completions endpoint, showing only the history up to "
        "the step. Findings are verdicts, not corrections: a correction also records the executed "
        "replacement (see docs/sft.md).",
    )
    _add_input_arguments(p)
    p.add_argument("--out", default="-", help="Findings JSONL file (default: stdout).")
    from judge.llm_options import ClientConfig, LlmJudgeOptions
    from pipeline.common.options import add_options
    from pipeline.sources.limits import MIB

    # The LLM judge's options: one definition each, with the library's defaults.
    add_options(p, ClientConfig)
    deprecated_alias(p, "--max-tokens", "--max-answer-tokens", dest="max_answer_tokens", type=int)
    deprecated_alias(  # bytes, as MiB: the one definition converts back exactly
        p,
        "--max-response-bytes",
        "--max-response-mb",
        dest="max_response_mb",
        type=lambda n: int(n) / MIB,
    )
    add_options(p, LlmJudgeOptions)
    p.add_argument(
        "--errors",
        help="Where to write the steps that could not be judged (default OUT.errors.jsonl).",
    )
    p.add_argument(
        "--checks",
        default="default",
        help="Rule checks to report: default (those calibrated to precision >= 0.8 on the shipped "
        "labels, docs/sft.md), all, or a comma list of type/verdict names (state/invented, ...).",
    )
    p.add_argument(
        "--eval",
        metavar="LABELS",
        help="Score every rule check against hand labels (JSONL, schema in docs/sft.md) of the "
        "compactions in INPUT and print precision and recall per check; writes no findings. "
        "With --llm URL --model M, score that LLM judge instead (calibrate any endpoint).",
    )
    p.add_argument("--json", action="store_true", help="With --eval: print the scores as JSON.")
    p.add_argument(
        "--split",
        choices=("tune", "holdout"),
        help="With --eval: score only the labels of this part of the set (their `split` field; "
        "docs/labels.md); the other labels are left out, not reported as missing.",
    )
    p.set_defaults(func=run_judge)

    a = sub.add_parser(
        "audit",
        help="Audit compaction summaries: key-state and next-step omission, contradictions, invented paths.",
        description="Check every compaction summary against the history it was written from and print per-measure "
        "rates (AutoCompact's measures: key-state omission rate, next-step omission rate) plus "
        "self-consistency violations, invented paths and summary length. DIR_OR_INPUT is an SFT build "
        "directory (its summary_audit column is read) or rollout files/directories/globs.",
    )
    _add_input_arguments(a, metavar="DIR_OR_INPUT")
    a.add_argument(
        "--out", help="Also write one JSON line per summary to this file ('-' for stdout)."
    )
    a.add_argument(
        "--json", action="store_true", help="Print the aggregate as JSON instead of a table."
    )
    from pipeline.build.config import RowConfig
    from pipeline.common.options import add_options

    add_options(a, RowConfig, only=("keep_damaged",))  # by default it skips them, as a build
    a.set_defaults(func=run_audit)

    from pipeline.cli.build_sft import register_build_sft

    register_build_sft(sub)


def _add_input_arguments(p, metavar: str = "INPUT") -> None:
    p.add_argument(
        "inputs",
        nargs="+",
        metavar=metavar,
        help="Rollout files, directories (searched recursively) or globs: canonical rollouts or raw formats.",
    )
    from pipeline.common.options import add_options
    from pipeline.sources.input_config import InputConfig
    from pipeline.sources.limits import QUARANTINE_CAP_FIELDS

    # No --rewards (nothing is joined) and no quarantine caps (--quarantine FILE is whole).
    add_options(p, InputConfig, skip=("rewards", *QUARANTINE_CAP_FIELDS))
    p.add_argument(
        "--quarantine",
        metavar="FILE",
        help="Write the input records that are left out (unreadable, invalid, duplicate ids; "
        "for audit also damaged logs) to FILE, one JSON line each with file, line, format and "
        "reason, as a build's quarantine.jsonl (default: only counted on stderr).",
    )
