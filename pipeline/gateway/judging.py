"""The Judge in the loop: each candidate response is reviewed before the harness sees it.

AutoCompact's Judge reviews three decisions (``trigger``: when to compact; ``state``:
what the working-state summary keeps; ``continuation``: what the agent does right after
a compaction) and replaces the wrong ones. Here a review returns either nothing (the
original goes through) or a ``Review`` whose ``replacement`` is what the harness
receives instead; the gateway records the original, the replacement, the type, the
verdict, the rationale and the judge's name on the call and in ``corrections.jsonl``.

Two judges:

- ``rules``: seam's rule judge (``judge/rules.py``, adapted by
  ``judge/loop_judge.py``'s ``RuleJudge``; the command line plugs it in, the gateway
  itself imports no judge code) on the session so far, candidate included. Only findings that say what to do instead, from a check on by default
  (``judge/measured.py``: precision >= 0.8 on held-out real labels), become
  corrections: a summary that drops key state is replaced by the same summary with the
  dropped items appended, with the finding's evidence. No state check clears that bar
  today, so by default nothing is corrected. Every check's findings are recorded on the
  call as ``findings`` (``on_by_default`` says which) and the original goes through.
- ``URL``: an HTTP judge. The gateway POSTs ``{"rollout": <canonical rollout so far,
  candidate last>, "call_index": k, "candidate": <OpenAI assistant message>}`` and
  expects ``{"correction": null}`` or ``{"correction": {"type", "verdict",
  "replacement": <OpenAI assistant message or text>, "rationale", "judge_model"}}``.
  An LLM judge (or a human-in-the-loop tool) sits behind that URL.

A judge that fails or times out lets the original through; the call records why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from schemas.correction import CorrectionType, Verdict
from schemas.rollout import Rollout

_TYPES = set(CorrectionType.__args__)  # type: ignore[attr-defined]
_VERDICTS = set(Verdict.__args__)  # type: ignore[attr-defined]


class JudgeFailed(RuntimeError):
    """The judge could not review this call; the original goes through."""


@dataclass
class Review:
    type: str
    verdict: str
    replacement: dict  # an OpenAI assistant message: what the harness receives
    rationale: str
    judge_model: str
    evidence: list[dict] = field(default_factory=list)  # [{message_id, quote}] it stands on


@dataclass
class Outcome:
    review: Review | None
    findings: list[dict] = field(default_factory=list)


class LoopJudge(Protocol):
    name: str

    async def review(self, rollout: Rollout, call_index: int, candidate: dict) -> Outcome: ...


class HttpJudge:
    def __init__(self, url: str, session: aiohttp.ClientSession, timeout_s: float):
        from pipeline.common.credentials import split_url

        # A key in the judge's URL is sent as a header; the name recorded on every call
        # and correction is the URL without it.
        endpoint = split_url(url)
        self.url, self.headers = endpoint.url, endpoint.headers
        self.session, self.timeout_s = session, timeout_s
        self.name = endpoint.url

    async def review(self, rollout: Rollout, call_index: int, candidate: dict) -> Outcome:
        payload = {
            "rollout": rollout.model_dump(mode="json", exclude_none=True),
            "call_index": call_index,
            "candidate": candidate,
        }
        try:
            async with self.session.post(
                self.url,
                json=payload,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                if resp.status != 200:
                    raise JudgeFailed(f"judge answered HTTP {resp.status}")
                body = await resp.json(content_type=None)
        except TimeoutError:
            raise JudgeFailed(f"judge timed out after {self.timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise JudgeFailed(f"judge unreachable: {type(exc).__name__}: {exc}") from None
        except ValueError as exc:
            raise JudgeFailed(f"judge answered something that is not JSON: {exc}") from None
        return Outcome(_parse_review(body, candidate))


def _parse_review(body: Any, candidate: dict) -> Review | None:
    if not isinstance(body, dict) or "correction" not in body:
        raise JudgeFailed("judge answer has no 'correction' field")
    c = body["correction"]
    if c is None:
        return None
    if not isinstance(c, dict):
        raise JudgeFailed("judge 'correction' is not an object")
    if c.get("type") not in _TYPES or c.get("verdict") not in _VERDICTS:
        raise JudgeFailed(
            f"judge correction has type {c.get('type')!r} / verdict {c.get('verdict')!r}; "
            f"types are {sorted(_TYPES)}"
        )
    replacement = c.get("replacement")
    if isinstance(replacement, str):
        replacement = {"role": "assistant", "content": replacement}
    if not isinstance(replacement, dict):
        raise JudgeFailed("judge correction has no 'replacement' message or text")
    replacement = {"role": "assistant", "content": replacement.get("content") or ""} | {
        k: v for k, v in replacement.items() if k in ("tool_calls", "reasoning_content") and v
    }
    if replacement == {"role": "assistant", **{k: candidate.get(k) for k in replacement}}:
        return None  # "replaced" by itself: nothing was corrected
    return Review(
        c["type"],
        c["verdict"],
        replacement,
        str(c.get("rationale") or ""),
        str(c.get("judge_model") or "http-judge"),
        _evidence(c.get("evidence")),
    )


def _evidence(value: Any) -> list[dict]:
    """The judge's ``evidence`` list (``[{message_id, quote}]``), kept on the correction;
    an entry of another shape is not evidence and is left out."""
    if not isinstance(value, list):
        return []
    return [
        {"message_id": e["message_id"], "quote": e["quote"]}
        for e in value
        if isinstance(e, dict)
        and isinstance(e.get("message_id"), str)
        and isinstance(e.get("quote"), str)
    ]
