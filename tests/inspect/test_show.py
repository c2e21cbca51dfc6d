"""`seam show`: hand-checked rollouts in the terminal (no colour) and as one HTML page."""

from __future__ import annotations

import io
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.cli import main
from pipeline.inspect.show.html import render_html
from pipeline.inspect.show.load import load_view
from pipeline.inspect.show.terminal import print_view
from schemas.correction import executed_output_text
from tests.inspect import browser

GOLDEN = Path(__file__).parent / "golden"


def plain(view, **kwargs) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, color_system=None, highlight=False)
    print_view(view, console, **kwargs)
    return buffer.getvalue()


def test_terminal_golden_two_compactions(rl_build):
    """a2 (hand-checked): 5 calls, 3 segments, a model- then a budget-triggered compaction."""
    view = load_view(rl_build, "a2")
    view.origin = "BUILD"
    text = plain(view)
    assert text == (GOLDEN / "show_a2.txt").read_text()


def test_terminal_marks_exactly_the_trained_outputs_and_every_seam(rl_build):
    view = load_view(rl_build, "a2")
    text = plain(view)
    trained = re.findall(
        r"┌─ call (\d+) · \w+ · trained · \d+ tokens\n(.*?)\n└─ call \1", text, re.S
    )
    assert [int(i) for i, _ in trained] == [0, 1, 2, 3, 4]
    rollout = _rollout(rl_build, "a2")
    for index, body in trained:
        assert body == executed_output_text(rollout.calls()[int(index)]) + "<|im_end|>"
    assert re.findall(r"SEAM (\w+) \(trigger (\w+)\)", text) == [
        ("compaction", "model"),
        ("compaction", "budget"),
    ]


def test_tokens_show_ids_and_boundaries(rl_build):
    text = plain(load_view(rl_build, "a0"), tokens=True, segment=0)
    assert "'<|im_start|>'⟨151644⟩" in text and "'<|im_end|>'⟨151645⟩" in text


def test_show_reads_raw_inputs_and_selects_with_sql(rl_build, tmp_path, capsys):
    source = rl_build.parent / "in.jsonl"
    raw = load_view(source, "a2")
    built = load_view(rl_build, "a2")
    assert [[r.text for r in s.runs] for s in raw.segments] == [
        [r.text for r in s.runs] for s in built.segments
    ]
    assert main(["show", str(rl_build), "--where", "num_compactions = 2 AND passed"]) == 0
    assert "rollout b0 " in capsys.readouterr().out
    assert main(["show", str(source), "--where", "true"]) == 2


class _Text(HTMLParser):
    """Text of every <mark class="trained"> and every seam <details>."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.trained: dict[int, str] = {}  # call index → its trained text
        self.seams = 0

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class", "")
        self.stack.append(f"{tag}.{cls}")
        if tag == "mark" and cls == "trained":
            self.call = int(dict(attrs)["data-call"])
            self.trained.setdefault(self.call, "")
        if tag == "details" and cls == "seam":
            self.seams += 1

    def handle_endtag(self, tag):
        self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "mark.trained":
            self.trained[self.call] += data


def test_html_page_shows_trained_spans_and_seams_and_works_offline(rl_build, tmp_path):
    page = tmp_path / "a2.html"
    assert main(["show", str(rl_build), "a2", "--html", str(page)]) == 0
    text = page.read_text()
    for forbidden in ("http://", "https://", "<script", "<link", "src=", "url(", "@import"):
        assert forbidden not in text, forbidden
    parsed = _Text()
    parsed.feed(text)
    rollout = _rollout(rl_build, "a2")
    outputs = [executed_output_text(c) for c in rollout.calls()]
    # Each output is trained with its end-of-turn token; nothing else is marked trained.
    assert parsed.trained == {i: o + "<|im_end|>" for i, o in enumerate(outputs)}
    assert parsed.seams == 2
    assert text.count("context before the seam") == 2
    assert "summary audit (14 words): omitted 2 key item(s)" in text
    dom, console = browser.load(page.as_uri(), tmp_path)
    assert console == [] and 'id="segment-2"' in dom


def test_html_shows_corrections_as_original_and_replacement(sft_build, tmp_path):
    page = tmp_path / "good.html"
    assert main(["show", str(sft_build), "good", "--html", str(page)]) == 0
    text = page.read_text()
    assert "correction (state, omission): dropped the test" in text
    assert "original:    &#x27;# Auto Context Summary\\nWorking on dates.&#x27;" in text


def _rollout(build, rollout_id):
    import json

    from pipeline.inspect.verify import rollouts_from_inputs

    manifest = json.loads((build / "manifest.json").read_text())
    return rollouts_from_inputs(build, manifest, {rollout_id})[rollout_id][0]


def test_notebook_display_is_scoped_to_its_own_element(rl_build):
    html = load_view(rl_build, "a1")._repr_html_()
    assert html.startswith('<div class="seam-show"><style>')
    style = html.split("<style>", 1)[1].split("</style>", 1)[0]
    for rule in style.splitlines():
        assert all(s.startswith(".seam-show") for s in rule.split("{")[0].split(",")), rule
    assert "<mark" in html and "<html" not in html


REALWORLD = os.environ.get("SEAM_REALWORLD_DIR")


@pytest.mark.slow
@pytest.mark.skipif(not REALWORLD, reason="SEAM_REALWORLD_DIR is not set")
@pytest.mark.parametrize(
    ("path", "compactions", "fidelity"),
    [
        ("claude_code/real-entireio-cli_cd-95adddad32_0_full.jsonl", 3, "missing_system_prompt"),
        ("codex/agentv_rollout-00-34f597b72d-1.jsonl", 2, "opaque_summary"),
    ],
)
def test_real_sessions_show_every_compaction_and_every_trained_output(
    path, compactions, fidelity, tmp_path
):
    view = load_view(Path(REALWORLD) / path)
    page = tmp_path / "page.html"
    page.write_text(render_html(view))
    dom, console = browser.load(page.as_uri(), tmp_path)
    assert console == [] and dom.count('<details class="seam"') == compactions
    text = plain(view)
    assert len(re.findall(r"^segment \d+ · SEAM compaction", text, re.M)) == compactions
    assert len(re.findall(r"^rewrite: compaction", text, re.M)) == compactions
    assert f"context_fidelity {fidelity}" in text or f",{fidelity}" in text
    spans = [s for seg in view.segments for s in seg.spans]
    opened = re.findall(r"^┌─ call (\d+) · \w+ · (trained|NOT trained)", text, re.M)
    assert [int(i) for i, _ in opened] == [s["call_index"] for s in spans]
    assert all(state == "trained" for _, state in opened)


def test_realigned_drift_is_named_on_the_call_it_happened_to(renderer):
    from pipeline.inspect.show.load import view_of_rollout
    from tests.sample_builds import one_compaction
    from tests.strategies import log_token_ids

    rollout = log_token_ids(one_compaction("drift").build(reward=1.0), renderer, "noncanonical", 3)
    view = view_of_rollout(rollout)
    assert sum(s.drift_realigned for s in view.segments) == 2
    text = plain(view)
    named = re.findall(r"└─ call (\d+)\n  drift realigned: sampled as (\d+) ids", text)
    assert [int(i) for i, _ in named] == [0, 2]  # the first call of each of the 2 segments
    assert "drift realigned ×1" in text
