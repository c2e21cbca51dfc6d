"""Claude Code session JSONL (``~/.claude/projects/<cwd>/<sessionId>.jsonl``).

Why two passes: one API response is written as several ``assistant`` records (one per
thinking / text / tool_use block) sharing ``message.id``, and with streaming tool
execution a tool result can land between them. Pass one sorts records into
conversations (the main thread and each sidechain / sub-agent) and merges the blocks
of one response into one call; pass two (``claude_code_replay``) replays each
conversation into events.

Rewrites: ``compact_boundary`` + the following ``isCompactSummary`` user record become a
``compaction`` rewrite whose new context is the summary (plus any messages the
boundary says it preserved); the summary call itself is in a sub-agent file
(``agent-acompact-*``), joined to the session as that compaction's summary call
(``claude_code_compact``). ``microcompact_boundary`` clears the results of ``compactedToolIds``
in place: an ``edit`` rewrite (a context edit, counted apart from compactions) keeping
everything, with those results replaced by the cleared placeholder. ``attachment``
records become the messages Claude Code sends for them (``claude_code_attachments``).
Records that are not model messages are skipped with their reason.
Claude Code records no system prompt, tool schemas, token ids or rewards.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from pipeline.readers import Reader, ReadItem, Rejected, Skipped, register
from pipeline.readers.claude_code_attachments import Rendered, Unrendered, render
from pipeline.readers.claude_code_captures import join_captures
from pipeline.readers.claude_code_compact import (
    flag_unlogged_reattachments,
    join_compaction_calls,
)
from pipeline.readers.claude_code_replay import Entry, Thread, thread_rollout
from pipeline.readers.common import (
    BAD_CONTENT,
    REPEAT,
    UniqueNames,
    content_text,
    located,
    merged_records,
    reason_of,
    top_level_fields,
)
from pipeline.sources.canonical_io import open_text_stream

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SESSION_SCAN_BYTES = 1 << 24  # how far planning looks for a file's sessionId
_SESSION_ID = re.compile(rb'"sessionId"\s*:\s*"([^"]+)"')

MESSAGE_TYPES = {"user", "assistant", "system", "attachment"}
SKIP_REASONS = {
    "summary": "session title record (for resume; not a compaction)",
    "file-history-snapshot": "file-history-snapshot record (undo bookkeeping)",
    "progress": "progress record (tool/hook progress, not sent to the model)",
}


@register
class ClaudeCodeReader(Reader):
    name = "claude-code"
    records_outcomes = False
    description = (
        "Claude Code session JSONL (~/.claude/projects/*/*.jsonl), sub-agent files included"
    )

    def sniff(self, path: Path, head: bytes) -> bool:
        for line in head.split(b"\n")[:50]:
            if b'"parentUuid"' in line and b'"sessionId"' in line:
                return True
            if b'"type":"file-history-snapshot"' in line.replace(b" ", b""):
                return True
        return False

    def session_key(self, path: Path, head: bytes) -> str | None:
        """The session a file belongs to, for planning: files named ``<sessionId>.jsonl``
        are that session (a resumed session's file starts with copies of the earlier
        one's records); any other file (a snapshot, a slice, a sub-agent transcript)
        belongs to the ``sessionId`` its first records carry."""
        stem = path.name.split(".")[0]
        if _UUID.fullmatch(stem):
            return stem
        found = _SESSION_ID.search(head)
        if found is None:  # a long first record (a file-history snapshot): read on
            with open_text_stream(path) as fh:
                found = _SESSION_ID.search(fh.read(SESSION_SCAN_BYTES))
        return found.group(1).decode() if found else None

    def read(self, path: Path) -> Iterator[ReadItem]:
        yield from self.read_files([path])

    def read_files(self, paths: list[Path]) -> Iterator[ReadItem]:
        """The records of one session, from one file or several (snapshots that repeat
        each other, disjoint slices), merged by record ``uuid``: files in the order of
        their first timestamp, each record once (a repeat is skipped and counted), then
        read as one file. Items of several files name their ``file``."""
        records, where = merged_records(paths, _uuid)
        for item in self._read_records(records, paths[0]):
            yield located(join_captures(item, paths), where, len(paths) > 1)

    def _read_records(self, records: list, path: Path) -> Iterator[ReadItem]:
        threads: dict[str, Thread] = {}
        thread_of: dict[str, str] = {}
        seen: set[tuple[str, str]] = set()
        known = {str(rec["uuid"]) for _, rec, _, _ in records if rec and rec.get("uuid")}
        known |= {u for _, _, error, raw in records if error and (u := _unreadable(raw)[1])}
        tool_uses = _tool_use_ids(records)
        lost: list[tuple[str, str]] = []  # damage that no thread can be told from (bad lines)
        unsent = False  # the record before was a lost one of a type never sent
        for line, rec, error, raw in records:
            if error:
                kind = _unreadable(raw)[0] if raw != REPEAT else None
                if raw == REPEAT or (kind and kind not in MESSAGE_TYPES):
                    unsent = raw != REPEAT
                    yield Skipped(line, error if raw == REPEAT else _never_sent(kind, error))
                    continue
                lost.append(("lost_records", f"@{line}: {error}"))
                yield Rejected(line, error, raw)
                continue
            if unsent and rec.get("parentUuid"):
                # Its parent is most likely the record lost right before it (whose uuid,
                # written last, a cut record rarely shows): not a missing message.
                known.add(str(rec["parentUuid"]))
            unsent = False
            self._check_parent(rec, line, known, tool_uses, threads, thread_of)
            try:
                skip = self._sort(rec, line, raw, threads, thread_of, seen)
            except BAD_CONTENT as exc:
                lost.append(("lost_records", f"@{line}: {reason_of(exc)}"))
                yield Rejected(line, reason_of(exc), raw)
                continue
            if skip:
                yield Skipped(line, skip)
        join_compaction_calls(threads)
        flag_unlogged_reattachments(
            threads, any(rec and rec.get("type") == "attachment" for _, rec, _, _ in records)
        )
        ids = UniqueNames()
        for thread in threads.values():
            thread.fidelity.extend(
                {"reason": reason, "event_id": None, "detail": detail} for reason, detail in lost
            )
            yield from thread_rollout(thread, path, ids, self.name)

    def _check_parent(
        self, rec: dict, line: int, known: set, tool_uses: set, threads: dict, thread_of: dict
    ) -> None:
        """A record whose ``parentUuid`` is in none of the session's files: before the
        conversation's first message the file is a slice (the session began earlier);
        after it, at a user or assistant record, a record was lost. Claude Code does not
        write every record it links to: ``progress`` and ``system`` records (hooks, the
        compact boundary's ``logicalParentUuid``) and tool results (linked to the whole
        response) may point to records never written (measured on 135 real files), so
        those are not evidence of a loss; a tool result whose call is missing is."""
        parent = rec.get("parentUuid")
        if parent is None or str(parent) in known or rec.get("type") is None:
            return
        key = self._thread_key(rec, thread_of)
        thread = threads.setdefault(key, Thread(key, agent_id=rec.get("agentId")))
        if not thread.entries:
            thread.note_slice(f"@{line}: parentUuid {parent} is in none of the given files")
            return
        if rec.get("type") not in ("user", "assistant"):
            return
        message = found if isinstance(found := rec.get("message"), dict) else {}
        content = message.get("content")
        results = [
            b.get("tool_use_id")
            for b in (content if isinstance(content, list) else [])
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if results and all(str(r) in tool_uses for r in results):
            return
        thread.note_lost(f"@{line}: parentUuid {parent} (the record before it) is missing")

    def _sort(
        self, rec: dict, line: int, raw: str, threads: dict, thread_of: dict, seen: set
    ) -> str | None:
        """Put one record into its conversation; returns a skip reason if it is not a message."""
        rtype = rec.get("type")
        if rtype not in MESSAGE_TYPES:
            return SKIP_REASONS.get(str(rtype), f"'{rtype}' record: not a model message")
        key = self._thread_key(rec, thread_of)
        if rec.get("uuid"):
            thread_of[str(rec["uuid"])] = key
            fingerprint = (str(rec["uuid"]), raw.strip())
            if fingerprint in seen:
                return "exact duplicate of an earlier record"
            seen.add(fingerprint)
        thread = threads.setdefault(key, Thread(key, agent_id=rec.get("agentId")))
        return self._collect(thread, rec, line)

    @staticmethod
    def _thread_key(rec: dict, thread_of: dict[str, str]) -> str:
        """Main thread, or one sidechain per agent id (else per chain root)."""
        if not rec.get("isSidechain"):
            return "main"
        if rec.get("agentId"):
            return f"agent-{rec['agentId']}"
        parent = thread_of.get(str(rec.get("parentUuid")))
        if parent and parent != "main":
            return parent
        return f"sidechain-{str(rec.get('uuid', ''))[:8]}"

    def _collect(self, thread: Thread, rec: dict, line: int) -> str | None:
        """Add one record to its conversation; returns a skip reason if it adds nothing."""
        if rec.get("sessionId") and str(rec["sessionId"]) not in thread.sessions:
            thread.sessions.append(str(rec["sessionId"]))
        for name in ("cwd", "version", "gitBranch"):
            if rec.get(name) and name not in thread.meta:
                thread.meta[name] = rec[name]
        rtype = rec["type"]
        if rtype == "attachment":
            return _collect_attachment(thread, rec, line)
        if rtype == "system":
            sub = rec.get("subtype")
            if sub in ("compact_boundary", "microcompact_boundary"):
                thread.windows += sub == "compact_boundary"
                thread.entries.append(Entry(sub.split("_")[0], line, rec))
                thread.lines.add(line)
                return None
            return f"system/{sub} record: not sent to the model"
        message = found if isinstance(found := rec.get("message"), dict) else {}
        if rtype == "assistant":
            if rec.get("isApiErrorMessage"):
                return "API error message (written by Claude Code, not a model call)"
            if message.get("model") == "<synthetic>":
                return "synthetic assistant record (written by Claude Code, not a model call)"
            group = f"{thread.windows}:{message.get('id') or rec.get('uuid') or line}"
            if group in thread.calls:
                thread.calls[group].data["records"].append(rec)
            else:
                thread.calls[group] = Entry("call", line, {"records": [rec]})
                thread.entries.append(thread.calls[group])
            thread.lines.add(line)
            return None
        if rec.get("isCompactSummary"):
            thread.entries.append(Entry("summary", line, rec))
            thread.lines.add(line)
            return None
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        text = content_text(
            [b for b in blocks if not (isinstance(b, dict) and b.get("type") == "tool_result")]
        )
        for block in results:
            thread.entries.append(Entry("result", line, {"rec": rec, "block": block}))
        images = sum(isinstance(b, dict) and b.get("type") == "image" for b in blocks)
        if images:  # content_text keeps "[image]" in their place
            thread.note("image_content", f"@{line}: {images} image(s) in a user message")
        if text.strip():
            thread.entries.append(Entry("user", line, {"rec": rec, "text": text}))
        if not results and not text.strip():
            return "empty user record"
        thread.lines.add(line)
        return None


def _collect_attachment(thread: Thread, rec: dict, line: int) -> str | None:
    """An ``attachment`` record: the messages Claude Code sends for it become an entry
    (``claude_code_attachments``); one it sends nothing for is skipped with that reason."""
    attachment = rec.get("attachment")
    if not isinstance(attachment, dict):
        return "attachment record without an attachment object"
    try:
        rendered: Rendered | Unrendered | None = render(attachment)
    except Unrendered as exc:
        rendered = exc
    if rendered is None:
        return (
            f"attachment '{attachment.get('type')}': Claude Code sends nothing to the model for it"
        )
    thread.entries.append(Entry("attachment", line, {"rec": rec, "rendered": rendered}))
    thread.lines.add(line)
    return None


def _unreadable(raw: str) -> tuple[str | None, str | None]:
    """The ``type`` and ``uuid`` of a record that does not parse, when its text still
    shows them (a cut or run-together line)."""
    fields = top_level_fields(raw) if raw.lstrip().startswith("{") else {}
    return fields.get("type"), fields.get("uuid")


def _never_sent(kind: str | None, error: str) -> str:
    """Why losing a record of a type Claude Code never sends to the model (``progress``,
    ``file-history-snapshot`` ...) is not damage: no context the model saw is missing."""
    return f"unreadable '{kind}' record, a type never sent to the model: nothing the model saw is lost ({error})"


def _tool_use_ids(records: list) -> set[str]:
    ids = set()
    for _, rec, _, _ in records:
        message = (rec or {}).get("message")
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("id"):
                ids.add(str(block["id"]))
    return ids


def _uuid(rec: dict, raw: str) -> str | None:
    """A Claude Code record's identity across snapshot files: its ``uuid``."""
    return str(rec["uuid"]) if rec.get("uuid") is not None else None
