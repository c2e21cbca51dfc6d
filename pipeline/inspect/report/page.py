"""The report's HTML: one file, no scripts, no fonts or images fetched from anywhere.

Plots are PNGs inlined as ``data:`` URIs and the styles are inline, so the file opens
the same offline, attached to an email, or from a CI artifact.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 70rem; padding: 0 1rem; color: #222; }
@media (max-width: 40rem) { body { margin: 1rem auto; padding: 0 0.5rem; } }
h1 { font-size: 1.5rem; } h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.85rem; }
pre { background: #f6f6f6; padding: 0.6rem; overflow-x: auto; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(30rem, 100%), 1fr)); gap: 1.5rem; }
.scroll { overflow-x: auto; max-width: 100%; }
h1, figcaption, td { overflow-wrap: anywhere; }
figure { margin: 0; } figure img { width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85rem; color: #555; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.empty { color: #777; font-style: italic; }
"""


@dataclass(frozen=True)
class Plot:
    key: str
    title: str
    caption: str
    png: bytes | None  # None: nothing to plot in this build


@dataclass(frozen=True)
class ResultTable:
    title: str
    columns: list[str]
    rows: list[tuple]


def render_page(
    title: str,
    facts: list[tuple[str, str]],
    plots: list[Plot],
    tables: list[ResultTable],
    notes: list[str],
) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        _table(["what", "value"], facts),
        *(f'<p class="empty">{escape(note)}</p>' for note in notes),
        "<h2>Plots</h2>",
        '<div class="grid">',
        *(_plot(p) for p in plots),
        "</div>",
        "<h2>Tables</h2>",
    ]
    for t in tables:
        parts.append(f"<h3>{escape(t.title)}</h3>")
        parts.append(_table(t.columns, t.rows) if t.rows else '<p class="empty">none</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _plot(plot: Plot) -> str:
    if plot.png is None:
        body = '<p class="empty">Nothing to plot: this build has no data for it.</p>'
    else:
        data = base64.b64encode(plot.png).decode("ascii")
        body = f'<img id="plot-{plot.key}" alt="{escape(plot.title)}" src="data:image/png;base64,{data}">'
    return f"<figure><h3>{escape(plot.title)}</h3>{body}<figcaption>{escape(plot.caption)}</figcaption></figure>"


def _table(columns: list[str], rows: list[tuple]) -> str:
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    # Wide tables scroll inside their box instead of widening the page on a phone.
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _cell(value) -> str:
    if value is None:
        return '<td class="empty">null</td>'
    if isinstance(value, bool):
        return f"<td>{value}</td>"
    if isinstance(value, float):
        return f'<td class="num">{value:.4g}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value:,}</td>'
    return f"<td>{escape(str(value))}</td>"
