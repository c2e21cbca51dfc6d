"""Read one compaction summary and check it against the history it summarizes.

The checks are the failure modes of docs/summaries.md ("How summaries fail") and the
measures AutoCompact reports for working-state summaries:

- **key-state omission**: a key file, failing command, error signature or test name of
  the workspace state (``workspace.py``) that the summary does not mention;
- **next-step omission**: no next-step section, or one with nothing concrete in it (no
  path, test, code identifier or command: "continue working on the task" is not a step);
- **contradiction**: the state says a problem remains and the next step says finish, or
  the state says everything passes and the next step says fix what fails;
- **wrong state**: a test recorded as passing whose latest run failed or that never ran
  ("added" and "passing" are different facts), a file recorded as changed that was
  never written — judged on the whole history before the summary, since an earlier
  summary may rightly carry a change made before it;
- **invented paths**: a path in the state part that appears nowhere in the history the
  summary call saw (the next-step part may name files still to create).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from judge.facts import (
    abbreviates,
    command_core,
    command_program,
    mentions_path,
    names_file,
    parse_arguments,
    paths_in,
    same_path,
    test_names_in,
)
from judge.workspace import WorkspaceState
from schemas.correction import OmittedItem
from schemas.rollout import MessageEvent

# Next-step headings, most specific first: Claude Code's summary has "7. Pending Tasks"
# *and* "9. Optional Next Step"; the step is the latter.
_NEXT_HEADS = (
    re.compile(r"(?i)\b(?:next steps?|what to do next|to do next)\b"),
    re.compile(r"(?i)\b(?:what remains|remaining (?:work|steps|tasks)|pending tasks?|plan)\b"),
)
# A next step saying that nothing is left ("None – the task is complete", "No explicit next
# step requested"): the right answer when the work is done, not a missing step.
_NONE_NEEDED_RE = re.compile(
    r"(?i)^[\s*>#-]*(?:none\b|nothing\b|no (?:explicit |further |more |other )?"
    r"(?:next steps?|steps?|tasks?|work|action)\b|n/a\b)"
    r"|\b(?:task|work|implementation|fix|feature) (?:is|are) (?:now )?(?:complete|done|finished)\b"
)
# What harnesses wrap around a summary they insert (Claude Code's resume message); the
# wrapper names the full transcript's path, which the summary's author never saw.
_WRAPPER_HEAD_RE = re.compile(
    r"^This session is being continued from a previous conversation[^\n]*\n"
    r"|^Another language model started to solve this problem[^\n]*\n"
)
_WRAPPER_TAIL_RE = re.compile(
    r"\n+(?:If you need specific details from before compaction[^\n]*"
    r"|Please continue the conversation from where we left (?:it )?off[^\n]*"
    r"|Continue the conversation from where it left off[^\n]*)\s*$"
)
_HEADING_RE = re.compile(
    r"^\s*(?:#{1,6}\s+\S|\*\*[^*]+\*\*:?\s*$|\*\*[^*]+:\*\*|\d+\.\s+[\w ]{2,40}:\s*$|[A-Z][\w /-]{1,40}:\s*$)"
)
_INLINE_NEXT_RE = re.compile(r"(?i)\bnext(?: steps?)?\s*(?::|-|,| is to| will be)\s*(\S.*)")
_CONCRETE_RE = re.compile(
    r"`[^`]+`|\b\w+\(\)|\b[a-z0-9]+_[a-z0-9_]+\b|\b[a-z]+[A-Z]\w*\b|\b[A-Z][a-z]+[A-Z]\w*\b|\bline \d+"
    r"|\b(?:pytest|git|make|python|npm|cargo|go test|grep|sed|submit)\b"
)
_OPEN_RE = re.compile(
    r"(?i)\b(?:still (?:fails?|failing|broken|errors?|erroring|red)|(?:is|are) (?:still )?failing"
    r"|not (?:yet )?(?:fixed|passing|resolved|working)|remains? (?:unfixed|unresolved|failing|open|broken)"
    r"|error remains|unresolved|did(?: not|n't) fix)\b|(?:—|–|:)\s*(?:still )?failing\b"
)
_DONE_RE = re.compile(
    r"(?i)\b(?:submit|finish|nothing (?:left|else|more)|no further (?:work|steps|changes)"
    r"|task is (?:complete|done|finished)|all done|wrap up|we are done|complete the task)\b"
)
_DENIAL_RE = re.compile(
    r"(?i)^[\s*>#-]*(?:[\w ]{1,40}:\s*)?(?:none|nothing|no (?:errors?|failures?|failing))\b"
)
_ALL_PASS_RE = re.compile(
    r"(?i)\ball (?:the )?tests (?:now )?pass(?:es|ing|ed)?\b|\bno (?:remaining )?failures\b"
)
_FIX_FAILING_RE = re.compile(
    r"(?i)\b(?:fix|debug|investigate) (?:the )?(?:failing|remaining|broken)\b"
)
_PASS_CLAIM_RE = re.compile(r"(?i)\b(?:pass(?:es|ing|ed)?|green)\b")
_NEGATION_RE = re.compile(r"(?i)\b(?:not|fail\w*|never|n't)\b")
_EDIT_CLAIM_RE = re.compile(
    r"(?i)\b(?:edited|modified|changed|patched|updated|rewrote|rewritten)\b"
)
_LEADING_PATH_RE = re.compile(
    r"(?:\s*(?:,|:|\band\b|&)?\s*(?:the\s+)?(?:files?:?\s+)?[`'\"]?)([\w./~@+-]+)[`'\"]?"
)
_RENAMED_TO_RE = re.compile(r"""\s*(?:to|->|→|=>)\s*[`'"]?[\w./~@+-]+\.\w+""")
_SENTENCE_RE = re.compile(r"\n+|(?<=[.;!?])\s+")


def summary_text(call: MessageEvent) -> str:
    """The summary a call wrote: its content, or the text it passed to a ``compact``-style tool."""
    if call.content.strip():
        return call.content
    values = [
        v
        for tc in call.tool_calls
        for v in (parse_arguments(tc) or {}).values()
        if isinstance(v, str)
    ]
    return "\n".join(values)


def summary_body(text: str) -> str:
    """The summary without the harness's wrapper around it (Claude Code's "This session is
    being continued ..." head and "If you need specific details ... / Please continue ...
    / Continue the conversation ..." tail, as 2.0 and 2.1 write them): what the summary's
    author wrote."""
    text = _WRAPPER_HEAD_RE.sub("", text, count=1)
    while True:
        stripped = _WRAPPER_TAIL_RE.sub("", text)
        if stripped == text:
            return text
        text = stripped


def split_summary(text: str) -> tuple[str, str | None]:
    """(state part, next-step part or None). The next-step part is the section under a
    next-step heading (a "next step" heading before a "pending tasks" one), else the rest
    of a line such as "Next step: ..."."""
    lines = text.splitlines()
    for head_re in _NEXT_HEADS:
        for i, line in enumerate(lines):
            if head_re.search(line) and (
                _HEADING_RE.match(line) or len(line) < 60 and line.rstrip().endswith(":")
            ):
                head_rest = line.split(":", 1)[1].strip(" *") if ":" in line else ""
                end = next(
                    (j for j in range(i + 1, len(lines)) if _HEADING_RE.match(lines[j])),
                    len(lines),
                )
                body = "\n".join([head_rest, *lines[i + 1 : end]]).strip()
                return "\n".join(lines[:i] + lines[end:]), body
    for i, line in enumerate(lines):
        match = _INLINE_NEXT_RE.search(line)
        if match:
            return "\n".join(lines[:i] + lines[i + 1 :]), match.group(1).strip()
    return text, None


# A next step that quotes what the user asked for ("The user's exact request was: > "..."")
# is anchored to that request even when it names no file or identifier.
_QUOTED_REQUEST_RE = re.compile(r'["“][^"”\n]{15,}["”]')


def is_concrete(step: str | None) -> bool:
    if not step:
        return False
    return bool(
        paths_in(step)
        or test_names_in(step)
        or _CONCRETE_RE.search(step)
        or _QUOTED_REQUEST_RE.search(step)
    )


def says_none_needed(step: str | None) -> bool:
    """The next step says nothing is left to do."""
    return bool(step) and bool(_NONE_NEEDED_RE.search(step or ""))


@dataclass
class SummaryCheck:
    chars: int
    words: int
    key_items: int
    omitted: list[OmittedItem] = field(default_factory=list)
    next_step: str | None = None
    has_next_step: bool = False  # concrete, or "none needed" while no problem is open
    next_step_none: bool = False  # the next step says nothing is left to do
    contradictions: list[str] = field(default_factory=list)
    wrong_state: list[str] = field(default_factory=list)
    invented_paths: list[str] = field(default_factory=list)


def check_summary(
    text: str,
    state: WorkspaceState,
    truth: WorkspaceState | None = None,
    history_complete: bool = True,
) -> SummaryCheck:
    """Check ``text`` against ``state`` (the workspace seen in the summary's live context)
    and, for wrong-state claims, ``truth`` (the whole history before it; default ``state``).
    Invented paths are judged only when ``history_complete`` (a slice's summary names
    files read before the slice began). The harness's wrapper is not part of the summary."""
    text = summary_body(text)
    state_part, next_part = split_summary(text)
    mentioned = paths_in(text)
    none_needed = says_none_needed(next_part)
    check = SummaryCheck(
        chars=len(text),
        words=len(text.split()),
        next_step=next_part,
        has_next_step=is_concrete(next_part)
        or (none_needed and not _states_open_problem(state_part)),
        next_step_none=none_needed,
        key_items=len(state.key_files)
        + len(state.failing_commands)
        + len(state.errors)
        + len(state.key_tests),
    )
    check.omitted += [
        OmittedItem(kind="file_path", value=p)
        for p in state.key_files
        if not mentions_path(mentioned, p) and not names_file(text, p)
    ]
    check.omitted += [
        OmittedItem(kind="failing_command", value=group[-1])
        for group in _same_failure(state.failing_commands)
        if not any(_command_kept(c, text, mentioned) for c in group)
    ]
    check.omitted += [
        OmittedItem(kind="error_message", value=e) for e in state.errors if e not in text
    ]
    check.omitted += [
        OmittedItem(kind="test_name", value=t)
        for t in state.key_tests
        if not re.search(rf"\b{re.escape(t)}\b", text)
    ]
    if next_part:
        if _states_open_problem(state_part) and _DONE_RE.search(next_part):
            check.contradictions.append(
                "the state says a problem remains but the next step says to finish"
            )
        if _ALL_PASS_RE.search(state_part) and _FIX_FAILING_RE.search(next_part):
            check.contradictions.append(
                "the state says all tests pass but the next step says to fix failures"
            )
    check.wrong_state = _wrong_state_claims(state_part, truth or state)
    if history_complete:
        seen = (truth or state).seen_paths
        check.invented_paths = [
            p
            for p in paths_in(state_part)
            if not mentions_path(seen, p) and not any(abbreviates(p, q) for q in seen)
        ]
    return check


def _states_open_problem(state_part: str) -> bool:
    """A line of the state says a problem remains; headings ("## Unresolved errors") and
    lines that deny it ("None: the last run passed") do not."""
    return any(
        _OPEN_RE.search(line) and not _HEADING_RE.match(line) and not _DENIAL_RE.search(line)
        for line in state_part.splitlines()
    )


def _same_failure(failing: dict[str, list[str]]) -> list[list[str]]:
    """Failing commands grouped by the tests they report failed: a targeted run and a
    full-suite run that fail on the same test are one failure, recorded by either command."""
    groups: dict[tuple, list[str]] = {}
    for command, tests in failing.items():
        groups.setdefault(tuple(sorted(tests)) or (command,), []).append(command)
    return list(groups.values())


def _command_kept(command: str, text: str, mentioned: list[str]) -> bool:
    """A failing command is kept when the summary quotes it, or names its program and
    every file and test it runs (``pytest tests/t.py`` keeps ``cd /repo && python -m pytest tests/t.py -q``)."""
    squash = " ".join(text.split())
    if " ".join(command_core(command).split()) in squash:
        return True
    targets = paths_in(command) + test_names_in(command)
    if targets:
        return all(mentions_path(mentioned, t) if "." in t else t in text for t in targets)
    return command_program(command) in text


def _wrong_state_claims(state_part: str, state: WorkspaceState) -> list[str]:
    claims = []
    for sentence in _SENTENCE_RE.split(state_part):
        if _PASS_CLAIM_RE.search(sentence) and not _NEGATION_RE.search(sentence):
            for test in test_names_in(sentence):
                passed = state.test_passed.get(test)
                if passed is False:
                    claims.append(f"{test} is recorded as passing but its latest run failed")
                elif passed is None and not state.verified_after_last_write:
                    claims.append(f"{test} is recorded as passing but was never run")
        for match in _EDIT_CLAIM_RE.finditer(sentence):
            if _is_negated(sentence[: match.start()]):
                continue
            for path in _object_paths(sentence[match.end() :]):
                if not any(same_path(path, w) for w in state.written):
                    claims.append(f"{path} is recorded as changed but was never written")
    return list(dict.fromkeys(claims))


def _object_paths(text: str) -> list[str]:
    """The paths a verb acts on: the path right after it and any joined to it by commas
    or "and" ("edited a.py, b.py and c.py to ..." names three; "... as t.py expects" none)."""
    found: list[str] = []
    rest = text
    while True:
        match = _LEADING_PATH_RE.match(rest)
        if not match or not paths_in(match.group(1)):
            return found
        rest = rest[match.end() :]
        if _RENAMED_TO_RE.match(rest):  # "changed `a.json` to `b.json`": a name in text, not a file
            return found
        found.append(paths_in(match.group(1))[0])


def _is_negated(before: str) -> bool:
    """The verb is denied or still to come: "not yet updated", "haven't yet updated",
    "needs to be updated", "will be modified", "should be changed"."""
    return bool(
        re.search(r"(?i)(?:\b(?:not|never|un)|n't)\s*\w*\s*$", before)
        or re.search(r"(?i)\b(?:to|will|would|should|must|needs?|can)\s+(?:be\s+|get\s+)?$", before)
    )
