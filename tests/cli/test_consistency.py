"""The command line is consistent (issue 24, item 10): every flag a command took before
the redesign is still accepted (``flags_before_issue24.json``, taken from the parser
before it); a renamed flag keeps its old name as a hidden alias that works and warns
once; one name means one thing (``--format`` is an input format, ``--max-length`` a
segment length, the build directory a positional argument); ``seam --help`` lists the
commands in the order of the work; the shell completion answers."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import COMMAND_MODULE, COMMAND_ORDER, aliases, build_parser, main
from tests.cli.parsers import all_parsers

BEFORE = json.loads((Path(__file__).parent / "flags_before_issue24.json").read_text())
ROOT = Path(__file__).resolve().parents[2]


def _visible(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def test_every_flag_of_before_the_redesign_is_still_accepted():
    parsers = all_parsers()
    for command, flags in BEFORE.items():
        accepted = {s for a in parsers[command]._actions for s in a.option_strings}
        assert set(flags) <= accepted, (command, set(flags) - accepted)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(aliases, "_WARNED", set())


@pytest.mark.parametrize(
    "old, new, dest, value",
    [
        (["build-rl", "x", "--out", "o", "--no-std"], ["--std", "none"], "std", "none"),
        (["build-sft", "x", "--out", "o", "--max-tokens", "7"], ["--max-length", "7"], "max_length", 7),
        (["judge", "x", "--max-tokens", "5"], ["--max-answer-tokens", "5"], "max_answer_tokens", 5),
        (["judge", "x", "--max-response-bytes", "1048576"], ["--max-response-mb", "1"], "max_response_mb", 1.0),
        (["simulate", "--n", "1", "--out", "o", "--format", "parquet"], ["--output-format", "parquet"], "format", "parquet"),
        (["train-step", "--shards", "b", "--model", "m"], ["b", "--model", "m"], "shards", "b"),
    ],
)  # fmt: skip
def test_a_deprecated_name_works_as_the_new_one_and_warns_once(old, new, dest, value, capsys):
    parser = build_parser()
    args = parser.parse_args(old)
    assert getattr(args, dest) == value
    err = capsys.readouterr().err
    assert err.count("is deprecated") == 1 and f"use {new[0]}" in err or "first argument" in err
    parser.parse_args(old)  # the same process: no second warning
    assert "deprecated" not in capsys.readouterr().err
    renamed = parser.parse_args([*old[: old.index(_old_flag(old))], *new, *_after(old)])
    if dest == "shards":
        assert renamed.dir == "b"
    else:
        assert getattr(renamed, dest) == value
    assert "deprecated" not in capsys.readouterr().err


OLD_NAMES = ("--no-std", "--max-tokens", "--max-response-bytes", "--format", "--shards")


def _old_flag(argv: list[str]) -> str:
    return next(a for a in argv if a in OLD_NAMES)


def _after(argv: list[str]) -> list[str]:
    flag = _old_flag(argv)
    i = argv.index(flag)
    takes = 0 if flag == "--no-std" else 1
    return argv[i + 1 + takes :]


def test_one_name_means_one_thing():
    parsers = all_parsers()
    for command, parser in parsers.items():
        visible = _visible(parser)
        assert not visible & (set(OLD_NAMES) - {"--format"}), command
        for action in parser._actions:  # --format: an input format (auto, canonical, a reader)
            if "--format" in action.option_strings and action.help != argparse.SUPPRESS:
                assert "auto" in action.help and "canonical" in action.help, command
    assert "--format" not in _visible(parsers["simulate"])
    assert {"--max-length"} <= _visible(parsers["build-sft"]) & _visible(parsers["export"])


# The commands that read a finished build; show and audit also take rollout inputs there.
READ_A_BUILD = {"stats", "sql", "show", "view", "report", "export", "train-step", "verify"}


def test_the_build_directory_is_always_the_first_argument():
    """Every command that reads a build takes it as its first positional argument, and
    no flag of any command names a build to read (train-step's --shards was one: it is a
    hidden alias now)."""
    takes_a_build = set()
    for command, parser in all_parsers().items():
        positional = [a for a in parser._actions if not a.option_strings and a.help]
        first = positional[0].help if positional else ""
        if first and first.startswith("A build directory"):
            takes_a_build.add(command)
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            assert action.dest not in ("dir", "build", "build_dir", "shards"), command
            assert not str(action.help).startswith(("A build directory", "The build")), (
                command,
                action.option_strings,
            )
    assert takes_a_build == READ_A_BUILD


def test_the_build_directory_is_positional_in_train_step(tmp_path, capsys):
    assert main(["train-step", "--model", "m"]) == 2
    assert (
        "seam train-step needs the build directory: seam train-step DIR" in capsys.readouterr().err
    )


def test_help_lists_the_commands_in_the_order_of_the_work(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("    ")]
    commands = [c for c in listed if c in COMMAND_ORDER]
    assert commands == COMMAND_ORDER
    assert set(all_parsers()) - {p for p in all_parsers() if " " in p} == set(COMMAND_ORDER)


def test_shell_completion_answers(tmp_path):
    """What bash's completion hook (``register-python-argcomplete seam``) asks."""
    out = tmp_path / "completions"
    line = "seam build-rl --mask"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    subprocess.run([sys.executable, "-m", "pipeline.cli"], env=env, cwd=ROOT, timeout=120)
    assert [c.strip() for c in out.read_text().split("\x0b")] == ["--mask-summaries"]


@pytest.mark.parametrize(
    "flags, use_std, ddof",
    [
        ([], True, 0),
        (["--std", "sample"], True, 1),
        (["--std", "none"], False, 0),
        (["--no-std"], False, 0),
    ],
)
def test_std_is_one_flag_with_the_config_of_before(flags, use_std, ddof):
    """``--std none`` (was ``--no-std``) builds the config ``--no-std`` built, so the
    fingerprint of such a build is unchanged."""
    from pipeline.cli.build_rl import config_from_args

    args = build_parser().parse_args(["build-rl", "x", "--out", "o", "--workers", "1", *flags])
    config = config_from_args(args, "rl")
    assert (config.use_std, config.std_ddof) == (use_std, ddof)


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_a_command_line_imports_only_its_commands_module_and_parses_the_same():
    """``main`` builds the parser of the named command alone (``build_parser(command)``):
    ``COMMAND_MODULE`` names, for every command, the module that registers it, and that
    command's parser (its help, its defaults) is the one the full parser holds."""
    full = _commands(build_parser())
    assert set(COMMAND_MODULE) == set(full)
    for command in full:
        alone = _commands(build_parser(command))
        assert command in alone and len(alone) < len(full)
        assert alone[command].format_help() == full[command].format_help()
        defaults = [
            [(a.dest, a.default, a.option_strings) for a in p._actions] + [p._defaults]
            for p in (alone[command], full[command])
        ]
        assert defaults[0] == defaults[1]
    argv = ["build-rl", "in.jsonl", "--out", "o", "--workers", "1", "--verify", "none"]
    assert build_parser("build-rl").parse_args(argv) == build_parser().parse_args(argv)
    # Not a command's exact name (a typo, an option first): every command, as before.
    assert set(_commands(build_parser("build"))) == set(full)
