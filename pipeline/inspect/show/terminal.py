"""``seam show`` in a terminal (rich): one rollout as the model saw it, segment by segment.

Every mark is text as well as colour, so the rendering reads the same without colour
(``NO_COLOR``, a pipe, the golden tests): a call's output sits between ``┌─ call N`` and
``└─ call N`` lines that say whether it is trained; an untrained token inside a trained
output (a template-added end-of-turn token) is shown as ``[not trained: …]``; each
segment opens with a banner naming its seam, and a seam's rewrite says which messages
it kept, dropped and added.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from pipeline.inspect.show.model import CallNote, RolloutView, Run, SegmentView

STYLE = {
    "context": "dim",
    "special": "cyan",
    "trained": "bold green",
    "untrained": "yellow",
    "seam": "bold magenta",
    "call": "bold blue",
    "warn": "red",
}
LISTED = 12  # messages named per kept / dropped / added list (first and last halves)


def header(view: RolloutView) -> str:
    seams = len(view.seams)
    reward = "?" if view.reward is None else f"{view.reward:g}"
    return (
        f"rollout {view.rollout_id} · task {view.task_id} · source {view.source} · reward {reward} · "
        f"{len(view.segments)} segment(s) · {seams} seam(s) · from {view.origin}"
    )


def segment_banner(seg: SegmentView) -> str:
    seam = "start" if seg.seam_kind == "none" else f"SEAM {seg.seam_kind}"
    if seg.seam_trigger:
        seam += f" (trigger {seg.seam_trigger})"
    parts = [
        f"segment {seg.index}",
        seam,
        f"{len(seg.spans)} call(s)",
        f"{sum(len(r.ids) for r in seg.runs)} tokens",
        f"n_s {seg.num_trainable_tokens}",
        f"N_>s {seg.trainable_tokens_after}",
        f"advantage {seg.advantage:+.4f}",
    ]
    if seg.context_fidelity is not None:
        parts.append("context_fidelity " + ",".join(seg.context_fidelity))
    if seg.drift_realigned:
        parts.append(f"drift realigned ×{seg.drift_realigned}")
    if seg.truncated:
        parts.append("TRUNCATED call")
    return " · ".join(parts)


def rewrite_lines(seg: SegmentView, names: dict[str, str]) -> list[str]:
    if seg.rewrite is None:
        return []
    rw = seg.rewrite
    trigger = f", trigger {rw.trigger}" if rw.trigger else ""
    lines = [f"rewrite: {rw.reason}{trigger}"]
    for what, ids in (("kept", rw.kept), ("dropped", rw.dropped), ("added", rw.added)):
        lines.append(f"  {what} {len(ids)} message(s)")
        shown = ids if len(ids) <= LISTED else ids[: LISTED // 2] + ids[-LISTED // 2 :]
        for n, i in enumerate(shown):
            if len(ids) > LISTED and n == LISTED // 2:
                lines.append(f"    … {len(ids) - LISTED} more")
            lines.append(f"    {i}  {names.get(i, '')}".rstrip())
    return lines


def call_open(note: CallNote | None, span: dict) -> str:
    state = "trained" if span["trained"] else "NOT trained"
    trunc = " · truncated (finish_reason=length)" if span["truncated"] else ""
    return (
        f"┌─ call {span['call_index']} · {span['kind']} · {state} · {span['length']} tokens{trunc}"
    )


def note_lines(note: CallNote | None) -> list[str]:
    if note is None:
        return []
    lines = [f"  {note.drift}"] if note.drift else []
    for c in note.corrections:
        lines.append(
            f"  correction ({c['type']}, {c['verdict']}): {c.get('rationale') or ''}".rstrip()
        )
        lines.append(f"    original:    {c['original']!r}")
        lines.append(f"    replacement: {c['replacement']!r}")
    if note.audit:
        a = note.audit
        found = [
            f"omitted {len(a['omitted'])} key item(s)" if a["omitted"] else "",
            "" if a["has_next_step"] else "no next step",
            f"contradictions {a['contradictions']}" if a["contradictions"] else "",
            f"wrong state {a['wrong_state']}" if a["wrong_state"] else "",
            f"invented paths {a['invented_paths']}" if a["invented_paths"] else "",
        ]
        found = [f for f in found if f] or ["no finding"]
        lines.append(f"  summary audit ({a['words']} words): " + "; ".join(found))
        lines += [f"    omitted: {o.get('kind', '')} {o.get('value', o)}" for o in a["omitted"]]
    return lines


def _token_text(run: Run, decode) -> str:
    """Each token as its text and id: a BPE merge across a boundary shows as one token."""
    return "".join(f"{decode([i])!r}⟨{i}⟩ " for i in run.ids)


def segment_text(view: RolloutView, seg: SegmentView, tokens: bool = False) -> Text:
    """One segment as rich Text (styles for colour, marks for reading without it)."""
    out = Text()
    out.append(segment_banner(seg) + "\n", STYLE["seam"] if seg.seam_kind != "none" else "bold")
    for line in rewrite_lines(seg, view.names):
        out.append(line + "\n", STYLE["seam"])
    spans = {s["call_index"]: s for s in seg.spans}
    current: int | None = None
    for run in seg.runs:
        if run.call_index != current:
            if current is not None:
                out.append(f"\n└─ call {current}\n", STYLE["call"])
                for line in note_lines(view.calls.get(current)):
                    out.append(line + "\n", STYLE["warn"])
            if run.call_index is not None:
                out.append(
                    "\n" + call_open(view.calls.get(run.call_index), spans[run.call_index]) + "\n",
                    STYLE["call"],
                )
            current = run.call_index
        body = _token_text(run, view.decode) if tokens else run.text
        if run.call_index is None and run.trained:  # never in a correct build: shout
            out.append(f"[TRAINED CONTEXT: {body}]", STYLE["warn"])
        elif run.call_index is None:
            out.append(body, STYLE["special"] if run.kind == "special" else STYLE["context"])
        elif run.trained:
            out.append(body, STYLE["trained"])
        elif spans[run.call_index]["trained"]:
            out.append(f"[not trained: {body}]", STYLE["untrained"])
        else:
            out.append(body, STYLE["untrained"])
    if current is not None:
        out.append(f"\n└─ call {current}\n", STYLE["call"])
        for line in note_lines(view.calls.get(current)):
            out.append(line + "\n", STYLE["warn"])
    return out


def print_view(
    view: RolloutView,
    console: Console | None = None,
    segment: int | None = None,
    tokens: bool = False,
) -> None:
    console = console or Console(highlight=False)
    console.print(header(view), style="bold", soft_wrap=True)
    if view.note:
        console.print(f"note: {view.note}", style=STYLE["warn"], soft_wrap=True)
    for seg in view.segments:
        if segment is not None and seg.index != segment:
            continue
        console.print()
        console.print(segment_text(view, seg, tokens), soft_wrap=True)
