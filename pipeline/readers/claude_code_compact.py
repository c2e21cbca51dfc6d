"""Claude Code's compaction call (``subagents/agent-acompact-*.jsonl``) joined to its session.

Claude Code writes the summary call of a compaction as a sidechain transcript whose
records carry ``agentId: "acompact-<hex>"``. The call is forked from the main
conversation: its input is the main messages at that moment plus the compaction
prompt, and the transcript records only what the session file does not already hold
(each record's ``parentUuid`` is the message before it in that input):

- messages of the main history the session file never wrote (Claude Code 2.1.39 wrote
  a PostToolUse hook's additional context only here: an ``isMeta`` user record whose
  parent is the tool result it followed);
- the compaction prompt (``Your task is to create a detailed summary…``), whose parent
  is the last main record before the ``compact_boundary``;
- the response: the summary as the model wrote it (``<analysis>…<summary>…``), with the
  call's ``usage`` (the whole main context: ~169k input tokens in a real session).

``join_compaction_calls`` moves such a conversation into the main one, so the call is
one ``kind: "summary"`` call whose context is the main history up to the boundary plus
the prompt, followed by the compaction rewrite it wrote: the shape of a summary call in
seam's own rollouts (``pipeline/simulate/compaction.py``), trained once, never a
sub-agent rollout of its own. The history messages it adds go where their parent is:
the main calls after them saw them too. A transcript that does not fit this shape
(several calls, a tool call, a parent that is not in the main conversation, no
boundary after it) stays a sub-agent rollout, as before.
"""

from __future__ import annotations

from pipeline.readers.claude_code_replay import SUMMARY_CALL, Entry, Thread

COMPACT_AGENT_PREFIX = "acompact-"


def join_compaction_calls(threads: dict[str, Thread]) -> None:
    """Join every compaction-call conversation that fits into ``threads["main"]`` (in place)."""
    main = threads.get("main")
    if main is None:
        return
    for key in [k for k, t in threads.items() if _is_compaction_call(t)]:
        if _join(main, threads[key]):
            del threads[key]


def _is_compaction_call(thread: Thread) -> bool:
    return str(thread.agent_id or "").startswith(COMPACT_AGENT_PREFIX)


def _uuids(entry: Entry) -> list[str]:
    records = entry.data["records"] if entry.kind == "call" else [entry.data.get("rec", entry.data)]
    return [str(r["uuid"]) for r in records if r.get("uuid")]


def _parent(entry: Entry) -> str | None:
    rec = entry.data["records"][0] if entry.kind == "call" else entry.data.get("rec", entry.data)
    return str(rec["parentUuid"]) if rec.get("parentUuid") else None


def _join(main: Thread, side: Thread) -> bool:
    """Insert ``side``'s history messages after their parents and its prompt and call
    right before the compaction they wrote; False (nothing changed) if it does not fit."""
    if not side.entries:
        return False
    *context, call = side.entries
    if (
        call.kind != "call"
        or not context
        or any(e.kind != "user" for e in context)
        or side.notes
        or _has_tool_use(call)
    ):
        return False
    prompt = context[-1]
    where = {u: i for i, e in enumerate(main.entries) for u in _uuids(e)}
    boundary = _boundary_of(main, str(_parent(prompt)))
    if boundary is None or _parent(call) not in _uuids(prompt):
        return False
    inserts: dict[int, list[Entry]] = {}  # main index → entries inserted right after it
    placed: dict[str, int] = {}  # side record uuid → the main index it went after
    for entry in context[:-1]:
        parent = str(_parent(entry))
        after = placed.get(parent, where.get(parent))
        if after is None or after >= boundary:
            return False
        after = _past_results(main, after)
        inserts.setdefault(after, []).append(entry)
        placed.update({u: after for u in _uuids(entry)})
    call.data[SUMMARY_CALL] = True
    inserts.setdefault(boundary - 1, []).extend([prompt, call])
    _insert(main, inserts)
    main.lines |= side.lines
    return True


def _has_tool_use(call: Entry) -> bool:
    for rec in call.data["records"]:
        content = (rec.get("message") or {}).get("content")
        if any(
            isinstance(b, dict) and b.get("type") == "tool_use"
            for b in (content if isinstance(content, list) else [])
        ):
            return True
    return False


def _boundary_of(main: Thread, parent: str) -> int | None:
    """The index of the ``compact`` entry this call wrote (its ``logicalParentUuid`` is
    the prompt's parent: both are the last message before the compaction), else None."""
    for i, entry in enumerate(main.entries):
        if entry.kind == "compact" and str(entry.data.get("logicalParentUuid")) == parent:
            return i
    return None


def _past_results(main: Thread, index: int) -> int:
    """A message placed after a call goes after that call's tool results (Claude Code
    sends a call's results right after it; anything else between would cut the pair)."""
    if main.entries[index].kind != "call":
        return index
    while index + 1 < len(main.entries) and main.entries[index + 1].kind == "result":
        index += 1
    return index


def _insert(main: Thread, inserts: dict[int, list[Entry]]) -> None:
    """Insert entries after the given indices; damage notes keyed by entry index move
    with the entries they name."""
    entries: list[Entry] = []
    moved: dict[int, int] = {}
    for i, entry in enumerate(main.entries):
        moved[i] = len(entries)
        entries.append(entry)
        entries.extend(inserts.get(i, ()))
    moved[len(main.entries)] = len(entries)
    main.notes = {moved[i]: notes for i, notes in main.notes.items()}
    main.entries = entries


# Claude Code after a compaction (read from the 2.1.197 bundle: the compaction's
# attachments and hook results): it re-reads the files read most recently (at most 5,
# 5,000 tokens each, 50,000 in all), and attaches the plan file, plan mode, the skills
# invoked, running sub-agents' status and the tool/agent/MCP listings, plus what the
# ``SessionStart`` hooks with matcher ``compact`` print. Versions that write
# ``attachment`` records log these (``claude_code_attachments`` renders them); older
# ones (2.1.39 and before) log none, so the first call after the compaction saw more
# than its log holds.
UNLOGGED_REATTACHMENTS = "unlogged_post_compaction_context"


def flag_unlogged_reattachments(threads: dict[str, Thread], writes_attachments: bool) -> None:
    """Each compaction of a session whose files hold no ``attachment`` record (its
    version does not write them) flags the segments from that compaction on."""
    if writes_attachments:
        return
    for thread in threads.values():
        for entry in thread.entries:
            if entry.kind == "compact" and entry.data.get("uuid"):
                thread.fidelity.append(
                    {
                        "reason": UNLOGGED_REATTACHMENTS,
                        "event_id": str(entry.data["uuid"]),
                        "detail": "Claude Code "
                        f"{thread.meta.get('version') or '(version unknown)'} re-attaches "
                        "recently read files, the plan, invoked skills and SessionStart "
                        "hook output after a compaction; this log records no attachments",
                    }
                )
