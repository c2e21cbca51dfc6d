"""The design texts the code cites are in docs/, and every cited section exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ["pipeline", "schemas", "judge", "trainer"]


def test_every_cited_design_section_exists():
    cited = []
    for package in CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            cited += [
                (path, doc, None) for doc in re.findall(r"docs/((?:design|summaries)\.md)", text)
            ]
            cited += [
                (path, doc, section)
                for doc, section in re.findall(r"docs/(\w+\.md)(?:, | \()\"([^\"\n]+)\"", text)
            ]
    assert any(section for _, _, section in cited)
    for path, doc, section in cited:
        target = ROOT / "docs" / doc
        assert target.exists(), f"{path} cites docs/{doc}, which does not exist"
        if section:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            # A heading may add the command it documents: 'Calibration (`seam judge --eval`)'.
            assert any(h == section or h.startswith(f"{section} (") for h in headings), (
                f"{path} cites docs/{doc}, section {section!r}"
            )


def test_the_design_texts_are_cited_where_they_now_live():
    for package in CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            assert not re.search(r"(?<!docs/)\b(DESIGN|SUMMARIES)\.md", path.read_text()), path
