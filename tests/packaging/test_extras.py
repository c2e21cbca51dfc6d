"""Extras (pipeline/common/extras.py, pyproject.toml): a command whose optional library is not
installed fails before any work with one line naming the extra; the core commands never
import an optional library; ``seam --version`` prints the one version.

A missing library is simulated the way Python itself reports one: ``sys.modules[name] =
None`` makes ``import name`` raise ``ModuleNotFoundError`` and ``find_spec`` return None.
tests/packaging/test_wheel.py runs the same commands from a real core-only install.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import tomllib

from pipeline import __version__
from pipeline.cli import main
from pipeline.common import extras
from tests.packaging.inputs import write_rollouts

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# httpx2, the LLM judge's client, is also huggingface_hub's (a core dependency's), so a
# core install has it; the judge-llm extra still names it, not to rely on that.
OPTIONAL = {m for modules in extras.EXTRAS.values() for m in modules} - {"httpx2"}


@pytest.fixture(scope="module")
def rl_build(tmp_path_factory):
    """A small RL build made with every optional library unimportable (the core install
    of `make build-rl-shards`): 4 hand-written rollouts in two GRPO groups."""
    tmp = tmp_path_factory.mktemp("build")
    rollouts = write_rollouts(tmp / "in.jsonl")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _without(monkeypatch, *OPTIONAL)
        args = ["build-rl", str(rollouts), "--out", str(tmp / "rl"), "--workers", "1"]
        assert main([*args, "--no-progress"]) == 0
        assert not any(sys.modules.get(m) for m in OPTIONAL)
    return tmp / "rl"


def _without(monkeypatch, *modules: str) -> None:
    """Make ``modules`` (and every submodule already imported) unimportable."""
    for name in list(sys.modules):
        if name.split(".")[0] in modules:
            monkeypatch.delitem(sys.modules, name)
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _distribution(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def test_every_extra_module_is_declared_in_its_extra_and_none_in_the_core():
    declared = PYPROJECT["project"]["optional-dependencies"]
    core = {_distribution(r) for r in PYPROJECT["project"]["dependencies"]}
    for extra, modules in extras.EXTRAS.items():
        assert extra in declared, f"pyproject.toml has no [{extra}] extra"
        in_extra = {_distribution(r) for r in declared[extra]}
        for module in modules:  # each module here is installed by the distribution of its name
            assert module in in_extra, f"[{extra}] does not install {module}"
    optional = {m for modules in extras.EXTRAS.values() for m in modules}
    assert not core & optional, f"optional libraries in the core dependencies: {core & optional}"
    assert PYPROJECT["project"]["name"] == extras.DISTRIBUTION


def test_version_has_one_source(capsys):
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pipeline.__version__"}
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"seam {__version__}\n"
    import seam

    assert seam.__version__ == __version__


@pytest.mark.parametrize(
    ("argv", "missing", "extra", "command"),
    [
        (["gateway", "--upstream", "http://127.0.0.1:9", "--out", "{tmp}/g"], "aiohttp", "gateway", "gateway"),
        (["report", "{tmp}", "--html", "{tmp}/r.html"], "matplotlib", "report", "report"),
        (["judge", "data/sample", "--llm", "http://127.0.0.1:9/v1", "--model", "m"], "tenacity", "judge-llm", "judge --llm"),
        (["make-tiny-model", "--out", "{tmp}/m"], "torch", "train", "make-tiny-model"),
        (["train-step", "{tmp}", "--model", "{tmp}"], "torch", "train", "train-step"),
        (["build-rl", "data/sample", "--out", "{tmp}/b", "--engine", "ray"], "ray", "ray", "build-rl --engine ray"),
    ],
)  # fmt: skip
def test_missing_extra_is_one_line_before_any_work(
    monkeypatch, tmp_path, capsys, argv, missing, extra, command
):
    monkeypatch.chdir(ROOT)
    _without(monkeypatch, missing)
    before = sorted(tmp_path.rglob("*"))
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err == f"seam {command} needs the {extra} extra: pip install 'seam-rl[{extra}]'\n"
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_an_optional_import_past_the_check_is_still_one_line(monkeypatch, capsys):
    """The backstop in the CLI: a ModuleNotFoundError of an optional library names its extra;
    one of a core library is not hidden (its traceback says which install is broken)."""

    def needs(module):
        def run(args):
            __import__(module)

        return run

    monkeypatch.setattr(
        "argparse.ArgumentParser.parse_args", lambda self, argv=None: _args(needs("matplotlib"))
    )
    _without(monkeypatch, "matplotlib")
    assert main([]) == 2
    assert (
        capsys.readouterr().err
        == "seam report needs the report extra: pip install 'seam-rl[report]'\n"
    )
    monkeypatch.setattr(
        "argparse.ArgumentParser.parse_args", lambda self, argv=None: _args(needs("pyarrow"))
    )
    _without(monkeypatch, "pyarrow")
    with pytest.raises(ModuleNotFoundError):
        main([])


def _args(func):
    import argparse

    return argparse.Namespace(command="report", func=func)


def test_export_to_slime_names_the_train_extra(monkeypatch, tmp_path, capsys, rl_build):
    _without(monkeypatch, "torch")
    assert main(["export", str(rl_build), "--to", "slime", "--out", str(tmp_path / "e")]) == 2
    assert capsys.readouterr().err == (
        "seam export --to slime needs the train extra: pip install 'seam-rl[train]'\n"
    )
    assert not (tmp_path / "e").exists()


def test_core_commands_run_without_any_extra(monkeypatch, tmp_path, capsys, rl_build):
    """build-rl (the fixture), build-sft and audit (make build-sft), the rule judge, stats,
    sql, show, verify and the exports to TRL and verl with every optional library
    unimportable (simulate and ingest: tests/packaging/test_wheel.py)."""
    _without(monkeypatch, *OPTIONAL)
    sft = ["build-sft", str(rl_build.parent / "in.jsonl"), "--out", str(tmp_path / "sft")]
    assert main([*sft, "--workers", "1", "--no-progress", "--synthesize-summary-calls"]) == 0
    assert main(["audit", str(tmp_path / "sft")]) == 0  # make build-sft's second command
    assert (
        main(["judge", str(rl_build.parent / "in.jsonl"), "--out", str(tmp_path / "f.jsonl")]) == 0
    )
    assert main(["stats", str(rl_build)]) == 0
    assert main(["sql", str(rl_build), "SELECT count(*) FROM rollouts"]) == 0
    assert main(["show", str(rl_build), "--where", "true"]) == 0
    assert main(["verify", str(rl_build)]) == 0
    for target in ("trl", "verl"):
        assert main(["export", str(rl_build), "--to", target, "--out", str(tmp_path / target)]) == 0
    capsys.readouterr()
    assert not any(sys.modules.get(m) for m in OPTIONAL)


def test_view_report_page_names_the_report_extra(monkeypatch, rl_build):
    """`seam view` works without the report extra; its /report page says what to install."""
    from pipeline.inspect.view_server import BuildBrowser

    _without(monkeypatch, "matplotlib")
    browser = BuildBrowser.__new__(BuildBrowser)  # the filter process is not needed here
    browser.dir = rl_build
    status, html = browser.page("/report")
    assert status == 501
    assert (
        "seam view /report needs the report extra: pip install &#x27;seam-rl[report]&#x27;" in html
    )


def test_a_slime_pt_dump_without_torch_is_quarantined_naming_the_train_extra(monkeypatch, tmp_path):
    from pipeline.readers.token_dumps import SlimeReader

    _without(monkeypatch, "torch")
    dump = tmp_path / "rollout_0.pt"
    dump.write_bytes(b"not read")
    ((line, record, reason, raw),) = SlimeReader()._records(dump)
    assert (line, record, raw) == (None, {}, "")
    assert reason is not None and "pip install 'seam-rl[train]'" in reason
