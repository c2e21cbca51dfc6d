"""One ``SeamError`` base, caught once in ``seam``'s ``main``: every error written for
the user ends the command with one line and exit code 2, and no command module
translates them by hand any more."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.common.errors import SeamError, UsageError

ROOT = Path(__file__).resolve().parents[2]


def _user_facing_errors():
    from judge.chat_client import ChatError
    from pipeline.build.out_dir import OutDirError
    from pipeline.build.run import BuildError
    from pipeline.core.render import TemplateError
    from pipeline.core.tokenizer import TokenizerError
    from pipeline.export import ExportError
    from pipeline.gateway.dialects import DialectError
    from pipeline.gateway.recorder import RecorderError
    from pipeline.hooks.claude_code import CaptureError, SettingsError
    from pipeline.hooks.json_exact import JSONError
    from pipeline.hooks.settings_file import SettingsFileError
    from pipeline.inspect.duckdb_views import BuildDirError
    from pipeline.inspect.show.load import ShowError
    from pipeline.inspect.verify import VerifyError
    from pipeline.inspect.view_filter import FilterError
    from pipeline.readers.detect import FormatError
    from pipeline.readers.rewards import RewardsError
    from pipeline.sources.files import InputError

    return [
        BuildDirError, BuildError, CaptureError, ChatError, DialectError, ExportError,
        FilterError, FormatError, InputError, JSONError, OutDirError, RecorderError,
        RewardsError, SettingsError, SettingsFileError, ShowError, TemplateError,
        TokenizerError, UsageError, VerifyError,
    ]  # fmt: skip


def test_every_user_facing_error_is_a_seam_error():
    for cls in _user_facing_errors():
        assert issubclass(cls, SeamError), cls
        assert cls.exit_code == 2


@pytest.mark.parametrize(
    "argv, says",
    [
        (["sql", "{d}/nope", "select 1"], "is not a directory"),  # BuildDirError
        (["export", "{d}", "--to", "trl", "--out", "{d}/o"], "has no manifest.json"),  # ExportError
        (["build-rl", "{d}/nope", "--out", "{d}/o"], "does not exist"),  # InputError
        (["verify", "{d}"], "has no manifest.json"),  # VerifyError
    ],
)
def test_one_line_and_exit_2(tmp_path, capsys, argv, says):
    code = main([a.format(d=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"seam {argv[0]}: error: ") and says in err
    assert err.count("\n") == 1  # one line, no traceback


def test_no_command_module_translates_a_seam_error():
    """``raise UsageError(str(exc))`` around a SeamError is what main does once; a
    command module that catches one of them to re-raise it as a UsageError is a copy."""
    names = {cls.__name__ for cls in _user_facing_errors()} - {"UsageError"}
    modules = [*ROOT.glob("pipeline/**/commands/**/*.py"), *ROOT.glob("*/commands.py")]
    modules += [*ROOT.glob("judge/*command*.py"), *ROOT.glob("pipeline/cli/**/*.py")]
    assert modules
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ExceptHandler) or node.type is None:
                continue
            caught = [node.type] if not isinstance(node.type, ast.Tuple) else node.type.elts
            caught_names = {getattr(c, "id", getattr(c, "attr", None)) for c in caught}
            raises = [n for n in ast.walk(node) if isinstance(n, ast.Raise) and n.exc is not None]
            if not any("UsageError" in ast.unparse(r.exc) for r in raises):
                continue  # handled (e.g. the hook capture, which must never fail)
            assert not (caught_names & names), f"{path}:{node.lineno} translates {caught_names}"
