"""The rebuilt context of each call equals what the raw file says the model received,
wherever the raw file records it: logged prompt token ids (token dumps, ATIF metrics,
gateway logs, OpenHands V1) for every reader fixture and real file, and the request
messages of chat-completions logs (a hypothesis property over generated logs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.segment import Segmenter
from pipeline.readers import REGISTRY, Accepted
from pipeline.readers.detect import detect_format
from schemas.replay import replay
from tests.readers.util import FIXTURES


def _files() -> list[Path]:
    roots = [FIXTURES]
    real = os.environ.get("SEAM_REALWORLD_DIR")
    if real and Path(real).is_dir():
        roots.append(Path(real))
    return sorted(
        p
        for root in roots
        for p in root.rglob("*")
        if p.is_file() and p.suffix in (".json", ".jsonl", ".traj") and p.name != "result.json"
    )


def _rollouts(path: Path):
    try:
        fmt = detect_format(path)
    except ValueError:
        return []
    return [i.rollout for i in REGISTRY[fmt].read(path) if isinstance(i, Accepted)]


@pytest.mark.parametrize("path", _files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_logged_prompt_is_the_rebuilt_input_of_its_call(path, renderer):
    """A call whose engine logged its input: the segment holds exactly those ids before
    the call's output (a segment where a re-tokenization drift was realigned keeps the
    sampled ids instead, so it is compared by length only)."""
    segmenter = Segmenter(renderer)
    for rollout in _rollouts(path):
        calls = rollout.calls()
        for seg in segmenter.segments(rollout):
            for span in seg.spans:
                logged = calls[span.call_index].prompt_ids
                if logged is None:
                    continue
                if seg.drift_realigned:
                    assert span.start == len(logged), (rollout.rollout_id, span.call_index)
                else:
                    assert seg.tokens[: span.start].tolist() == list(logged), (
                        rollout.rollout_id,
                        span.call_index,
                    )


# -- chat-completions logs: each record is one call with the messages it was sent -------

TEXT = st.text(alphabet="abcdefgh .", min_size=1, max_size=12).map(str.strip).filter(bool)


@st.composite
def gateway_sessions(draw):
    """One session's log: every request is the previous request + its answer + a new
    user turn (append-only), or — a rewrite — the system message and a summary turn
    followed by a suffix of the history."""
    history = [{"role": "system", "content": draw(TEXT)}, {"role": "user", "content": draw(TEXT)}]
    records = []
    for _ in range(draw(st.integers(1, 6))):
        answer = {"role": "assistant", "content": draw(TEXT)}
        records.append(
            {"session_id": "s", "request": {"messages": list(history)}, "answer": answer}
        )
        history = [*history, answer, {"role": "user", "content": draw(TEXT)}]
        if draw(st.booleans()) and len(history) > 3:
            keep = draw(st.integers(1, len(history) - 2))
            summary = {"role": "user", "content": "Summary: " + draw(TEXT)}
            history = [history[0], summary, *history[-keep:]]
    return records


def _log_line(record: dict, n: int) -> str:
    return json.dumps(
        {
            "session_id": record["session_id"],
            "request": {"model": "m", "messages": record["request"]["messages"]},
            "response": {
                "id": f"cmpl-{n}",
                "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": record["answer"]}],
            },
        }
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=gateway_sessions())
def test_chat_completions_contexts_are_the_logged_requests(records, tmp_path):
    path = tmp_path / "gateway.jsonl"
    path.write_text("\n".join(_log_line(r, n) for n, r in enumerate(records)) + "\n")
    (rollout,) = _rollouts(path)
    views = replay(rollout)
    assert len(views) == len(records)
    for view, record in zip(views, records):
        got = [(m.role, m.content) for m in view.context]
        assert got == [(m["role"], m["content"]) for m in record["request"]["messages"]]
        assert view.message.content == record["answer"]["content"]
