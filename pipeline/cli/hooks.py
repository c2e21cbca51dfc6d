"""``seam hooks``: install harness hooks that capture compactions, and the capture itself.

``seam hooks install claude-code [--capture DIR]`` adds a PreCompact (and, where the
installed Claude Code has it, PostCompact) hook to a Claude Code settings file;
``seam hooks capture claude-code --capture DIR`` is the command that hook runs
(``pipeline/hooks/claude_code.py``); ``seam hooks uninstall claude-code`` removes the
entries seam installed and nothing else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.common.errors import UsageError

SCOPES = {
    "user": Path("~/.claude/settings.json"),
    "project": Path(".claude/settings.json"),
    "local": Path(".claude/settings.local.json"),
}
DEFAULT_CAPTURE = "~/.seam/captures/claude-code"


def run_install(args) -> int:
    from pipeline.hooks.claude_code import (
        HOOK_EVENTS,
        POST_COMPACT_SINCE,
        capture_command,
        install,
        installed_version,
    )

    settings = _settings_path(args)
    capture_dir = Path(args.capture).expanduser().resolve()
    version = installed_version()
    post = args.post_compact
    if post is None:
        post = version is not None and version >= POST_COMPACT_SINCE
    events = HOOK_EVENTS if post else HOOK_EVENTS[:1]
    blocked = next((p for p in (capture_dir, *capture_dir.parents) if p.exists()), None)
    if blocked is not None and not blocked.is_dir():
        raise UsageError(f"--capture {capture_dir}: {blocked} is not a directory")
    status = install(settings, capture_command(capture_dir), events, force=args.force)
    try:  # after the settings: a refused install creates nothing
        capture_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--capture {capture_dir}: {exc.strerror or exc}") from None
    found = ".".join(map(str, version)) if version else "not found"
    print(f"Claude Code: {found}; settings: {settings}; captures: {capture_dir}")
    for event, what in status.items():
        print(f"  {event}: {what}")
    if not post:
        print(
            "  PostCompact: not installed (needs Claude Code "
            f"{'.'.join(map(str, POST_COMPACT_SINCE))}+; --post-compact installs it anyway)"
        )
    return 0


def run_uninstall(args) -> int:
    from pipeline.hooks.claude_code import uninstall

    settings = _settings_path(args)
    status = uninstall(settings, force=args.force)
    print(f"settings: {settings}")
    for event, what in status.items():
        print(f"  {event}: {what}")
    if not status:
        print("  no hook seam installed was found; nothing changed")
    return 0


def _settings_path(args) -> Path:
    return Path(args.settings or SCOPES[args.scope]).expanduser()


def run_capture(args) -> int:
    """Never fails the hook: Claude Code must compact whatever happens here. Prints
    nothing on stdout (a PreCompact hook's stdout becomes the summarizer's instructions)."""
    from pipeline.hooks.claude_code import CaptureError, capture

    try:
        hook_input = json.loads(sys.stdin.read() or "{}")
        if not isinstance(hook_input, dict):
            raise ValueError("hook input is not a JSON object")
        capture(hook_input, Path(args.capture).expanduser())
    except CaptureError as exc:
        print(f"seam hooks capture: refused: {exc}", file=sys.stderr)
    except Exception as exc:  # a capture must never block a compaction
        print(f"seam hooks capture: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "hooks",
        help="Install harness hooks that snapshot sessions at every compaction.",
        description="Install hooks into an agent harness so that each compaction leaves a "
        "snapshot of the session (transcript, trigger, custom instructions) in a capture "
        "folder; pass that folder to seam with the session files. See docs/readers.md.",
    )
    hooks_sub = p.add_subparsers(dest="hooks_command", metavar="ACTION", required=True)
    install = hooks_sub.add_parser(
        "install",
        help="Add the capture hook to a Claude Code settings file (merged, never clobbered; "
        "a symlink is followed, the mode kept, a read-only file refused without --force).",
    )
    install.add_argument("harness", choices=["claude-code"])
    install.add_argument(
        "--capture",
        default=DEFAULT_CAPTURE,
        metavar="DIR",
        help=f"Where snapshots go (default {DEFAULT_CAPTURE}).",
    )
    _settings_options(install)
    post = install.add_mutually_exclusive_group()
    post.add_argument(
        "--post-compact",
        dest="post_compact",
        action="store_true",
        default=None,
        help="Also install the PostCompact hook (default: when `claude --version` is 2.1.76+).",
    )
    post.add_argument("--no-post-compact", dest="post_compact", action="store_false")
    install.set_defaults(func=run_install)
    remove = hooks_sub.add_parser(
        "uninstall",
        help="Remove the hook entries seam installed from a Claude Code settings file "
        "(only those; other hooks are kept).",
    )
    remove.add_argument("harness", choices=["claude-code"])
    _settings_options(remove)
    remove.set_defaults(func=run_uninstall)
    cap = hooks_sub.add_parser(
        "capture",
        help="The hook command: read the hook's JSON on stdin, snapshot into DIR.",
    )
    cap.add_argument("harness", choices=["claude-code"])
    cap.add_argument("--capture", required=True, metavar="DIR")
    cap.set_defaults(func=run_capture)


def _settings_options(parser) -> None:
    parser.add_argument(
        "--scope",
        choices=sorted(SCOPES),
        default="user",
        help="Which settings file: user (~/.claude/settings.json, every session; default), "
        "project (.claude/settings.json) or local (.claude/settings.local.json).",
    )
    parser.add_argument("--settings", metavar="PATH", help="Another settings file.")
    parser.add_argument(
        "--force",
        action="store_true",
        help="Rewrite a settings file whose mode says read-only (0444; it keeps that mode) "
        "or unreadable. A directory, an immutable file or a file this user cannot read is "
        "refused even so.",
    )
