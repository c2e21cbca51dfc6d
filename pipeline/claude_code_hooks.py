"""Claude Code compaction hooks: install them into ``settings.json`` and capture what
they receive, so the history before every compaction survives later slicing or pruning.

Claude Code runs a ``PreCompact`` hook just before it compacts (``trigger``: ``manual``
for ``/compact``, ``auto`` at its budget) and, since 2.1.76, a ``PostCompact`` hook after
(with the ``compact_summary``). Each gets one JSON object on stdin (Claude Code's hook
documentation): ``session_id``, ``transcript_path``, ``cwd``, ``hook_event_name``,
``trigger``, and ``custom_instructions`` (PreCompact: the text after ``/compact``, empty
or null otherwise) or ``compact_summary`` (PostCompact). A PreCompact hook's stdout is
passed to the summarizer as custom instructions, so the capture prints nothing.

A capture writes, under ``DIR/<session_id>/``, ``<stamp>-<event>.jsonl`` (a copy of the
transcript at that moment: a Claude Code session file like any other, merged with the
session's other files by record ``uuid``) and ``<stamp>-<event>.capture`` (JSON: the hook
input plus what was copied; its suffix keeps it out of seam's input files). The Claude
Code reader joins these to the compactions they precede
(``pipeline/readers/claude_code_captures.py``).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from pipeline import atomic

HOOK_EVENTS = ("PreCompact", "PostCompact")
POST_COMPACT_SINCE = (2, 1, 76)  # the first Claude Code release with a PostCompact hook
CAPTURE_SUFFIX = ".capture"
_MARK = "hooks capture claude-code"  # how an installed seam capture command is recognised
_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


class SettingsError(ValueError):
    """A settings file seam will not rewrite (not JSON, or not the expected shape)."""


def capture_command(capture_dir: Path, seam: str | None = None) -> str:
    """The shell command Claude Code runs at each hook: this seam, capturing into DIR."""
    program = seam or shutil.which("seam")
    parts = [program] if program else [sys.executable, "-m", "pipeline.cli"]
    return " ".join(
        shlex.quote(p)
        for p in [*parts, "hooks", "capture", "claude-code", "--capture", str(capture_dir)]
    )


def installed_version(claude: str = "claude") -> tuple[int, int, int] | None:
    """The installed Claude Code CLI's version (``claude --version``), or None."""
    program = shutil.which(claude)
    if program is None:
        return None
    try:
        out = subprocess.run(
            [program, "--version"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = _VERSION_RE.search(out)
    return tuple(int(g) for g in found.groups()) if found else None  # type: ignore[return-value]


def install(settings_path: Path, command: str, events: tuple[str, ...]) -> dict[str, str]:
    """Add the capture ``command`` to ``events`` in a Claude Code settings file, keeping
    everything else in it. An earlier seam capture entry (e.g. another capture folder)
    is replaced; nothing else is touched. Returns ``{event: added|updated|unchanged}``.
    The file is written atomically and only when something changed."""
    settings: dict = {}
    if settings_path.exists():
        try:
            settings = json.loads(settings_path.read_text() or "{}")
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{settings_path} is not JSON ({exc}); fix it first") from None
    if not isinstance(settings, dict):
        raise SettingsError(f"{settings_path} does not hold a JSON object")
    hooks = settings.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise SettingsError(f"{settings_path}: 'hooks' is not an object")
    status = {}
    for event in events:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise SettingsError(f"{settings_path}: hooks.{event} is not a list")
        ours = {"type": "command", "command": command, "timeout": 60}
        if any(h == ours for g in groups if isinstance(g, dict) for h in g.get("hooks", [])):
            status[event] = "unchanged"
            continue
        replaced = False
        for group in groups:
            if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                kept = [h for h in group["hooks"] if _MARK not in str(h.get("command", ""))]
                replaced |= len(kept) != len(group["hooks"])
                group["hooks"] = kept
        groups[:] = [g for g in groups if not (isinstance(g, dict) and g.get("hooks") == [])]
        groups.append({"hooks": [ours]})
        status[event] = "updated" if replaced else "added"
    if any(s != "unchanged" for s in status.values()):
        settings_path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(settings_path, json.dumps(settings, indent=2) + "\n")
    return status


def capture(hook_input: dict, capture_dir: Path, now: datetime | None = None) -> Path:
    """Snapshot one hook call: the transcript as it is now and the hook's input. Returns
    the ``.capture`` file written."""
    session = str(hook_input.get("session_id") or "unknown-session")
    event = str(hook_input.get("hook_event_name") or "PreCompact")
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S%fZ")
    folder = capture_dir / _safe(session)
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / f"{stamp}-{_safe(event)}"
    record = {
        "event": event,
        "session_id": session,
        "trigger": hook_input.get("trigger"),
        "custom_instructions": hook_input.get("custom_instructions") or None,
        "compact_summary": hook_input.get("compact_summary"),
        "cwd": hook_input.get("cwd"),
        "captured_at": stamp,
        "transcript_path": hook_input.get("transcript_path"),
        "transcript": None,
        "hook_input": hook_input,
    }
    source = Path(str(hook_input.get("transcript_path") or ""))
    if source.is_file():
        copy = base.with_suffix(".jsonl")
        shutil.copyfile(source, copy)
        data = copy.read_bytes()
        lines = [ln for ln in data.splitlines() if ln.strip()]
        last = _last_uuid(lines)
        record["transcript"] = {
            "file": copy.name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "records": len(lines),
            "last_uuid": last,
        }
    out = base.with_suffix(CAPTURE_SUFFIX)
    out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return out


def _last_uuid(lines: list[bytes]) -> str | None:
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("uuid"):
            return str(rec["uuid"])
    return None


def _safe(name: str) -> str:
    """A file-name-safe version of an id (session ids are UUIDs; anything else is cleaned)."""
    return re.sub(r"[^\w.-]", "_", name)[:120] or "_"
