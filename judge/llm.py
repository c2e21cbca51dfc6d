"""The LLM judge: AutoCompact's three questions asked of a model behind any
OpenAI-compatible chat-completions endpoint, one request per candidate step.

Candidates (``candidates``): every summary call (was compacting *now* right —
``trigger``; does the summary keep the working state — ``state``), the first
``POST_COMPACTION_CALLS`` action calls after each compaction (``continuation``), and
with ``every_call`` each other action call (should the agent have compacted here —
``trigger``).

The prompt shows the judge only what the policy saw when it made the step — the live
context of the call, then the step itself — never later events, the reward or whether
the task was resolved: a judge that knows the outcome grades hindsight, not decisions.
The answer is one JSON object validated with pydantic (``JudgeAnswer``); an answer
that is not valid JSON, names a type the candidate was not asked about, or uses a
verdict that does not belong to its type is a failure, counted and reported, never
a finding.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from judge.attach import executed_output_text
from judge.chat_client import ChatClient, ChatError
from judge.history import POST_COMPACTION_CALLS, compactions
from pipeline.segment import CallView, replay
from schemas.correction import CorrectionType, Evidence, Finding, OmittedItem, Verdict
from schemas.rollout import MessageEvent, Rollout

VERDICTS_BY_TYPE: dict[str, tuple[str, ...]] = {
    "trigger": ("ok", "too_early", "too_late", "missing_trigger"),
    "state": ("ok", "omission", "invented", "missing_next_step", "contradiction", "wrong_state"),
    "continuation": ("ok", "redo", "ignored_next_step", "drift"),
}

SYSTEM_PROMPT = """You review one step of a coding agent that compacts its own context.
You see the conversation exactly as the agent saw it when it made the step, then the step.
Answer only the questions asked, each with one verdict:
- trigger (timing of compaction): ok | too_early (evidence the next step needs is still unread or unverified, or a sub-task is half done) | too_late (the context was already failing the agent: repeated searches, re-reading established facts) | missing_trigger (the agent should compact now but does not).
- state (the working-state summary): ok | omission (drops a file path, failing command, error message, test name, constraint or decision present before) | invented (names a path, function or result never seen) | missing_next_step (no concrete next step) | contradiction (next step contradicts the recorded state) | wrong_state (records an edit that was not made, or a test as passing that only was added or still fails).
- continuation (first steps after compaction): ok | redo (repeats work the summary records as done) | ignored_next_step (does not follow the summary's next step) | drift (works on something off the task).
Quote evidence with the message ids shown in brackets. When a verdict is not ok, propose the step the agent should have taken instead.
Reply with one JSON object and nothing else:
{"verdicts": [{"type": "...", "verdict": "...", "rationale": "...", "evidence": [{"message_id": "...", "quote": "..."}], "omitted": [{"kind": "file_path|error_message|failing_command|test_name|constraint|next_step", "value": "..."}], "proposal": "... or null"}]}"""
PROMPT_VERSION = hashlib.sha256(SYSTEM_PROMPT.encode()).hexdigest()[:12]


class JudgedVerdict(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: CorrectionType
    verdict: Literal["ok"] | Verdict
    rationale: str = ""
    evidence: list[Evidence] = Field(default_factory=list)
    omitted: list[OmittedItem] = Field(default_factory=list)
    proposal: str | None = None


class JudgeAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore")
    verdicts: list[JudgedVerdict]


@dataclass(frozen=True)
class Candidate:
    view: CallView
    types: tuple[str, ...]


def candidates(rollout: Rollout, every_call: bool = False) -> list[Candidate]:
    views = replay(rollout)
    first_after = {
        v.index for c in compactions(rollout, views) for v in c.after[:POST_COMPACTION_CALLS]
    }
    found = []
    for view in views:
        if view.message.call_kind == "summary":
            found.append(Candidate(view, ("trigger", "state")))
        elif view.index in first_after:
            found.append(Candidate(view, ("continuation",)))
        elif every_call:
            found.append(Candidate(view, ("trigger",)))
    return found


def render_message(msg: MessageEvent) -> str:
    body = executed_output_text(msg) if msg.role == "assistant" else msg.content
    label = msg.role if msg.role != "tool" else f"tool result ({msg.name or msg.tool_call_id})"
    kind = " [summary]" if msg.role == "assistant" and msg.call_kind == "summary" else ""
    return f"[{msg.id}] {label}{kind}:\n{body}"


def build_messages(rollout: Rollout, cand: Candidate, max_context_chars: int) -> list[dict]:
    """The judge's prompt: the call's live context (head and most recent tail when it is
    longer than ``max_context_chars``), then the step and the questions."""
    shown = [render_message(m) for m in cand.view.context]
    kept_head, kept_tail, budget = shown[:2], [], max_context_chars - sum(map(len, shown[:2]))
    for text in reversed(shown[2:]):
        if len(text) > budget:
            break
        kept_tail.insert(0, text)
        budget -= len(text)
    dropped = len(shown) - len(kept_head) - len(kept_tail)
    gap = [f"... ({dropped} earlier messages not shown) ..."] if dropped else []
    tools = (
        ", ".join(t.get("function", t).get("name", "?") for t in rollout.tools) or "(not recorded)"
    )
    user = "\n\n".join(
        [
            f"Tools available to the agent: {tools}",
            "=== CONVERSATION ===",
            *kept_head,
            *gap,
            *kept_tail,
            "=== STEP UNDER REVIEW ===",
            render_message(cand.view.message),
            f"Questions: {', '.join(cand.types)}.",
        ]
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_answer(text: str, asked: tuple[str, ...]) -> JudgeAnswer:
    """Validate an answer; raises ValueError with a one-line reason. Models wrap JSON in
    a Markdown fence or a sentence despite being told not to: the text from the first
    ``{`` to the last ``}`` is what gets validated."""
    start, end = text.find("{"), text.rfind("}")
    try:
        answer = JudgeAnswer.model_validate_json(
            text[start : end + 1] if 0 <= start < end else text
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(
            f"{'.'.join(map(str, first['loc'])) or 'answer'}: {first['msg']}"
        ) from None
    for v in answer.verdicts:
        if v.type not in asked:
            raise ValueError(
                f"verdict for type {v.type!r}, which was not asked (asked: {', '.join(asked)})"
            )
        if v.verdict not in VERDICTS_BY_TYPE[v.type]:
            raise ValueError(f"verdict {v.verdict!r} does not belong to type {v.type!r}")
    return answer


@dataclass(frozen=True)
class Failure:
    rollout_id: str
    call_index: int
    reason: str


def judge_rollouts(
    rollouts: list[Rollout],
    client: ChatClient,
    concurrency: int = 4,
    every_call: bool = False,
    max_context_chars: int = 60_000,
) -> tuple[list[Finding], list[Failure]]:
    """Findings (verdicts other than ok) and failures, in rollout and call order. At most
    ``concurrency`` requests are in flight."""
    jobs = [(r, c) for r in rollouts for c in candidates(r, every_call)]

    def run(job):
        rollout, cand = job
        try:
            answer, key = client.complete(
                build_messages(rollout, cand, max_context_chars),
                lambda text: parse_answer(text, cand.types),
            )
        except ChatError as exc:
            return [], Failure(rollout.rollout_id, cand.view.index, str(exc))
        return [
            Finding(
                rollout_id=rollout.rollout_id,
                call_index=cand.view.index,
                type=v.type,
                verdict=v.verdict,
                rationale=v.rationale,
                evidence=v.evidence,
                omitted=v.omitted,
                proposal=v.proposal,
                judge_model=client.config.model,
                prompt_hash=key,
            )
            for v in answer.verdicts
            if v.verdict != "ok"
        ], None

    findings, failures = [], []
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for found, failure in pool.map(run, jobs):
            findings += found
            if failure:
                failures.append(failure)
    return findings, failures
