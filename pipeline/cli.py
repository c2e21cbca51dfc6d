"""``seam``: the command line. Each subcommand lives in its own module under
``pipeline/commands/`` (or its package) and exposes ``register(subparsers)``, which
adds a parser whose ``func`` default runs the command and returns an exit code."""

from __future__ import annotations

import argparse
import importlib
import sys

from pipeline.errors import UsageError

COMMAND_MODULES = [
    "pipeline.commands.schema",
    "pipeline.commands.build_rl",
    "pipeline.commands.ingest",
    "pipeline.commands.stats",
    "trainer.commands",
    "judge.commands",
    "pipeline.commands.sql",
    "pipeline.commands.report",
    "pipeline.commands.export",
    "pipeline.commands.simulate",
    "pipeline.commands.gateway",
    "pipeline.commands.verify",
    "pipeline.commands.show",
    "pipeline.commands.view",
    "pipeline.commands.hooks",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seam",
        description="Turn raw agent rollouts with compactions into training shards: "
        "find seams, cut segments, tokenize once, mask, attach advantages or corrections, write Parquet.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"seam {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"seam {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
