"""The report reads well: sharp plots, a page that fits a phone, axes scaled to the data,
real quarantine reasons, confidence intervals, and the segment-length cutoffs."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from pipeline.inspect.duckdb_views import connect
from pipeline.inspect.report import write_report
from pipeline.inspect.report.figures import (
    MAX_LENGTH_CUTOFFS,
    audit_rates,
    quarantine_reasons,
    segment_lengths,
    wilson_interval,
)
from tests.inspect import browser

PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({
    page: document.documentElement.scrollWidth,
    viewport: window.innerWidth,
    images: [...document.images].map(i => [i.id, i.naturalWidth, i.clientWidth])});
  document.body.appendChild(out);
});
</script>"""


def test_wilson_interval_hand_checked():
    # Brown, Cai & DasGupta (2001) / any Wilson calculator: 5 of 10 → [0.2366, 0.7634].
    low, high = wilson_interval(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    low, high = wilson_interval(0, 27)  # all failed, n = 27: not the empty interval [0, 0]
    assert low == 0.0 and round(high, 4) == 0.1246


@pytest.mark.slow
def test_page_fits_a_420px_viewport_with_2x_plots(rl_build, tmp_path):
    html = tmp_path / "report.html"
    write_report(rl_build, html)
    probe = tmp_path / "probe.html"
    probe.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    result = subprocess.run(
        [
            browser.chromium_path(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=420,900",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probe.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert found, result.stderr[-2000:]
    measured = json.loads(found.group(1).replace("&quot;", '"'))
    # Headless Chromium does not go below a 500 px window: the narrowest it lays out.
    assert measured["viewport"] <= 500 and measured["page"] <= measured["viewport"], measured
    for key, natural, shown in measured["images"]:
        assert natural >= 2 * shown > 0, (key, natural, shown)


def test_audit_axis_is_scaled_to_the_rates(sft_build):
    fig = audit_rates(connect(sft_build))
    ax = fig.axes[0]
    widest = max(p.get_width() for p in ax.patches)
    assert ax.get_xlim()[1] == pytest.approx(max(0.01, widest * 1.3))


def test_quarantine_labels_are_real_reasons(rl_build):
    fig = quarantine_reasons(connect(rl_build))
    labels = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_yticklabels()]
    assert labels and all("…" not in label[:20] for label in labels)
    assert any("invalid JSON" in label for label in labels), labels
    assert not any(re.search(r"\bN\b", label) for label in labels), labels


def test_segment_length_plot_marks_the_cutoffs(rl_build):
    fig = segment_lengths(connect(rl_build))
    ax = fig.axes[0]
    marked = sorted(int(line.get_xdata()[0]) for line in ax.get_lines())
    assert marked == [c for c in MAX_LENGTH_CUTOFFS if c <= 4 * 401]
    texts = [t.get_text() for t in ax.texts]
    assert "1k: 0% over" in texts
