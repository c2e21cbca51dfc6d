"""Where a raw file records what the model received, the rebuilt context of each call is
exactly that: gateway logs (each request's ``messages``), Harbor trace exports (each
row's conversation minus its reply) and SWE-agent steps with a ``query``. Every fixture
of those formats, and the public samples in ``$SEAM_REALWORLD_DIR`` when present."""

import json
import os
from pathlib import Path

import pytest

from pipeline.readers.common import content_text, iter_json_records
from schemas.replay import replay
from tests.readers.util import FIXTURES, read

ROOT = Path(os.environ["SEAM_REALWORLD_DIR"]) if os.environ.get("SEAM_REALWORLD_DIR") else None
FOLDERS = {
    "chat_completions": "chat-completions",
    "harbor_traces": "harbor-traces",
    "swe_agent": "swe-agent",
}


def _files() -> list[Path]:
    roots = [FIXTURES] + ([ROOT] if ROOT is not None and ROOT.is_dir() else [])
    return sorted(p for r in roots for folder in FOLDERS for p in (r / folder).glob("*.*"))


def _text(messages: list) -> list[tuple[str, str]]:
    roles = {"developer": "system", "function": "tool"}
    return [
        (roles.get(m["role"], m["role"]), content_text(m.get("content")))
        for m in messages
        if isinstance(m, dict)
    ]


def _recorded(fmt: str, path: Path) -> dict[str, list[list[tuple[str, str]]]]:
    """Per rollout id (as the reader names it), the inputs the file records, in call order
    (None where a call's input is not recorded)."""
    if fmt == "chat-completions":
        out: dict = {}
        for _, rec, _, _ in iter_json_records(path):
            request = rec.get("request") or rec.get("body") or rec
            out.setdefault(rec["session_id"], []).append(_text(request["messages"]))
        return out
    doc = json.loads(path.read_text())
    if fmt == "harbor-traces":
        out = {}
        for row in sorted(doc, key=lambda r: int(r["episode"].split("-")[-1])):
            key = row["trial_name"]
            if row.get("trace_source", "main") != "main":
                key += "/" + row["trace_source"]
            out.setdefault(key, []).append(_text(row["conversations"][:-1]))
        return out
    calls = [m for m in doc["history"] if m.get("role") == "assistant" and not m.get("is_demo")]
    demos = [m for m in doc["history"] if m.get("role") == "assistant" and m.get("is_demo")]
    steps = doc["trajectory"][: max(len(calls), len(doc["trajectory"]))]
    queries = [_text(s["query"]) if s.get("query") else None for s in steps]
    return {"*": [None] * len(demos) + queries}


@pytest.mark.parametrize("path", _files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_call_context_is_the_input_the_file_records(path):
    fmt = FOLDERS[path.parent.name]
    rollouts, rejected, _ = read(fmt, path)
    assert not rejected
    recorded = _recorded(fmt, path)
    checked = 0
    for rollout in rollouts:
        inputs = recorded["*"] if "*" in recorded else recorded[rollout.rollout_id]
        views = replay(rollout)
        assert len(views) == len(inputs)
        for view, sent in zip(views, inputs):
            if sent is None:
                continue
            rebuilt = [(m.role, m.content) for m in view.context]
            assert rebuilt == sent, (rollout.rollout_id, view.index)
            checked += 1
    assert checked == sum(x is not None for v in recorded.values() for x in v)
