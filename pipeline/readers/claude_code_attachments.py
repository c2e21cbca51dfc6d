"""Claude Code ``attachment`` records, rendered as the harness sends them to the model.

Claude Code writes context it adds on its own (an ``@file`` mention, a skill listing, a
plan-mode reminder, a hook's output, ...) as ``{"type": "attachment", "attachment":
{"type": <kind>, ...}}`` records, and turns each into API messages only when it builds a
request (``normalizeAttachmentForAPI`` in its bundle). What follows was read from the
bundle of Claude Code 2.1.197 and checked against the requests that CLI sent to a
stand-in server (``tests/fixtures/claude_code_cli``):

- Most kinds become one user message ``<system-reminder>\\n{text}\\n</system-reminder>``.
  A mention is shown as a tool call and its result: a file as "Called the Read tool with
  the following input: {json}" and "Result of calling the Read tool:\\n" + the file
  numbered ``{n}\\t{line}``; a directory as the same for Bash ``ls``.
- Some kinds render to nothing (``SILENT``: e.g. ``already_read_file``,
  ``command_permissions``): they are bookkeeping, never sent.
- Placement (``arrangeAttachmentsForAPI``): an attachment written after the user's prompt
  is sent *before* it (right after the previous call or tool result); one written after
  tool results is folded into the last result's text (joined with a blank line), except
  a ``PostToolUse`` hook's context, which follows the results as its own text.
- With models newer than those Claude Code lists as not taking mid-conversation system
  messages (``mid_conversation_system``: every model but claude-3-*, opus-4-0…4-7,
  sonnet-4-0…4-6, haiku-4-5), text attachments are instead gathered into one ``system``
  message right before the next call: each attachment's texts unwrapped and joined with
  a newline, attachments with a blank line.

Versions: seam renders as 2.1.197 does; that rendering was observed (captured requests)
for 2.1.197 and matches the reported usage growth of real 2.1.207–2.1.215 sessions
(``VERIFIED``). An attachment of another version is still rendered but flagged
``unverified_attachment``; a kind seam does not know how to render is flagged
``unrendered_attachment`` (the kind in the detail) with a placeholder in its place.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

READ, BASH, TOOL_SEARCH, ASK, EXIT_PLAN = (
    "Read",
    "Bash",
    "ToolSearch",
    "AskUserQuestion",
    "ExitPlanMode",
)
IMAGE = None  # a part that is an image block, not text
IMAGE_PLACEHOLDER = "[image]"
TOOL_LOADED = "Tool loaded."  # the text Claude Code adds after a tool_reference result
AMBIENT = (
    "This is ambient context \u2014 do not narrate it to the user unless they ask or it is "
    "directly relevant to their request."
)
VERIFIED = ((2, 1, 197), (2, 1, 215))  # versions whose rendering was observed (inclusive)

# Kinds Claude Code 2.1.197 turns into no message at all.
SILENT = frozenset(
    {
        "already_read_file",
        "command_permissions",
        "context_tip",
        "dynamic_skill",
        "edited_image_file",
        "goal_status",
        "hook_cancelled",
        "hook_deferred_tool",
        "hook_error_during_execution",
        "hook_non_blocking_error",
        "hook_permission_decision",
        "hook_system_message",
        "max_turns_reached",
        "structured_output",
        "teammate_shutdown_batch",
        "autocheckpointing",
        "background_task_status",
        "todo",
        "task_progress",
        "ultramemory",
        "compaction_reminder",
        "current_session_memory",
        "thinking_reminder",
        "companion_intro",
        "pen_mode_enter",
        "pen_mode_exit",
        "ultrawork_request",
        "echo_activities",
        "verify_plan_reminder",
        "context_efficiency",
    }
)

# Models Claude Code 2.1.197 sends attachments to as user messages (``mid_conversation_system``
# is off for them); any other model gets them as a system message before the next call.
_USER_MODE_MODELS = re.compile(r"claude-3-|claude-(opus-4-[0-7]|sonnet-4-[0-6]|haiku-4-5)(?![0-9])")
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_PLAN_FULL = Path(__file__).with_name("claude_code_plan_mode.txt").read_text().rstrip("\n")


class Unrendered(Exception):
    """An attachment seam cannot reproduce (unknown kind or shape); the message says why."""


@dataclass(frozen=True)
class Rendered:
    """What one attachment record sends: ``parts`` are the API messages it becomes, in
    order (text unwrapped, or ``IMAGE``); ``after_results`` when it is a PostToolUse
    hook's context (never folded into a tool result)."""

    kind: str
    parts: tuple[str | None, ...]
    after_results: bool = False

    def user_texts(self) -> list[str]:
        """The parts as the user messages Claude Code sends (each wrapped, images as a
        placeholder)."""
        return [IMAGE_PLACEHOLDER if p is IMAGE else wrap(p) for p in self.parts]

    @property
    def images(self) -> int:
        return sum(p is IMAGE for p in self.parts)

    def system_text(self) -> str | None:
        """The text this attachment adds to a mid-conversation system message, or None
        when it holds an image (Claude Code then sends it as user messages)."""
        if self.images:
            return None
        return "\n".join(str(p) for p in self.parts)


def wrap(text: str) -> str:
    return f"<system-reminder>\n{text}\n</system-reminder>"


def version_tuple(version: object) -> tuple[int, int, int] | None:
    found = _VERSION.fullmatch(str(version or ""))
    return tuple(int(g) for g in found.groups()) if found else None  # type: ignore[return-value]


def verified(version: object) -> bool:
    v = version_tuple(version)
    return v is not None and VERIFIED[0] <= v <= VERIFIED[1]


def system_mode(version: object, model: object) -> bool:
    """Whether Claude Code sends text attachments as a mid-conversation system message
    (2.1.197 and later, for a model not in its list of older models)."""
    v = version_tuple(version)
    if v is None or v < VERIFIED[0] or not model:
        return False
    return not _USER_MODE_MODELS.search(str(model))


def render(attachment: dict) -> Rendered | None:
    """The messages ``attachment`` becomes; None if Claude Code sends nothing for it.
    Raises ``Unrendered`` for a kind (or shape) seam cannot reproduce."""
    kind = str(attachment.get("type"))
    if kind in SILENT:
        return None
    renderer = _RENDERERS.get(kind)
    if renderer is None:
        raise Unrendered(f"attachment type '{kind}' is not known to seam")
    try:
        parts = renderer(attachment)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise Unrendered(f"attachment type '{kind}' has an unexpected shape ({exc})") from None
    if not parts:
        return None
    after = kind == "hook_additional_context" and attachment.get("hookEvent") == "PostToolUse"
    return Rendered(kind, tuple(parts), after_results=after)


def _json(value: object) -> str:
    """``JSON.stringify`` (no spaces, non-ASCII as is)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _called(tool: str, args: dict) -> str:
    return f"Called the {tool} tool with the following input: {_json(args)}"


def numbered(content: str, start: int = 1) -> str:
    """The Read tool's text: each line (a trailing ``\\r`` dropped) as ``{n}\\t{line}``."""
    lines = content.split("\n")
    return "\n".join(f"{n}\t{line.removesuffix(chr(13))}" for n, line in enumerate(lines, start))


def _file(a: dict) -> list[str | None]:
    content = a["content"]
    name = a["filename"]
    called = _called(READ, {"file_path": name})
    if content["type"] == "image":
        return [called, IMAGE]
    if content["type"] != "text":
        raise Unrendered(f"attachment type 'file' with {content['type']} content")
    file = content["file"]
    text = file["content"]
    if not text:
        raise Unrendered("attachment type 'file' of an empty file")
    parts: list[str | None] = [
        called,
        f"Result of calling the {READ} tool:\n{numbered(text, int(file.get('startLine') or 1))}",
    ]
    if a.get("truncated"):
        raise Unrendered("attachment type 'file' truncated (the line limit is not recorded)")
    return parts


def _directory(a: dict) -> list[str | None]:
    path = str(a["path"])
    quoted = (
        path
        if re.fullmatch(r"[A-Za-z0-9_./:=@+,-]+", path)
        else "'" + path.replace("'", "'\"'\"'") + "'"
    )
    return [
        _called(BASH, {"command": f"ls {quoted}", "description": f"Lists files in {path}"}),
        f"Result of calling the {BASH} tool:\n{a['content']}",
    ]


def _edited_text_file(a: dict) -> list[str | None]:
    head = (
        f"Note: {a['filename']} was modified, either by the user or by a linter. This change "
        "was intentional, so make sure to take it into account as you proceed (ie. don't "
        "revert it unless the user asks you to). Don't tell the user this, since they are "
        "already aware."
    )
    if a["snippet"] == "":
        return [
            head + " The diff was omitted because other modified files in this turn already "
            "exceeded the snippet budget; use the Read tool if you need the current content."
        ]
    return [head + f" Here are the relevant changes (shown with line numbers):\n{a['snippet']}"]


def _plan_mode(a: dict) -> list[str | None]:
    if a.get("isSubAgent"):
        raise Unrendered("attachment type 'plan_mode' of a sub-agent")
    if a.get("customInstructions"):
        raise Unrendered("attachment type 'plan_mode' with custom instructions")
    path = a["planFilePath"]
    if a.get("reminderType") == "sparse":
        return [
            f"Plan mode still active (see full instructions earlier in conversation). Read-only "
            f"except plan file ({path}). Follow 5-phase workflow. End turns with {ASK} (for "
            f"clarifications) or {EXIT_PLAN} (for plan approval). Never ask about plan approval "
            "via text or AskUserQuestion."
        ]
    info = (
        f"A plan file already exists at {path}. You can read it and make incremental edits "
        "using the Edit tool."
        if a.get("planExists")
        else f"No plan file exists yet. You should create your plan at {path} using the Write tool."
    )
    return [_PLAN_FULL.replace("{plan_file_info}", info)]


def _plan_mode_exit(a: dict) -> list[str | None]:
    where = (
        f" The plan file is located at {a['planFilePath']} if you need to reference it."
        if a.get("planExists")
        else ""
    )
    return [
        "## Exited Plan Mode\n\nYou have exited plan mode. You can now make edits, run tools, "
        f"and take actions.{where}"
    ]


def _skill_listing(a: dict) -> list[str | None]:
    if not a.get("content"):
        return []
    return [f"The following skills are available for use with the Skill tool:\n\n{a['content']}"]


def _task_reminder(a: dict) -> list[str | None]:
    text = (
        "The task tools haven't been used recently. If you're working on tasks that would "
        "benefit from tracking progress, consider using TaskCreate to add new tasks and "
        "TaskUpdate to update task status (set to in_progress when starting, completed when "
        "done). Also consider cleaning up the task list if it has become stale. Only use "
        "these if relevant to the current work. This is just a gentle reminder - ignore if "
        "not applicable.\n"
    )
    items = "\n".join(f"#{t['id']}. [{t['status']}] {t['subject']}" for t in a["content"])
    if items:
        text += f"\n\nHere are the existing tasks:\n\n{items}"
    return [text]


def _todo_reminder(a: dict) -> list[str | None]:
    text = (
        "The TodoWrite tool hasn't been used recently. If you're working on tasks that would "
        "benefit from tracking progress, consider using the TodoWrite tool to track progress. "
        "Also consider cleaning up the todo list if has become stale and no longer matches "
        "what you are working on. Only use it if it's relevant to the current work. This is "
        "just a gentle reminder - ignore if not applicable.\n"
    )
    items = "\n".join(f"{i}. [{t['status']}] {t['content']}" for i, t in enumerate(a["content"], 1))
    if items:
        text += f"\n\nHere are the existing contents of your todo list:\n\n[{items}]"
    return [text]


def _hook_success(a: dict) -> list[str | None]:
    if a.get("hookEvent") not in ("SessionStart", "UserPromptSubmit", "UserPromptExpansion"):
        return []
    if a.get("content") in ("", None):
        return []
    return [f"{a['hookName']} hook success: {a['content']}"]


def _hook_additional_context(a: dict) -> list[str | None]:
    content = a["content"]
    if not content:
        return []
    text = "\n".join(content) if isinstance(content, list) else str(content)
    return [f"{a['hookName']} hook additional context: {text}"]


def _deferred_tools_delta(a: dict) -> list[str | None]:
    if a.get("removedNames") or a.get("needsAuthMcpServers") or a.get("pendingMcpServers"):
        raise Unrendered("attachment type 'deferred_tools_delta' with removed or pending servers")
    parts = []
    if a.get("addedLines"):
        parts.append(
            f"The following deferred tools are now available via {TOOL_SEARCH}. Their schemas "
            "are NOT loaded \u2014 calling them directly will fail with InputValidationError. "
            f'Use {TOOL_SEARCH} with query "select:<name>[,<name>...]" to load tool schemas '
            "before calling them:\n" + "\n".join(a["addedLines"])
        )
    readded = a.get("readdedNames") or []
    if readded:
        parts.append(
            f"{len(readded)} deferred tool{' is' if len(readded) == 1 else 's are'} available "
            "again (MCP server reconnected \u2014 names announced earlier in this "
            f"conversation): {_grouped(readded)}. Load via {TOOL_SEARCH} as before."
        )
    return ["\n\n".join(parts)] if parts else []


def _grouped(names: list[str]) -> str:
    """Tool names with ``mcp__<server>__*`` groups counted, sorted (Claude Code's list)."""
    counts: dict[str, int] = {}
    for name in names:
        key = "__".join(name.split("__")[:2]) + "__*" if name.startswith("mcp__") else name
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k} ({n})" if n > 1 else k for k, n in sorted(counts.items()))


def _agent_listing_delta(a: dict) -> list[str | None]:
    parts = []
    if a.get("addedLines"):
        head = (
            "Available agent types for the Agent tool:"
            if a.get("isInitial")
            else "New agent types are now available for the Agent tool:"
        )
        parts.append(head + "\n" + "\n".join(a["addedLines"]))
    if a.get("removedTypes"):
        parts.append(
            "The following agent types are no longer available:\n"
            + "\n".join(f"- {t}" for t in a["removedTypes"])
        )
        parts.append(AMBIENT)
    if a.get("isInitial") and a.get("showConcurrencyNote"):
        parts.append(
            "When you launch multiple agents for independent work, send them in a single "
            "message with multiple tool uses so they run concurrently."
        )
    return ["\n\n".join(parts) or "(no content)"]


def _mcp_instructions_delta(a: dict) -> list[str | None]:
    parts = []
    if a.get("addedBlocks"):
        parts.append(
            "# MCP Server Instructions\n\nThe following MCP servers have provided instructions "
            "for how to use their tools and resources:\n\n" + "\n\n".join(a["addedBlocks"])
        )
    if a.get("removedNames"):
        parts.append(
            "The following MCP servers have disconnected. Their instructions above no longer "
            "apply:\n" + "\n".join(a["removedNames"])
        )
        parts.append(AMBIENT)
    return ["\n\n".join(parts) or "(no content)"]


def _queued_command(a: dict) -> list[str | None]:
    if a.get("renderedByBatchHead"):
        return []
    origin = a.get("origin")
    kind = origin.get("kind") if isinstance(origin, dict) else None
    if a.get("batchedRelayPrompts") or a.get("commandMode") == "task-notification":
        raise Unrendered("attachment type 'queued_command' of a relay or task notification")
    if kind not in (None, "human", "auto-continuation") or not isinstance(a.get("prompt"), str):
        raise Unrendered(f"attachment type 'queued_command' from origin {kind!r}")
    return [
        f"The user sent a new message while you were working:\n{a['prompt']}\n\nIMPORTANT: "
        "After completing your current task, you MUST address the user's message above. Do "
        "not ignore it."
    ]


def _invoked_skills(a: dict) -> list[str | None]:
    if not a["skills"]:
        return []
    body = "\n\n---\n\n".join(
        f"### Skill: {s['name']}\nPath: {s['path']}\n\n{s['content']}" for s in a["skills"]
    )
    return [
        "The following skills were invoked EARLIER in this session (before the conversation "
        "was compacted), not on the current turn. They are shown here for context only so you "
        "remain aware of their guidelines.\n\nIMPORTANT: Do NOT re-execute these skills or "
        "perform their one-time setup actions (e.g., scheduling, creating files) again. The "
        '"## Input" sections below reflect the original arguments from when each skill was '
        "first invoked \u2014 they are NOT the user's current message. Only continue to "
        "apply ongoing behavioral guidelines from these skills where still relevant.\n\n" + body
    ]


def _task_status(a: dict) -> list[str | None]:
    desc, task = a["description"], a["taskId"]
    if a["status"] == "killed":
        return [f'Task "{desc}" ({task}) was stopped by the user.']
    if a["status"] == "running":
        raise Unrendered("attachment type 'task_status' of a running task")
    words = [f"Task {task}", f"(type: {a['taskType']})", f"(status: {a['status']})"]
    words.append(f"(description: {desc})")
    if a.get("deltaSummary"):
        words.append(f"Delta: {a['deltaSummary']}")
    if a.get("outputFilePath"):
        words.append(f"Read the output file to retrieve the result: {a['outputFilePath']}")
    else:
        words.append("You can check its output using the TaskOutput tool.")
    return [" ".join(words)]


def _text(template: str):
    """A renderer of one fixed text with ``{field}`` taken from the attachment."""
    return lambda a: [template.format(**a)]


_AUTO_MODE = (
    "## Auto Mode Active\n\nBias toward working without stopping for clarifying questions "
    "\u2014 when you'd normally pause to check, make the reasonable call and keep going; "
    "they'll redirect you if needed. If the user, a skill, or the shape of the task suggests "
    f"they want you to ask (with {ASK} or otherwise), do so. And even absent that signal, "
    "it's still fine to stop when you're genuinely blocked \u2014 unclear direction, missing "
    "input, a decision only they can make."
)

_PLAN_REENTRY = (
    "## Re-entering Plan Mode\n\nYou are returning to plan mode after having previously "
    "exited it. A plan file exists at {planFilePath} from your previous planning session.\n\n"
    "**Before proceeding with any new planning, you should:**\n1. Read the existing plan "
    "file to understand what was previously planned\n2. Evaluate the user's current request "
    "against that plan\n3. Decide how to proceed:\n   - **Different task**: If the user's "
    "request is for a different task\u2014even if it's similar or related\u2014start fresh "
    "by overwriting the existing plan\n   - **Same task, continuing**: If this is explicitly "
    "a continuation or refinement of the exact same task, modify the existing plan while "
    "cleaning up outdated or irrelevant sections\n4. Continue on with the plan process and "
    "most importantly you should always edit the plan file one way or the other before "
    f"calling {EXIT_PLAN}\n\nTreat this as a fresh planning session. Do not assume the "
    "existing plan is relevant without evaluating it first."
)

_RENDERERS = {
    "file": _file,
    "directory": _directory,
    "edited_text_file": _edited_text_file,
    "compact_file_reference": _text(
        "Note: {filename} was read before the last conversation was summarized, but the "
        "contents are too large to include. Use Read tool if you need to access it."
    ),
    "plan_mode": _plan_mode,
    "plan_mode_exit": _plan_mode_exit,
    "plan_mode_reentry": lambda a: [_PLAN_REENTRY.replace("{planFilePath}", a["planFilePath"])],
    "skill_listing": _skill_listing,
    "task_reminder": _task_reminder,
    "todo_reminder": _todo_reminder,
    "date_change": _text(
        "The date has changed. Today's date is now {newDate}. DO NOT mention this to the user "
        "explicitly because they are already aware."
    ),
    "hook_success": _hook_success,
    "hook_additional_context": _hook_additional_context,
    "hook_blocking_error": lambda a: [
        f"{a['hookName']} hook blocking error from command: "
        f'"{a["blockingError"]["command"]}": {a["blockingError"]["blockingError"]}'
    ],
    "hook_stopped_continuation": _text("{hookName} hook stopped continuation: {message}"),
    "deferred_tools_delta": _deferred_tools_delta,
    "agent_listing_delta": _agent_listing_delta,
    "mcp_instructions_delta": _mcp_instructions_delta,
    "nested_memory": lambda a: [
        f"Contents of {a['content']['path']}:\n\n{a['content']['content']}"
    ],
    "queued_command": _queued_command,
    "invoked_skills": _invoked_skills,
    "task_status": _task_status,
    "auto_mode": lambda a: [_AUTO_MODE],
    "auto_mode_exit": lambda a: [
        "## Exited Auto Mode\n\nYou have exited auto mode. The user may now want to interact "
        "more directly. You should ask clarifying questions when the approach is ambiguous "
        "rather than making assumptions."
    ],
    "budget_usd": _text("USD budget: ${used}/${total}; ${remaining} remaining"),
    "token_usage": _text("Token usage: {used}/{total}; {remaining} remaining"),
    "total_tokens_reminder": _text("{text}"),
    "critical_system_reminder": _text("{content}"),
    "ultrathink_effort": lambda a: [
        'The user included the keyword "ultrathink", requesting deeper reasoning on this '
        "turn. Reason as thoroughly as the task warrants."
    ],
    "ultra_effort_enter": lambda a: [
        "Ultracode is on: optimize for the most exhaustive, correct answer \u2014 not the "
        "fastest or cheapest. Use the Workflow tool on every substantive task; token cost is "
        "not a constraint. See the Workflow tool's **Ultracode** section and quality "
        "patterns. Solo only on conversational/trivial turns."
        if a.get("reminderType") == "full"
        else "Ultracode is still on \u2014 use the Workflow tool; see its Ultracode section."
    ],
    "ultra_effort_exit": lambda a: [
        "Ultracode is off \u2014 the Workflow tool's standard opt-in rule applies again."
    ],
    "opened_file_in_ide": _text(
        "The user opened the file {filename} in the IDE. This may or may not be related to "
        "the current task."
    ),
    "agent_mention": _text(
        'The user has expressed a desire to invoke the agent "{agentType}". Please invoke the '
        "agent appropriately, passing in the required context to it. "
    ),
    "plan_file_reference": _text(
        "A plan file exists from plan mode at: {planFilePath}\n\nPlan contents:\n\n"
        "{planContent}\n\nIf this plan is relevant to the current work and not already "
        "complete, continue working on it."
    ),
}
