# PYTHON_ARGCOMPLETE_OK
"""``seam``: the command line. Each subcommand lives in its own module under
``pipeline/cli/`` (or its package) and exposes ``register(subparsers)``, which
adds a parser whose ``func`` default runs the command and returns an exit code.
``seam --help`` lists the commands in ``COMMAND_ORDER`` (the order of the work: build,
check, look, use), not in import order. Shell completion: argcomplete
(``eval "$(register-python-argcomplete seam)"``, README "Command line")."""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import select
import signal
import sys
import threading
from typing import NoReturn

from pipeline import __version__
from pipeline.common import extras
from pipeline.common.errors import SeamError
from pipeline.inspect.show.audits import register_call_audit

# The judge library's summary audit, printed by ``seam show``/``view`` under each summary
# call: plugged in here (as a judge is into the gateway), so the inspect layer imports no
# judge code. ``import seam`` plugs in the same.
register_call_audit("summary", "judge.audit:call_findings")

# How ``seam --help`` lists the commands: build, check and inspect a build, use it, then
# the tools around it. A command missing here is listed last.
COMMAND_ORDER = [
    "build-rl",
    "build-sft",
    "ingest",
    "verify",
    "stats",
    "sql",
    "show",
    "view",
    "report",
    "export",
    "train-step",
    "make-tiny-model",
    "judge",
    "audit",
    "simulate",
    "gateway",
    "hooks",
    "schema",
]


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread like SIGINT's KeyboardInterrupt, so
    the same cleanup runs (temporary files removed, the lock released and unlinked)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _terminate(signum, frame):
    raise Terminated(signum)


def handle_termination() -> None:
    """Treat SIGTERM and SIGHUP like SIGINT (worker processes restore the defaults)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate)


# The module that registers each command (tests/cli/test_consistency.py checks it against
# what the modules register): ``main`` imports only the named command's module, and
# ``seam --help`` or completion every module of it, once each.
COMMAND_MODULE = {
    "schema": "pipeline.cli.schema",
    "build-rl": "pipeline.cli.build_rl",
    "build-sft": "pipeline.cli.judge",
    "ingest": "pipeline.cli.ingest",
    "stats": "pipeline.cli.stats",
    "train-step": "pipeline.cli.train",
    "make-tiny-model": "pipeline.cli.train",
    "judge": "pipeline.cli.judge",
    "audit": "pipeline.cli.judge",
    "sql": "pipeline.cli.sql",
    "report": "pipeline.cli.report",
    "export": "pipeline.cli.export",
    "simulate": "pipeline.cli.simulate",
    "gateway": "pipeline.cli.gateway",
    "verify": "pipeline.cli.verify",
    "show": "pipeline.cli.show",
    "view": "pipeline.cli.view",
    "hooks": "pipeline.cli.hooks",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``seam`` parser with every command; with ``command`` (a command's exact name,
    the first argument of its command line), only the module registering that command is
    imported and registered: a build starts ~0.15 s CPU sooner than after importing all
    fifteen (the gateway's asyncio, the judge's and the trainer's options...), and its
    command line parses the same."""
    parser = argparse.ArgumentParser(
        prog="seam",
        description="Turn raw agent rollouts with compactions into training shards: "
        "find seams, cut segments, tokenize once, mask, attach advantages or corrections, write Parquet.",
    )
    parser.add_argument("--version", action="version", version=f"seam {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Every module once, in the table's order, when no single command is named.
    modules = (
        [COMMAND_MODULE[command]]
        if command in COMMAND_MODULE
        else dict.fromkeys(COMMAND_MODULE.values())
    )
    for name in modules:
        importlib.import_module(name).register(sub)
    # The help lists the commands in the order of ``_choices_actions`` (argparse's list
    # of the sub-commands' help lines).
    rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
    sub._choices_actions.sort(key=lambda a: rank.get(a.dest, len(rank)))
    return parser


# The build commands: ``entry`` ends them without Python's teardown.
BUILD_COMMANDS = ("build-rl", "build-sft")


def entry() -> NoReturn:
    """The process entry (``seam``, ``python -m pipeline.cli``): ``main``, then exit.

    A build command that returns its status (done, or failed with its one-line error)
    ends without Python's teardown: deallocating the tokenizer, Arrow's buffers and every
    module's objects cost 0.3-0.6 s of CPU after the work was done. By then its files are
    closed, and here the atexit handlers run and the output is flushed, as at a normal
    exit; only when no other thread is alive (one would be cut off). Every other command,
    and a build that raised (argparse's usage errors, a traceback), exits the normal way."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in BUILD_COMMANDS and threading.active_count() == 1:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args_given = sys.argv[1:] if argv is None else argv
    # Shell completion asks about any command: it gets them all.
    completing = "_ARGCOMPLETE" in os.environ
    parser = build_parser(None if completing or not args_given else args_given[0])
    _complete(parser)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    handle_termination()
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that left shows up here, not at exit
        return code
    except BrokenPipeError:
        if not _stdout_reader_left():
            raise  # another pipe broke: its traceback names it
        return _quiet_exit_after_sigpipe()
    except extras.MissingExtra as exc:  # a SeamError whose message is the whole line
        print(exc, file=sys.stderr)
        return exc.exit_code
    except SeamError as exc:  # every error written for the user, caught here only
        print(f"seam {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        # An optional library imported past the command's own check: still one line.
        extra = extras.extra_providing(exc.name)
        if extra is None:
            raise  # a core module is missing: a broken install, its traceback says which
        print(extras.MissingExtra(args.command, extra), file=sys.stderr)
        return 2
    except Terminated as exc:
        name = signal.Signals(exc.signum).name
        print(f"seam {args.command}: terminated ({name})", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"seam {args.command}: interrupted", file=sys.stderr)
        return 130


def _complete(parser: argparse.ArgumentParser) -> None:
    """Answer a shell's completion request (argcomplete: only when the shell hook set
    ``_ARGCOMPLETE``; it prints the completions and exits) and return otherwise."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(parser)


def _stdout_reader_left() -> bool:
    """Whether fd 1 is a pipe or socket whose reader is gone (poll reports an error or a
    hang-up on it)."""
    poller = select.poll()
    poller.register(1, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _quiet_exit_after_sigpipe() -> int:
    """The reader of stdout left (``seam schema | head``): stop quietly with the status of
    a tool killed by SIGPIPE, 128 + 13. Python ignores SIGPIPE, so the write raised
    instead; fd 1 is pointed at /dev/null so that the interpreter's final flush of what
    is still buffered does not raise again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    return 141


if __name__ == "__main__":
    entry()
