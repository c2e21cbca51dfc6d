"""Every parser of seam's command line, by command name ("build-rl", "gateway", ...)."""

from __future__ import annotations

import argparse

from pipeline.cli import build_parser


def all_parsers() -> dict[str, argparse.ArgumentParser]:
    """The top-level parser's sub-commands, walked depth first, keyed by their full name."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found[f"{prefix} {name}".strip()] = child
                    walk(f"{prefix} {name}", child)

    walk("", build_parser())
    return found
