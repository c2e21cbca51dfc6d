"""``seam show --html``: one self-contained page per rollout (no script, no network).

The same information as the terminal rendering: a collapsible ``<details>`` per segment
with its seam banner, trained outputs marked (``<mark class="trained">``), context dimmed,
special tokens boxed, the context just before and just after each seam side by side,
judge corrections as original vs replacement, and the summary audit's findings placed
right after the summary they are about (anchor ``#call-N``).
"""

from __future__ import annotations

from html import escape

from pipeline.inspect.show.model import RolloutView, SegmentView
from pipeline.inspect.show.terminal import (
    call_open,
    header,
    note_lines,
    rewrite_lines,
    segment_banner,
)

CSS = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;padding:1rem;max-width:70rem;color:#1d1d1f}
h1{font-size:1.2rem;overflow-wrap:anywhere}
pre,.tokens{white-space:pre-wrap;overflow-wrap:anywhere;font:13px/1.4 ui-monospace,monospace;margin:0}
details{border:1px solid #ccc;border-radius:6px;margin:.8rem 0;padding:.4rem .6rem}
summary{cursor:pointer;font-weight:600;overflow-wrap:anywhere}
.seam summary{color:#8a1c7c}
.rewrite{color:#8a1c7c;background:#fbf0fa;padding:.4rem;border-radius:4px}
.ctx{color:#777}
.sp{color:#0b6e99;background:#e6f4fa;border-radius:3px}
mark.trained{background:#d9f7d9;color:#0a4d0a}
.untrained{background:#fff4cc}
.call{display:block;color:#1f4fbf;font-weight:600;margin-top:.3rem}
.note{display:block;color:#a3231b;background:#fdeceb;padding:.2rem .4rem;margin:.2rem 0}
.sbs{display:grid;grid-template-columns:repeat(auto-fit,minmax(16rem,1fr));gap:.6rem;margin:.5rem 0}
.sbs pre{max-height:24rem;overflow:auto;border:1px solid #ddd;padding:.4rem;background:#fafafa}
.legend span{margin-right:1rem}
"""

BEFORE_AFTER_CHARS = 6000  # of the context on each side of a seam (its end before, its start after)


def render_html(view: RolloutView, standalone: bool = True, segment: int | None = None) -> str:
    parts = [
        f"<h1>{escape(header(view))}</h1>",
        '<p class="legend"><span><mark class="trained key">trained</mark></span>'
        '<span class="ctx">context (not trained)</span>'
        '<span class="untrained">generated, not trained</span><span class="sp">special token</span></p>',
    ]
    if view.note:
        parts.append(f'<p class="note">note: {escape(view.note)}</p>')
    previous: SegmentView | None = None
    for seg in view.segments:
        if segment is None or seg.index == segment:
            parts.append(_segment(view, seg, previous))
        previous = seg
    body = "\n".join(parts)
    if not standalone:
        return f'<div class="seam-show"><style>{scoped_css(".seam-show")}</style>{body}</div>'
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        f"<title>seam show {escape(view.rollout_id)}</title><style>{CSS}</style></head>"
        f"<body>\n{body}\n</body></html>\n"
    )


def scoped_css(scope: str) -> str:
    """The page's CSS confined to one element: a notebook output must not restyle the
    notebook around it (``body`` becomes the element itself)."""
    rules = []
    for line in CSS.strip().splitlines():  # one rule per line
        selectors, rule = line.split("{", 1)
        scoped = [
            scope if s.strip() == "body" else f"{scope} {s.strip()}" for s in selectors.split(",")
        ]
        rules.append(",".join(scoped) + "{" + rule)
    return "\n".join(rules)


def _segment(view: RolloutView, seg: SegmentView, previous: SegmentView | None) -> str:
    cls = "seam" if seg.seam_kind != "none" else "start"
    out = [
        f'<details class="{cls}" id="segment-{seg.index}" open><summary>{escape(segment_banner(seg))}</summary>'
    ]
    lines = rewrite_lines(seg, view.names)
    if lines:
        out.append(f'<pre class="rewrite">{escape(chr(10).join(lines))}</pre>')
    if seg.seam_kind != "none" and previous is not None:
        before = previous.context_text[-BEFORE_AFTER_CHARS:]
        after = seg.first_context_text[:BEFORE_AFTER_CHARS]
        out.append(
            '<div class="sbs"><div><b>context before the seam</b> (end of segment '
            f"{previous.index}'s last input)<pre>{escape(before)}</pre></div>"
            f"<div><b>context after the seam</b> (start of segment {seg.index}'s first input)"
            f"<pre>{escape(after)}</pre></div></div>"
        )
    out.append('<div class="tokens">')
    spans = {s["call_index"]: s for s in seg.spans}
    current = None
    for run in seg.runs:
        if run.call_index != current:
            if current is not None:
                out.append(_close(view, current))
            if run.call_index is not None:
                span = spans[run.call_index]
                out.append(
                    f'<span class="call" id="call-{run.call_index}">'
                    f"{escape(call_open(view.calls.get(run.call_index), span))}</span>"
                )
            current = run.call_index
        text = escape(run.text)
        if run.trained:  # by the mask, not by the owner: a trained context token shows too
            who = -1 if run.call_index is None else run.call_index
            out.append(f'<mark class="trained" data-call="{who}">{text}</mark>')
        elif run.call_index is None:
            out.append(f'<span class="{"sp" if run.kind == "special" else "ctx"}">{text}</span>')
        else:
            out.append(f'<span class="untrained" title="generated, not trained">{text}</span>')
    if current is not None:
        out.append(_close(view, current))
    out.append("</div></details>")
    return "".join(out)


def _close(view: RolloutView, call_index: int) -> str:
    notes = note_lines(view.calls.get(call_index))
    html = f'<span class="call">└─ call {call_index}</span>'
    if notes:
        html += f'<pre class="note">{escape(chr(10).join(notes))}</pre>'
    return html
