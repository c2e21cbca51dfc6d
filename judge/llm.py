"""The LLM judge: AutoCompact's three questions asked of a model behind any
OpenAI-compatible chat-completions endpoint, one request per candidate step.

Candidates (``candidates``): every summary — a summary call, or a summary a rewrite
inserted (Claude Code's ``isCompactSummary`` message; ``history.summary_of`` decides) —
asked ``state``; every compaction the policy chose, asked ``trigger`` too (a harness
compacting at its budget, or a user's ``/compact``, is no decision of the agent's); the
first ``POST_COMPACTION_CALLS`` action calls after each compaction (``continuation``);
and with ``every_call`` each other action call of a rollout whose policy can compact
(should the agent have compacted here — ``trigger``).

The prompt shows the judge only what the policy saw when it made the step — the live
context of the call (for an inserted summary: the context it was written from), then
the step itself — never later events, the reward or whether the task was resolved: a
judge that knows the outcome grades hindsight, not decisions. It defines the key state
a summary must keep, and passes the rule judge's hits on the step as hints to verify.
The answer is one JSON object validated with pydantic (``JudgeAnswer``); an answer that
is not valid JSON, names a type the candidate was not asked about, or uses a verdict
that does not belong to its type is a failure, counted and reported, never a finding.
Each evidence quote of a finding must be in the history shown (in the message it names,
whitespace-normalized); a quote that is not there voids the finding (reported as a
failure). Answers are cached by the request body, i.e. by prompt (``chat_client``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from judge.chat_client import ChatClient, ChatError
from judge.history import POST_COMPACTION_CALLS, SUMMARY_FLAGS, compactions
from judge.llm_options import LlmJudgeOptions
from judge.rules import ALL_CHECKS, judge_rollout, policy_compacts
from judge.workspace import steps_in
from schemas.correction import (
    CorrectionType,
    Evidence,
    Finding,
    OmittedItem,
    Verdict,
    executed_output_text,
)
from schemas.replay import replay
from schemas.rollout import MessageEvent, Rollout

VERDICTS_BY_TYPE: dict[str, tuple[str, ...]] = {
    "trigger": ("ok", "too_early", "too_late", "missing_trigger"),
    "state": ("ok", "omission", "invented", "missing_next_step", "contradiction", "wrong_state"),
    "continuation": ("ok", "redo", "ignored_next_step", "drift"),
}

# The system prompt (judge/prompts/judge_system.txt): the three questions, the key state a
# summary must keep, and what rules cannot check — claims about the repository, the
# user's open requests, omitted facts that are not paths — each verdict with quotes.
PROMPT_FILE = Path(__file__).parent / "prompts" / "judge_system.txt"
SYSTEM_PROMPT = PROMPT_FILE.read_text().rstrip("\n")
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
    call_index: int  # the call a finding names (for an inserted summary: the first call after it)
    context: Sequence[MessageEvent]  # what was in context when the step was made
    step: MessageEvent  # the call, or the summary message a rewrite inserted
    types: tuple[str, ...]
    hints: tuple[str, ...] = ()  # the rule judge's hits on this step


def candidates(rollout: Rollout, every_call: bool = False) -> list[Candidate]:
    views = replay(rollout)
    comps = compactions(rollout, views)
    hints: dict[int, list[str]] = {}
    for f in judge_rollout(rollout, ALL_CHECKS):
        hints.setdefault(f.call_index, []).append(f"{f.type}/{f.verdict}: {f.rationale}")
    found: list[Candidate] = []
    taken: set[int] = set()
    for comp in comps:
        if comp.opaque:  # an encrypted summary: nothing to read
            continue
        if comp.summary_call is not None:
            view = comp.summary_call
            types: tuple[str, ...] = ("trigger", "state") if comp.policy_chose else ("state",)
            found.append(
                Candidate(
                    view.index, view.context, view.message, types, tuple(hints.get(view.index, ()))
                )
            )
            taken.add(view.index)
        elif comp.opens is not None:
            step = next(m for m in comp.opens.context if m.id == comp.message_id)
            state_hints = [h for h in hints.get(comp.opens.index, ()) if h.startswith("state/")]
            found.append(
                Candidate(comp.opens.index, comp.history, step, ("state",), tuple(state_hints))
            )
    first_after = {v.index for c in comps for v in c.after[:POST_COMPACTION_CALLS]}
    can_compact = policy_compacts(rollout, views, comps)
    for view in views:
        if view.index in taken:
            continue
        if view.index in first_after:
            types = ("continuation",)
            kinds = ("continuation/",)
        elif every_call and can_compact and view.message.call_kind == "action":
            types, kinds = ("trigger",), ("trigger/",)
        else:
            continue
        mine = tuple(h for h in hints.get(view.index, ()) if h.startswith(kinds))
        found.append(Candidate(view.index, view.context, view.message, types, mine))
    return sorted(found, key=lambda c: (c.call_index, c.types != ("state",)))


def render_message(msg: MessageEvent) -> str:
    body = executed_output_text(msg) if msg.role == "assistant" else msg.content
    label = msg.role if msg.role != "tool" else f"tool result ({msg.name or msg.tool_call_id})"
    kind = " [summary]" if msg.role == "assistant" and msg.call_kind == "summary" else ""
    if msg.role != "assistant" and summary_of_flag(msg):
        kind = " [summary the harness inserted at compaction]"
    return f"[{msg.id}] {label}{kind}:\n{body}"


def summary_of_flag(msg: MessageEvent) -> bool:
    return any(msg.meta.get(f) for f in SUMMARY_FLAGS)


def build_messages(rollout: Rollout, cand: Candidate, max_context_chars: int) -> list[dict]:
    """The judge's prompt: the call's live context (head and most recent tail when it is
    longer than ``max_context_chars``), then the step and the questions."""
    shown = [render_message(m) for m in cand.context]
    kept_head, budget = shown[:2], max_context_chars - sum(map(len, shown[:2]))
    kept_tail: list[str] = []
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
            *(recorded_state(cand.context) if "state" in cand.types else []),
            "=== STEP UNDER REVIEW ===",
            render_message(cand.step),
            *(["=== HINTS (deterministic checks; verify) ===", *cand.hints] if cand.hints else []),
            f"Questions: {', '.join(cand.types)}.",
        ]
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


# Commands that change or show what the repository holds: what summaries make claims about.
_REPO_COMMAND_RE = re.compile(
    r"\bgit\s+(?:-C\s+\S+\s+)?(?:commit|push|merge|rebase|checkout|switch|reset|stash|tag"
    r"|cherry-pick|pull|add|restore|revert)\b|\bgh\s+pr\b"
)
_EXCERPT = 200
_USER_MESSAGES = 5


def recorded_state(history: Sequence[MessageEvent]) -> list[str]:
    """The slice of history a summary's claims are held to, as a section of the prompt:
    every git command that changes or publishes the repository and every test, build or
    lint run, with whether it succeeded and the end of its output, then the user's last
    messages (their open requests). Each line names the message it comes from and quotes
    it verbatim (whitespace squashed, as quotes are verified): the model can quote its
    evidence from here even when the middle of a long history is not shown."""
    lines = []
    for step in steps_in(history):
        command = step.op.command or ""
        if step.op.kind != "test" and not _REPO_COMMAND_RE.search(command):
            continue
        if step.result is None:
            outcome, tail = "no result recorded", ""
        else:
            outcome = "failed" if step.failed else "succeeded"
            tail = _squash(step.result)[-_EXCERPT:]
        where = step.result_id or step.message_id
        lines.append(f"[{where}] `{_squash(command)[:_EXCERPT]}` {outcome}: {tail}")
    users = [
        m for m in history if m.role == "user" and m.content.strip() and not summary_of_flag(m)
    ][-_USER_MESSAGES:]
    lines += [f"[{m.id}] user wrote: {_squash(m.content)[: _EXCERPT * 2]}" for m in users]
    if not lines:
        return []
    return [
        "=== RECORDED STATE (repository commands and results, the user's last messages; "
        "quote from the messages named) ===",
        "\n".join(lines),
    ]


def _squash(text: str) -> str:
    return " ".join(text.split())


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


def unverified_quote(verdict: JudgedVerdict, shown: list[MessageEvent]) -> str | None:
    """The first evidence quote of ``verdict`` that is not in the history shown (in the
    message it names, or anywhere when it names no shown message), else None.
    Whitespace is normalized: models re-flow lines."""

    def squash(text: str) -> str:
        return " ".join(text.split())

    texts = {m.id: squash(render_message(m)) for m in shown}
    everything = " ".join(texts.values())
    for ev in verdict.evidence:
        quote = squash(ev.quote)
        if not quote:
            continue
        where = texts.get(ev.message_id, everything)
        if quote not in where:
            return ev.quote
    return None


@dataclass(frozen=True)
class Failure:
    rollout_id: str
    call_index: int
    reason: str


DEFAULTS = LlmJudgeOptions()  # seam judge's: one definition (judge/llm_options.py)


def judge_rollouts(
    rollouts: list[Rollout],
    client: ChatClient,
    concurrency: int = DEFAULTS.concurrency,
    every_call: bool = DEFAULTS.every_call,
    max_context_chars: int = DEFAULTS.max_context_chars,
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
            return [], [Failure(rollout.rollout_id, cand.call_index, str(exc))]
        shown = [*cand.context, cand.step]
        found, voided = [], []
        for v in answer.verdicts:
            if v.verdict == "ok":
                continue
            missing = unverified_quote(v, shown)
            if missing is not None:
                voided.append(
                    Failure(
                        rollout.rollout_id,
                        cand.call_index,
                        f"voided {v.type}/{v.verdict}: quote not in the history: {missing[:120]!r}",
                    )
                )
                continue
            found.append(
                Finding(
                    rollout_id=rollout.rollout_id,
                    call_index=cand.call_index,
                    type=v.type,
                    verdict=v.verdict,
                    rationale=v.rationale,
                    evidence=v.evidence,
                    omitted=v.omitted,
                    proposal=v.proposal,
                    judge_model=client.config.model,
                    prompt_hash=key,
                )
            )
        return found, voided

    findings, failures = [], []
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for found, failed in pool.map(run, jobs):
            findings += found
            failures += failed
    return findings, failures
