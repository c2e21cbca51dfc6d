"""Where Claude Code's attachments (and other text it adds at send time) land in a request.

Claude Code 2.1.197 builds each request from its message list (``normalizeMessagesForAPI``),
and these rules, read from its bundle and checked against captured requests
(``tests/fixtures/claude_code_cli``), decide where an attachment's messages go:

- user-message mode: an attachment written after the user's prompt is moved before it,
  to just after the previous call or tool result (``arrange``); one written after tool
  results is folded into the last result's text (``"\\n\\n".join`` of the stripped texts)
  when that result's content is a string, else (and for a tool hook's context, which
  Claude Code holds before the result) sent as text after the batch of results;
- system-message mode (``claude_code_attachments.system_mode``): text attachments are
  gathered and sent as one ``system`` message right before the next call (as a wrapped
  user message when nothing but a call comes before them);
- a tool result holding ``tool_reference`` blocks gets the text ``Tool loaded.`` after the
  batch of results (Claude Code adds it when it sends the request; the log lacks it).

Tool calls: Claude Code writes some fields into a ``tool_use`` input after the model
produced it and strips them again when it sends the history (``sent_tool_input``).

Attachments waiting when a compaction starts a new context were never sent after it:
they are dropped with the old context. One difference is left: Claude Code moves
attachments written after a compaction's summary (and the prompts after it) before the
summary; seam puts them right after it (same tokens, the summary first).
"""

from __future__ import annotations

from typing import Any

from pipeline.readers.builder import RolloutBuilder, msg
from pipeline.readers.claude_code_attachments import (
    IMAGE_PLACEHOLDER,
    TOOL_LOADED,
    Rendered,
    Unrendered,
    system_mode,
    verified,
    wrap,
)
from pipeline.readers.common import content_text


class Placement:
    """Places the attachment entries of one replay into its builder."""

    def __init__(self, builder: RolloutBuilder) -> None:
        self.builder = builder
        self.system: list[str] = []  # system-mode texts waiting for the next call
        self.after: list[tuple[str, str]] = []  # (id, text) to follow the batch of results
        self.last_result: tuple[str, bool] | None = None  # (event id, foldable) of the batch
        self.noted: set[tuple[str, str]] = set()  # (kind, version) flagged unverified

    @staticmethod
    def arrange(pairs: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        """Entries in the order Claude Code sends them: each user-mode attachment moved
        before the prompts (plain user entries) right before it. ``pairs`` are
        ``(index, entry)``; an attachment entry carries ``data["system"]``."""
        out: list[tuple[int, Any]] = []
        for index, entry in pairs:
            at = len(out)
            if entry.kind == "attachment" and not entry.data.get("system"):
                while at and out[at - 1][1].kind == "user" and not _has_results(out[at - 1][1]):
                    at -= 1
            out.insert(at, (index, entry))
        return out

    def before(self, kind: str) -> None:
        """Called before each entry is replayed: a non-result ends the batch of results."""
        if kind in ("result", "attachment"):
            return
        self.last_result = None
        for id_, text in self.after:
            self.builder.append(msg("user", text, id=id_, meta={"attachment": "after_results"}))
        self.after = []
        if kind == "call" and self.system:
            text = "\n\n".join(self.system)
            live = self.builder.live_messages()
            if live and live[-1].role in ("user", "tool"):
                self.builder.append(msg("system", text, meta={"attachment": "system_message"}))
            else:  # right after a call (or first): Claude Code sends it as a user message
                self.builder.append(msg("user", wrap(text), meta={"attachment": "system_message"}))
        if kind in ("call", "compact", "summary"):
            self.system = []

    def attachment(self, entry: Any, waiting: list[tuple[str, str]]) -> None:
        rec, rendered = entry.data["rec"], entry.data["rendered"]
        where = f"@{entry.line}"
        if isinstance(rendered, Unrendered):
            waiting.append(("unrendered_attachment", f"{where}: {rendered}"))
            return
        assert isinstance(rendered, Rendered)
        version = str(rec.get("version"))
        if not verified(version) and (rendered.kind, version) not in self.noted:
            self.noted.add((rendered.kind, version))
            waiting.append(
                (
                    "unverified_attachment",
                    f"{where}: '{rendered.kind}' from Claude Code {version} (rendered as "
                    "2.1.197 renders it)",
                )
            )
        if rendered.images:
            waiting.append(("image_content", f"{where}: {rendered.images} image(s) attached"))
        uuid = str(rec.get("uuid") or entry.line)
        text = rendered.system_text() if entry.data.get("system") else None
        if text is not None:
            self.system.append(text)
            return
        texts = rendered.user_texts()
        if self.last_result is not None:
            event_id, foldable = self.last_result
            if foldable and not rendered.after_results and not rendered.images:
                old = self.builder.messages[event_id].content
                folded = [t.strip() for t in (old, *texts) if t.strip()]
                self.builder.update(event_id, content="\n\n".join(folded))
            else:
                self.after.extend((f"{uuid}:{i}", t) for i, t in enumerate(texts))
            return
        for i, t in enumerate(texts):
            self.builder.append(
                msg(
                    "user",
                    t,
                    id=uuid if i == 0 else f"{uuid}:{i}",
                    meta={"attachment": rendered.kind},
                )
            )

    def result(self, event_id: str, block: dict, line: int, waiting: list) -> None:
        """A tool result was appended: later attachments fold into it (if its content was
        a string); its images and tool references are noted."""
        content = block.get("content")
        self.last_result = (event_id, isinstance(content, str))
        parts = content if isinstance(content, list) else []
        images = sum(isinstance(p, dict) and p.get("type") == "image" for p in parts)
        if images:
            waiting.append(("image_content", f"@{line}: {images} image(s) in a tool result"))
        names = tool_references(content)
        if names:
            waiting.append(
                (
                    "unrendered_tool_reference",
                    f"@{line}: tool_reference to {', '.join(names)} (the provider sends their "
                    "definitions, which Claude Code does not log)",
                )
            )
            self.after.append((f"{event_id}:loaded", TOOL_LOADED))


def _has_results(entry: Any) -> bool:
    """A user entry from a record that also holds tool results (Claude Code stops there)."""
    content = (entry.data["rec"].get("message") or {}).get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def tool_references(content: object) -> list[str]:
    """The tool names of the ``tool_reference`` blocks of a tool result's content."""
    parts = content if isinstance(content, list) else []
    return [
        str(p.get("tool_name"))
        for p in parts
        if isinstance(p, dict) and p.get("type") == "tool_reference"
    ]


def result_text(content: object) -> str:
    """A tool result's text: its text parts, ``[image]`` per image, and
    ``[tool_reference: <name>]`` per tool reference (whose expansion is not logged)."""
    if not isinstance(content, list):
        return content_text(content)
    out = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "tool_reference":
            out.append(f"[tool_reference: {part.get('tool_name')}]")
        elif isinstance(part, dict) and part.get("type") == "image":
            out.append(IMAGE_PLACEHOLDER)
        else:
            out.append(content_text([part]))
    return "\n".join(out)


def mark_modes(entries: list) -> None:
    """Record on each attachment entry whether Claude Code sends it as system text: by
    its version and the model of the next call (else the previous one)."""
    model = None
    for entry in reversed(entries):
        if entry.kind == "call":
            model = (entry.data["records"][0].get("message") or {}).get("model") or model
        elif entry.kind == "attachment" and model is not None:
            entry.data["model"] = model
    model = None
    for entry in entries:
        if entry.kind == "call":
            model = (entry.data["records"][0].get("message") or {}).get("model") or model
        elif entry.kind == "attachment":
            entry.data.setdefault("model", model)
            entry.data["system"] = system_mode(
                entry.data["rec"].get("version"), entry.data["model"]
            )


# Fields Claude Code injects into a tool call's input for its own use (``normalizeToolInput``)
# and strips before sending the history (2.1.197, ``normalizeToolInputForAPI``): the
# model neither generated nor saw them. ExitPlanMode gets the plan read from disk (1.5k
# tokens in a real 2.1.207 session whose call reported 31 output tokens); Edit with
# ``edits`` gets the first edit's strings copied to the top level.
INJECTED = {
    "ExitPlanMode": (None, ("plan", "planFilePath")),
    "Edit": ("edits", ("old_string", "new_string", "replace_all")),
}


def sent_tool_input(name: object, value: object) -> object:
    """A tool call's input as the model produced it and Claude Code sends it back."""
    rule = INJECTED.get(str(name))
    if rule is None or not isinstance(value, dict):
        return value
    when, fields = rule
    if when is not None and when not in value:
        return value
    return {k: v for k, v in value.items() if k not in fields}
