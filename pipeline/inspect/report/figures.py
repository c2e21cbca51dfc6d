"""The report's plots: each reads what it shows from the views and draws one figure.

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas directly (no
pyplot): no GUI backend, no global figure state, so ``seam report`` runs headless and
twice in one process gives the same bytes. A plot function returns ``None`` when the
build has nothing to show (no summaries, an empty quarantine); the page says so instead
of drawing an empty axis.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from pipeline.inspect.standard_queries import AUDIT_RATES

# Scatter plots of very large builds sample this many segments (reproducibly).
SCATTER_SAMPLE = 20_000
TOP_REASONS = 12
DPI = 200  # figures are 6.4 in wide: 1280 px, shown at 640 CSS px
# Common trainer max_length settings, marked on the segment-length plot.
MAX_LENGTH_CUTOFFS = (1024, 2048, 4096, 8192, 16384, 32768)
WILSON_Z = 1.959964  # two-sided 95%


@dataclass(frozen=True)
class FigureSpec:
    key: str
    title: str
    caption: str
    draw: Callable  # (con) -> Figure | None
    needs: tuple[str, ...]


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig)  # attach the Agg canvas: PNG rendering without pyplot or a GUI backend
    # 2× pixels for the figure's CSS size: sharp on high-density screens and when zoomed.
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _figure(width: float = 6.4, height: float = 3.6):
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def _bars(
    labels,
    values,
    xlabel: str,
    ylabel: str,
    horizontal: bool = False,
    annotate=None,
    counts: bool = True,
):
    """Bars of ``values``; horizontal ones for long labels (wrapped to two lines)."""
    labels = [textwrap.shorten(str(label), 90, placeholder="…") for label in labels]
    if horizontal:
        labels = ["\n".join(textwrap.wrap(label, 45)) for label in labels]
    fig, ax = _figure(6.4, max(2.4, 0.5 * len(labels) + 1) if horizontal else 3.6)
    positions = np.arange(len(labels))
    bars = (ax.barh if horizontal else ax.bar)(positions, values, color="#4c72b0")
    (ax.set_yticks if horizontal else ax.set_xticks)(
        positions, labels, fontsize=8 if horizontal else None
    )
    if horizontal:
        ax.invert_yaxis()
    if counts:
        (ax.xaxis if horizontal else ax.yaxis).set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if annotate is not None:
        ax.bar_label(bars, labels=annotate, padding=2, fontsize=8)
    return fig


def compactions_per_rollout(con):
    rows = con.execute(
        "SELECT num_compactions, count(*) FROM rollouts GROUP BY 1 ORDER BY 1"
    ).fetchall()
    if not rows:
        return None
    x, n = zip(*rows)
    return _bars(x, n, "compactions in the rollout", "rollouts")


def summary_lengths(con):
    tokens = con.execute("SELECT tokens FROM calls WHERE kind = 'summary'").fetchnumpy()["tokens"]
    if len(tokens) == 0:
        return None
    fig, ax = _figure()
    ax.hist(tokens, bins=min(40, max(5, len(np.unique(tokens)))), color="#4c72b0")
    ax.axvline(
        np.median(tokens), color="#c44e52", linestyle="--", label=f"median {np.median(tokens):.0f}"
    )
    ax.set_xlabel("summary output tokens")
    ax.set_ylabel("summaries")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    return fig


def trainable_vs_context(con):
    data = con.execute(f"""
        SELECT num_tokens - num_trainable_tokens AS context, num_trainable_tokens AS trainable, seam_kind
        FROM segments USING SAMPLE reservoir({SCATTER_SAMPLE} ROWS) REPEATABLE (0)""").fetchnumpy()
    if len(data["seam_kind"]) == 0:
        return None
    fig, ax = _figure()
    for kind in sorted(set(data["seam_kind"])):
        pick = data["seam_kind"] == kind
        ax.scatter(
            data["context"][pick], data["trainable"][pick], s=8, alpha=0.6, label=f"seam: {kind}"
        )
    ax.set_xlabel("context tokens (loss mask 0)")
    ax.set_ylabel("trainable tokens (loss mask 1)")
    ax.legend(fontsize=8)
    return fig


def wilson_interval(passed: int, n: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927; Brown, Cai & DasGupta
    2001 recommend it for small n): with p̂ = passed/n,
    ``(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)``. Unlike p̂ ± z·SE it stays
    inside [0, 1] and is not empty at p̂ = 0 or 1."""
    p = passed / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def reported_vs_rebuilt(con):
    """Per call with provider usage: input tokens the provider reported against the
    input seam rebuilt (its output's start in the segment). Points far above the
    diagonal are contexts seam does not fully hold (a slice, a missing system prompt
    or tool schemas); the tokenizers differ too, so the diagonal is a guide only."""
    data = con.execute(f"""
        SELECT start AS rebuilt, reported_input_tokens AS reported, source
        FROM calls WHERE reported_input_tokens IS NOT NULL
        USING SAMPLE reservoir({SCATTER_SAMPLE} ROWS) REPEATABLE (0)""").fetchnumpy()
    if len(data["source"]) == 0:
        return None
    fig, ax = _figure()
    for source in sorted(set(data["source"])):
        pick = data["source"] == source
        ax.scatter(data["rebuilt"][pick], data["reported"][pick], s=8, alpha=0.6, label=source)
    top = float(max(data["rebuilt"].max(), data["reported"].max()))
    ax.plot([0, top], [0, top], color="#888888", linewidth=1, label="reported = rebuilt")
    ax.set_xlabel("rebuilt input tokens (seam)")
    ax.set_ylabel("reported input tokens (provider)")
    ax.legend(fontsize=8)
    return fig


def pass_rate_by_compactions(con):
    rows = con.execute(
        "SELECT num_compactions, count(*), sum(passed::INT) FROM rollouts GROUP BY 1 ORDER BY 1"
    ).fetchall()
    if not rows:
        return None
    compactions = [r[0] for r in rows]
    rate = [r[2] / r[1] for r in rows]
    low, high = zip(*(wilson_interval(r[2], r[1]) for r in rows))
    fig = _bars(
        compactions,
        rate,
        "compactions in the rollout",
        "pass rate (95% Wilson interval)",
        counts=False,
        annotate=[f"{p:.0%}\nn={r[1]}" for p, r in zip(rate, rows)],
    )
    ax = fig.axes[0]
    errors = [np.subtract(rate, low), np.subtract(high, rate)]
    ax.errorbar(np.arange(len(rows)), rate, yerr=errors, fmt="none", ecolor="#222", capsize=4)
    ax.set_ylim(0, 1.2)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    return fig


def segment_lengths(con):
    tokens = con.execute("SELECT num_tokens FROM segments").fetchnumpy()["num_tokens"]
    if len(tokens) == 0:
        return None
    fig, ax = _figure()
    top = max(int(tokens.max()), 2)
    bins = np.geomspace(max(1, int(tokens.min())), top + 1, 40)
    ax.hist(tokens, bins=bins, color="#4c72b0")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("segment tokens (num_tokens, log scale)")
    ax.set_ylabel("segments")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for cutoff in MAX_LENGTH_CUTOFFS:
        if cutoff > top * 4:
            break
        over = float(np.mean(tokens > cutoff))
        ax.axvline(cutoff, color="#c44e52", linestyle="--", linewidth=1)
        ax.annotate(
            f"{cutoff // 1024}k: {over:.0%} over",
            (cutoff, 1),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="#c44e52",
        )
    return fig


def advantage_distribution(con):
    advantage = con.execute("SELECT advantage FROM rollouts").fetchnumpy()["advantage"]
    if len(advantage) == 0:
        return None
    fig, ax = _figure()
    ax.hist(advantage, bins=40, color="#4c72b0")
    ax.set_xlabel("GRPO advantage (one value per rollout)")
    ax.set_ylabel("rollouts")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def seams_by_kind(con):
    rows = con.execute("""SELECT seam_kind, source, count(*) FROM segments WHERE seam_kind <> 'none'
                          GROUP BY ALL ORDER BY 1, 2""").fetchall()
    if not rows:
        return None
    kinds = sorted({r[0] for r in rows})
    sources = sorted({r[1] for r in rows})
    counts = {(k, s): n for k, s, n in rows}
    fig, ax = _figure()
    bottom = np.zeros(len(kinds))
    for source in sources:
        values = np.array([counts.get((k, source), 0) for k in kinds])
        ax.bar(kinds, values, bottom=bottom, label=source)
        bottom += values
    ax.set_xlabel("seam kind")
    ax.set_ylabel("segments starting with it")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(title="source", fontsize=8)
    return fig


def quarantine_reasons(con):
    # One real reason names each group (the blanked reason_kind reads "summaries mN and mN
    # are N% identical"); "+k similar" says how many other reasons share its kind.
    rows = con.execute(f"""SELECT record || ': ' || min(reason), count(DISTINCT reason) - 1,
                                  count(*) AS n
                           FROM quarantine GROUP BY record, reason_kind
                           ORDER BY n DESC, 1 LIMIT {TOP_REASONS}""").fetchall()
    if not rows:
        return None
    labels = [label + (f" (+{k} similar)" if k else "") for label, k, _ in rows]
    return _bars(labels, [r[2] for r in rows], "records", "", horizontal=True)


def correction_types(con):
    rows = con.execute("""SELECT type || ' / ' || verdict, count(*) AS n FROM corrections
                          GROUP BY 1 ORDER BY n DESC, 1""").fetchall()
    if not rows:
        return None
    return _bars(
        [r[0] for r in rows], [r[1] for r in rows], "corrections", "type / verdict", horizontal=True
    )


def audit_rates(con):
    cursor = con.execute(AUDIT_RATES.sql)
    row = cursor.fetchone()
    if not row or not row[0]:
        return None
    names = [d[0] for d in cursor.description]
    rates = [
        (name.removesuffix("_rate").replace("_", " "), value)
        for name, value in zip(names, row)
        if name.endswith("_rate")
    ]
    fig = _bars(
        [r[0] for r in rates],
        [r[1] for r in rates],
        "share of summaries",
        "",
        horizontal=True,
        annotate=[f"{r[1]:.1%}" for r in rates],
        counts=False,
    )
    # Rates are a few percent: scale the axis to them, not to 100%.
    ax = fig.axes[0]
    ax.set_xlim(0, max(0.01, max(r[1] for r in rates) * 1.3))
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    return fig


FIGURES = [
    FigureSpec(
        "compactions",
        "Compactions per rollout",
        "How often rollouts compacted their context.",
        compactions_per_rollout,
        ("rollouts",),
    ),
    FigureSpec(
        "summary_length",
        "Summary length",
        "Output tokens of every summary call (end-of-turn token included).",
        summary_lengths,
        ("calls",),
    ),
    FigureSpec(
        "tokens",
        "Trainable vs context tokens per segment",
        f"One point per segment (at most {SCATTER_SAMPLE:,}, sampled): tokens the policy generated in it "
        "(trained) against the context it saw.",
        trainable_vs_context,
        ("segments",),
    ),
    FigureSpec(
        "segment_length",
        "Segment length",
        "Tokens per segment (a shard row), with the common trainer max_length cutoffs "
        f"({', '.join(f'{c:,}' for c in MAX_LENGTH_CUTOFFS)}) and the share of segments longer "
        "than each: a trainer truncates or drops those.",
        segment_lengths,
        ("segments",),
    ),
    FigureSpec(
        "input_tokens",
        "Input tokens per call: reported vs rebuilt",
        "One point per call whose log records the provider's usage (cache tokens included): "
        "what the provider counted against what seam rebuilt. Far above the diagonal: context "
        "the log does not hold (see context_fidelity).",
        reported_vs_rebuilt,
        ("calls",),
    ),
    FigureSpec(
        "pass_rate",
        "Pass rate by number of compactions",
        "Share of rollouts that passed (resolved, else reward > 0), by how often they compacted; "
        "n = rollouts; whiskers: 95% Wilson score interval.",
        pass_rate_by_compactions,
        ("rollouts",),
    ),
    FigureSpec(
        "advantage",
        "Advantage distribution",
        "GRPO shared outcome advantage, counted once per rollout (not per segment).",
        advantage_distribution,
        ("rollouts",),
    ),
    FigureSpec(
        "seams",
        "Seams by kind",
        "Segments that start at a seam, by seam kind, stacked by source.",
        seams_by_kind,
        ("segments",),
    ),
    FigureSpec(
        "quarantine",
        "Quarantine reasons",
        f"Rejected records by reason (top {TOP_REASONS}).",
        quarantine_reasons,
        ("quarantine",),
    ),
    FigureSpec(
        "corrections",
        "Judge correction types",
        "Attached judge corrections by type and verdict.",
        correction_types,
        ("corrections",),
    ),
    FigureSpec(
        "audit",
        "Summary audit rates",
        "AutoCompact's measures over audited summaries: key-state omission, next-step omission, "
        "self-consistency violations, invented paths.",
        audit_rates,
        ("audit",),
    ),
]
