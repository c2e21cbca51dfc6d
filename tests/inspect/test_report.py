"""`seam report`: one self-contained HTML file, rendered by a real headless Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.inspect.report import build_report, write_report

RL_PLOTS = [
    "compactions",
    "summary_length",
    "tokens",
    "segment_length",
    "input_tokens",
    "pass_rate",
    "advantage",
    "seams",
    "quarantine",
]
# The SFT build's rollouts log no provider usage: nothing to plot for input_tokens.
SFT_PLOTS = [*(k for k in RL_PLOTS if k != "input_tokens"), "corrections", "audit"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Appended to a copy of the report (the report itself has no scripts): after the page
# has loaded, write each image's decoded size into the DOM that --dump-dom prints.
PROBE = """<script>
window.addEventListener("load", () => {
  const sizes = [...document.images].map(i => ({id: i.id, complete: i.complete, width: i.naturalWidth,
                                                height: i.naturalHeight}));
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(sizes);
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def rl_report(rl_build, tmp_path_factory) -> Path:
    """The RL build's report, written once by the command a user runs."""
    html = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(rl_build), "--html", str(html)]) == 0
    return html


@pytest.fixture(scope="module")
def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip(
            "Chromium is not installed (Debian: apt-get install -y chromium); the HTML report is not "
            "rendered in a browser in this run"
        )
    return path


def rendered_images(chromium: str, html: Path, tmp_path: Path) -> list[dict]:
    """Load ``html`` in headless Chromium and return every image's decoded size."""
    probe = tmp_path / "probe.html"
    probe.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    result = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probe.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert match, f"Chromium printed no probe (exit {result.returncode}): {result.stderr[-2000:]}"
    return json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_report_renders_in_chromium_with_every_plot_decoded(rl_report, chromium, tmp_path):
    images = rendered_images(chromium, rl_report, tmp_path)
    assert [i["id"] for i in images] == [f"plot-{key}" for key in RL_PLOTS]
    for image in images:
        assert image["complete"] and image["width"] >= 300 and image["height"] >= 150, image


@pytest.mark.slow
def test_sft_report_adds_judge_correction_and_audit_plots(sft_build, chromium, tmp_path):
    html = tmp_path / "report.html"
    write_report(sft_build, html)
    images = rendered_images(chromium, html, tmp_path)
    assert [i["id"] for i in images] == [f"plot-{key}" for key in SFT_PLOTS]
    assert all(i["width"] > 0 for i in images)


def test_report_is_one_file_that_fetches_nothing(rl_report):
    text = rl_report.read_text()
    sources = re.findall(r'src="([^"]*)"', text)
    assert len(sources) == len(RL_PLOTS)
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    for forbidden in ("http://", "https://", "<script", "<link", "url(", "@import", "href="):
        assert forbidden not in text, forbidden


@pytest.mark.slow
def test_report_says_what_it_could_not_plot(rl_build, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(rl_build, copy)
    (copy / "quarantine.jsonl").write_text("")
    html, plots = build_report(copy)
    assert [p.key for p in plots if p.png is None] == ["quarantine"]
    assert "Nothing to plot" in html


def test_report_refuses_a_missing_folder_and_an_existing_file_without_overwrite(
    rl_build, rl_report, tmp_path, capsys
):
    missing = tmp_path / "no" / "such" / "report.html"
    assert main(["report", str(rl_build), "--html", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"seam report: error: --html {missing}: folder {missing.parent} does not exist (create it first)"
    )
    assert not (tmp_path / "no").exists()

    existing = tmp_path / "mine.html"
    existing.write_text("keep me")
    assert main(["report", str(rl_build), "--html", str(existing)]) == 2
    assert "pass --overwrite to replace it" in capsys.readouterr().err
    assert existing.read_text() == "keep me"
    assert main(["report", str(rl_build), "--html", str(existing), "--overwrite"]) == 0
    assert existing.read_text() == rl_report.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.html"]  # no temp file left
