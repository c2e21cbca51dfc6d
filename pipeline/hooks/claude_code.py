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
import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from pipeline.common.errors import SeamError
from pipeline.hooks import json_exact, settings_file

HOOK_EVENTS = ("PreCompact", "PostCompact")
POST_COMPACT_SINCE = (2, 1, 76)  # the first Claude Code release with a PostCompact hook
CAPTURE_SUFFIX = ".capture"
# The mark of an entry seam installed: a field of Claude Code's command-hook schema (the
# spinner text while the hook runs), so the settings file stays valid for editors that
# check it against the schema (additionalProperties: false), and no user hook carries it.
STATUS_MARK = "seam hooks capture: saving a snapshot of this session"
HOOK_TIMEOUT_S = 60
_CAPTURE_ARGS = ["hooks", "capture", "claude-code", "--capture"]  # then the folder
_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.(\d+)")
# A session id becomes a folder name: one plain path component, never ".", ".." or a
# hidden name (Claude Code's ids are UUIDs).
_SESSION_ID_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


class SettingsError(SeamError, ValueError):
    """A settings file seam will not rewrite; the message is one line saying why."""


class CaptureError(SeamError, ValueError):
    """Hook input a capture refuses (an id that would be a path)."""


def seam_program(argv0: str | None = None, python: str | None = None) -> list[str]:
    """The command line that runs this seam, for a hook that runs in any directory.

    The seam script that is running (``sys.argv[0]``) or the ``seam`` console script of
    this interpreter's environment, as an absolute path (its Python does not put the
    working directory on ``sys.path``). Without either, this interpreter in isolated
    mode (``-I``: no working directory, ``PYTHONPATH`` or user site on ``sys.path``)
    importing ``pipeline`` from this seam's own folder, put first on ``sys.path``; never
    ``python -m pipeline.cli``, which inside a project with its own ``pipeline/``
    package runs that project's code.
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    python = python or sys.executable
    for script in (Path(argv0), Path(python).parent / "seam"):
        if script.name == "seam" and script.is_file() and os.access(script, os.X_OK):
            return [str(script.absolute())]
    root = str(Path(__file__).resolve().parents[2])
    guard = (
        f"import sys; sys.path.insert(0, {root!r}); from pipeline.cli import main; sys.exit(main())"
    )
    return [str(Path(python).absolute()), "-I", "-c", guard]


def capture_command(capture_dir: Path, program: list[str] | None = None) -> str:
    """The shell command Claude Code runs at each hook: this seam, capturing into DIR."""
    parts = [*(program or seam_program()), *_CAPTURE_ARGS, str(capture_dir)]
    return " ".join(shlex.quote(p) for p in parts)


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


def seam_entry(command: str) -> dict:
    """The hook entry seam installs for ``command``."""
    return {
        "type": "command",
        "command": command,
        "timeout": json_exact.Number(str(HOOK_TIMEOUT_S)),
        "statusMessage": STATUS_MARK,
    }


def is_seam_entry(hook: object) -> bool:
    """Whether a hook entry is one seam installed, and only then.

    This seam's: ``statusMessage`` is ``STATUS_MARK`` and the command is a capture
    command (a program given by absolute path, ``hooks capture claude-code --capture
    DIR`` and nothing after). An earlier seam's (before the mark): exactly the keys
    ``type``, ``command`` and ``timeout`` 60, and a command equal, byte for byte, to
    what it wrote: the absolute path of a ``seam`` script, or an absolute Python with
    ``-m pipeline.cli``, then the capture arguments, shell-quoted. A user's hook that
    merely contains ``seam hooks capture claude-code`` (``... && notify``, another
    timeout, a relative ``seam``) is neither.
    """
    if not isinstance(hook, dict) or hook.get("type") != "command":
        return False
    command = hook.get("command")
    if not isinstance(command, str):
        return False
    if hook.get("statusMessage") == STATUS_MARK:
        return _capture_program(command) is not None
    if set(hook) != {"type", "command", "timeout"}:
        return False
    timeout = hook["timeout"]
    if timeout != json_exact.Number(str(HOOK_TIMEOUT_S)) and not (
        type(timeout) is int and timeout == HOOK_TIMEOUT_S
    ):
        return False
    program = _capture_program(command)
    if program is None or " ".join(shlex.quote(t) for t in shlex.split(command)) != command:
        return False
    if len(program) == 1:
        return Path(program[0]).name == "seam"
    return program[1:] == ["-m", "pipeline.cli"]


def _capture_program(command: str) -> list[str] | None:
    """The program part of a capture command (tokens before ``hooks capture
    claude-code --capture DIR``, the first an absolute path), or None."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        return None
    n = len(_CAPTURE_ARGS)
    if len(tokens) < n + 2 or tokens[-n - 1 : -1] != _CAPTURE_ARGS:
        return None
    program, folder = tokens[: -n - 1], tokens[-1]
    if not (os.path.isabs(program[0]) and os.path.isabs(folder)):
        return None
    return program


def install(
    settings_path: Path, command: str, events: tuple[str, ...], force: bool = False
) -> dict[str, str]:
    """Add the capture ``command`` to ``events`` in a Claude Code settings file, keeping
    every other value in it as it was (numbers keep their text; the layout becomes a
    two-space indent). Seam's earlier entries (``is_seam_entry``: e.g. another capture
    folder) are replaced; nothing else is touched. Returns ``{event: added|updated|
    unchanged}``. The file is written (``pipeline/hooks/settings_file.py``: symlinks followed,
    mode kept, atomic) only when something changed."""
    ours = seam_entry(command)

    def edit(hooks: dict) -> dict[str, str]:
        status = {}
        for event in events:
            groups = _groups(hooks, event, settings_path)
            found = [h for g in groups for h in _entries(g) if is_seam_entry(h)]
            if found == [ours]:
                status[event] = "unchanged"
                continue
            _remove_seam_entries(groups)
            groups.append({"hooks": [ours]})
            status[event] = "updated" if found else "added"
        return status

    return _edit_settings(settings_path, edit, force, unchanged="unchanged")


def uninstall(settings_path: Path, force: bool = False) -> dict[str, str]:
    """Remove seam's hook entries (``is_seam_entry``) from every event; returns
    ``{event: removed}`` for the events that had one."""

    def edit(hooks: dict) -> dict[str, str]:
        status = {}
        for event in list(hooks):
            groups = hooks[event]
            if isinstance(groups, list) and _remove_seam_entries(groups):
                status[event] = "removed"
                if not groups:
                    del hooks[event]
        return status

    return _edit_settings(settings_path, edit, force, unchanged=None)


def _edit_settings(settings_path: Path, edit, force: bool, unchanged: str | None) -> dict:
    """Read, ``edit(hooks)`` and write back when the returned status says something
    changed (anything but ``unchanged``; nothing at all for an uninstall)."""
    try:
        current = settings_file.read(settings_path, force)
    except settings_file.SettingsFileError as exc:
        raise SettingsError(str(exc)) from None
    text = current.text
    try:
        settings = json_exact.loads(text) if text and text.strip() else {}
    except json_exact.JSONError as exc:
        raise SettingsError(f"{settings_path} is not JSON ({exc}); fix it first") from None
    if not isinstance(settings, dict):
        raise SettingsError(f"{settings_path} does not hold a JSON object")
    had_hooks = "hooks" in settings
    hooks = settings.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise SettingsError(f"{settings_path}: 'hooks' is not an object")
    status = edit(hooks)
    if not had_hooks and not hooks:
        del settings["hooks"]
    if any(s != unchanged for s in status.values()):
        try:
            current.write(json_exact.dumps(settings) + "\n")
        except settings_file.SettingsFileError as exc:
            raise SettingsError(str(exc)) from None
    return status


def _groups(hooks: dict, event: str, settings_path: Path) -> list:
    groups = hooks.setdefault(event, [])
    if not isinstance(groups, list):
        raise SettingsError(f"{settings_path}: hooks.{event} is not a list")
    return groups


def _entries(group: object) -> list:
    hooks = group.get("hooks") if isinstance(group, dict) else None
    return hooks if isinstance(hooks, list) else []


def _remove_seam_entries(groups: list) -> int:
    """Remove seam's entries from ``groups`` in place, and a group left empty by that
    (a group that was empty before stays). Returns how many entries went."""
    removed = 0
    for group in list(groups):
        entries = _entries(group)
        kept = [h for h in entries if not is_seam_entry(h)]
        if len(kept) == len(entries):
            continue
        removed += len(entries) - len(kept)
        if kept:
            group["hooks"] = kept
        else:
            groups.remove(group)
    return removed


def capture(hook_input: dict, capture_dir: Path, now: datetime | None = None) -> Path:
    """Snapshot one hook call: the transcript as it is now and the hook's input. Returns
    the ``.capture`` file written."""
    session = str(hook_input.get("session_id") or "unknown-session")
    if not _SESSION_ID_RE.fullmatch(session):
        raise CaptureError(
            f"session_id {session[:80]!r} is not a plain id (letters, digits, '.', '_', "
            "'-'; not starting with '.'); nothing captured"
        )
    event = str(hook_input.get("hook_event_name") or "PreCompact")
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S%fZ")
    folder = capture_dir / session
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
    """A file-name-safe version of a hook event name (it follows a stamp in a file name)."""
    return re.sub(r"[^\w.-]", "_", name)[:120] or "_"
