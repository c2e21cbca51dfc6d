"""One definition per option (issue 24, item 3; ``pipeline/common/options.py``).

Each config field carries its flag, help, default and effect on the output, and the
flags, the configs and the fingerprint are generated from it. Proved here:

- the derived fingerprint is the hand-kept one of before (``fingerprint_before``, copied
  from ``pipeline/build/run.py`` before the redesign) for any config, so the manifests'
  ``config`` keeps its bytes and builds made before stay resumable;
- every field marked output-affecting changes the fingerprint, every other field does not;
- every flag of a config, in every command that takes it, has the field's default and the
  same help; and every flag sets its field (nothing copied by hand to lose one);
- a flag's bad value is one line, not a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.build.config import BuildConfig, LengthConfig, OutputConfig
from pipeline.build.worker import WorkerConfig
from pipeline.cli import build_parser, main
from pipeline.common import options
from pipeline.common.hashing import file_sha256
from pipeline.sft.filter_options import FilterOptions
from pipeline.sources.input_config import InputConfig
from pipeline.sources.limits import Limits
from tests.cli.parsers import all_parsers

COMMANDS = (
    "build-rl",
    "build-sft",
    "ingest",
    "judge",
    "audit",
    "verify",
    "export",
    "report",
    "show",
    "simulate",
)
# Flag names that several commands take for what is, per command, a different thing (an
# output file or a directory, a port, a seed) or, for --verify, one definition whose
# default is the command's: each is defined by its command alone, on purpose.
PER_COMMAND = {
    "--out": "what a command writes: a build or export directory, a findings file, ...",
    "--json": "what is printed as JSON: scores, the audit's aggregate, rows",
    "--seed": "a training seed (int) or a simulation seed (any string)",
    "--port": "the gateway's or the viewer's port, each with its default",
    "--timeout": "an LLM request's seconds or a viewer filter's",
    "--model": "the judge's model name or the policy directory to train",
    "--allow-host": "the gateway's or the viewer's extra Host names",
    "--api-key-env": "the LLM judge's key or the gateway engine's",
    "--capture": "the hook's capture directory (install) or a hook's own argument",
    "--html": "the report's file or show's page",
    "--verify": "one add_verify_argument: a build samples by default, seam verify checks all",
}


def fingerprint_before(config: BuildConfig) -> dict:
    """``BuildConfig.fingerprint_config`` as it was written by hand before issue 24."""
    keep = (
        "kind",
        "format",
        "use_std",
        "mask_summaries",
        "last_call_only",
        "drop_truncated",
        "rows_per_shard",
        "chunk_bytes",
        "chat_template",
    )
    fingerprint = {k: getattr(config, k) for k in keep}
    if config.keep_damaged:
        fingerprint["keep_damaged"] = True
    if config.exclude_fidelity:
        fingerprint["exclude_fidelity"] = sorted(set(config.exclude_fidelity))
    if config.std_ddof:
        fingerprint["std_ddof"] = config.std_ddof
    if config.limits != Limits():
        fingerprint["limits"] = config.limits.as_dict()
    if config.group_by:
        fingerprint["group_by"] = config.group_by
    if config.stage is not None:
        fingerprint["stage"] = config.stage.fingerprint()
    if config.rewards:
        fingerprint["rewards_sha256"] = file_sha256(Path(config.rewards))
    return fingerprint


class Stage:
    """A build stage as far as the fingerprint sees one."""

    def __init__(self, name: str) -> None:
        self.name = name

    def fingerprint(self) -> dict:
        return {"name": self.name}


@pytest.fixture(scope="module")
def rewards_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("rewards") / "rewards.csv"
    path.write_text("rollout_id,reward\nr1,1\n")
    return str(path)


LIMITS = st.builds(
    Limits,
    max_line_bytes=st.sampled_from([Limits().max_line_bytes, 1 << 20]),
    max_depth=st.sampled_from([100, 7]),
    max_quarantine_entries=st.sampled_from([100_000, 3]),
)


@settings(max_examples=60, deadline=None)
@given(
    data=st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["rl", "sft"]),
            "format": st.sampled_from(["auto", "canonical", "chat-completions"]),
            "chat_template": st.sampled_from([None, "chatml-tools"]),
            "mask_summaries": st.booleans(),
            "last_call_only": st.booleans(),
            "drop_truncated": st.booleans(),
            "keep_damaged": st.booleans(),
            "exclude_fidelity": st.lists(st.sampled_from(["a", "b", "c"]), max_size=3).map(tuple),
            "use_std": st.booleans(),
            "std_ddof": st.sampled_from([0, 1]),
            "rows_per_shard": st.sampled_from([1024, 7]),
            "chunk_bytes": st.sampled_from([None, 1, 1 << 20]),
            "limits": LIMITS,
            "group_by": st.sampled_from([None, "", "metadata.session"]),
            "stage": st.sampled_from([None, Stage("x")]),
            "rewards": st.booleans(),
            "workers": st.integers(1, 4),
            "progress": st.booleans(),
            "overwrite": st.booleans(),
            "tokenizer": st.sampled_from([None, "/some/tokenizer"]),
            "timings": st.sampled_from([None, "timings.json"]),
            "engine": st.sampled_from(["local", "ray"]),
            "ray_address": st.sampled_from([None, "auto"]),
            "inputs": st.sampled_from([["in.jsonl"], ["a/", "b.jsonl"]]),
            "out": st.sampled_from(["out", "elsewhere"]),
        }
    )
)
def test_the_derived_fingerprint_is_the_one_of_before(data, rewards_file):
    data["rewards"] = rewards_file if data["rewards"] else None
    config = BuildConfig(**data)
    assert config.fingerprint_config() == fingerprint_before(config)
    # Every field is drawn: one marked output-affecting by mistake shows up here.
    assert set(data) == {f.name for f in dataclasses.fields(BuildConfig)}


def _other_value(field: dataclasses.Field, rewards: str):
    """A value of ``field`` that is not its default."""
    default = options.field_default(field)
    if field.name == "rewards":
        return rewards
    if field.name == "stage":
        return Stage("y")
    if field.name == "limits":
        return Limits(max_depth=5)
    if field.name == "exclude_fidelity":
        return ("opaque_summary",)
    if field.name == "kind":
        return "sft"
    if field.name == "engine":
        return "ray"
    if field.name == "inputs":
        return ["other.jsonl"]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if default is None or default is dataclasses.MISSING or isinstance(default, str):
        return f"{default}-other"
    raise AssertionError(f"no other value for {field.name}")


@pytest.mark.parametrize("field", dataclasses.fields(BuildConfig), ids=lambda f: f.name)
def test_output_affecting_fields_and_only_they_change_the_fingerprint(field, rewards_file):
    spec = options.option_of(field)
    assert spec is not None, f"BuildConfig.{field.name} has no Option: say what it does"
    base = BuildConfig(inputs=["in.jsonl"], out="out")
    changed = dataclasses.replace(base, **{field.name: _other_value(field, rewards_file)})
    differs = changed.fingerprint_config() != base.fingerprint_config()
    assert differs == (spec.output in (options.ALWAYS, options.WHEN_SET)), field.name
    if spec.output == options.BY_CONTENT:  # fingerprinted by what it names (run.py)
        assert field.name in ("inputs", "tokenizer")


def _flag_fields() -> list[dataclasses.Field]:
    seen: dict[str, dataclasses.Field] = {}
    for config in (BuildConfig, InputConfig, OutputConfig, LengthConfig, FilterOptions):
        for f in options.flagged_fields(config):
            seen.setdefault(f.name, f)
    return list(seen.values())


def _parsers() -> dict[str, argparse.ArgumentParser]:
    every = all_parsers()
    return {name: every[name] for name in COMMANDS}


def test_a_flag_name_means_one_thing_in_every_command():
    """Issue 24 item 10: a flag two commands take has one help and one default (it comes
    from one definition), unless it is listed in PER_COMMAND with why."""
    seen: dict[str, set[tuple[str, str]]] = {}
    for parser in all_parsers().values():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                seen.setdefault(flag, set()).add((str(action.help), repr(action.default)))
    drifted = {flag for flag, kinds in seen.items() if len(kinds) > 1}
    assert drifted - set(PER_COMMAND) == set()
    assert set(PER_COMMAND) <= drifted  # an entry that no longer differs is taken out


@pytest.fixture(scope="module")
def parsers():
    return _parsers()


@pytest.mark.parametrize("field", _flag_fields(), ids=lambda f: f.name)
def test_a_shared_flag_has_one_default_and_one_help_in_every_command(field, parsers):
    spec = options.option_of(field)
    taken_by = []
    for command, parser in parsers.items():
        for action in parser._actions:
            if spec.flag in action.option_strings and action.help != argparse.SUPPRESS:
                taken_by.append(command)
                assert action.default == options.flag_default(field), (command, spec.flag)
                assert action.help == options.help_text(field), (command, spec.flag)
                assert action.dest == options.dest_of(spec.flag)
    assert taken_by, f"{spec.flag} is a flag of no command"


def test_the_shared_flags_are_taken_where_they_mean_something(parsers):
    def flags(command: str) -> set[str]:
        return {s for a in parsers[command]._actions for s in a.option_strings}

    reading = {"--format", "--group-by", "--max-line-mb", "--max-depth"}
    for command in ("build-rl", "build-sft", "ingest", "judge", "audit"):
        assert reading <= flags(command), command
    caps = {"--max-quarantine-entries", "--max-quarantine-mb"}
    assert caps <= flags("ingest") & flags("build-sft")
    assert not caps & (flags("judge") | flags("audit"))  # their --quarantine FILE is whole
    assert "--rewards" in flags("ingest") and "--rewards" not in flags("judge")
    for command in ("build-rl", "ingest", "export", "report"):
        assert "--overwrite" in flags(command)
    assert "--no-progress" in flags("verify") & flags("ingest")
    assert "--std" in flags("build-rl") and "--std" not in flags("build-sft")
    assert "--max-length" in flags("build-sft") & flags("export")
    assert {"--tokenizer", "--chat-template"} <= flags("show")
    assert {"--workers", "--no-progress"} <= flags("simulate")


def test_show_refuses_a_chat_template_for_a_build(tmp_path, capsys):
    """show renders a build with the template it was built with: --chat-template, which
    it cannot apply there, is an error, not ignored."""
    (tmp_path / "manifest.json").write_text("{}")
    assert main(["show", str(tmp_path), "--chat-template", "chatml-tools"]) == 2
    assert capsys.readouterr().err == (
        "seam show: error: --chat-template applies to raw inputs; a build directory is shown "
        "with the template it was built with\n"
    )


def _argv_setting(field: dataclasses.Field) -> list[str]:
    spec = options.option_of(field)
    if spec.switch:
        return [spec.flag]
    if spec.choices is not None:
        choices = spec.choices() if callable(spec.choices) else spec.choices
        return [spec.flag, next(c for c in choices if c != options.flag_default(field))]
    if spec.type is int:
        return [spec.flag, "3"]
    if spec.type is float:
        return [spec.flag, "3.5"]
    return [spec.flag, "a,b"]


@pytest.mark.parametrize(
    "field",
    [f for f in options.flagged_fields(BuildConfig) if f.name != "use_std"],
    ids=lambda f: f.name,
)
def test_every_build_flag_sets_its_field(field):
    argv = ["build-rl", "in.jsonl", "--out", "o", *_argv_setting(field)]
    config = options.config_from_args(
        BuildConfig, build_parser().parse_args(argv), inputs=["in.jsonl"], out="o"
    )
    default = BuildConfig(inputs=["in.jsonl"], out="o")
    if field.name in {f.name for f in dataclasses.fields(Limits)}:
        config, default = config.limits, default.limits  # type: ignore[assignment]
    assert getattr(config, field.name) != getattr(default, field.name)


@pytest.mark.parametrize("field", list(options.flagged_fields(FilterOptions)), ids=lambda f: f.name)
def test_every_sft_filter_flag_sets_its_field(field):
    args = build_parser().parse_args(["build-sft", "in.jsonl", "--out", "o", *_argv_setting(field)])
    filters = options.config_from_args(FilterOptions, args)
    assert getattr(filters, field.name) != getattr(FilterOptions(), field.name)


@settings(max_examples=30, deadline=None)
@given(
    st.builds(
        FilterOptions,
        malformed=st.booleans(),
        summary_loops=st.booleans(),
        off_task=st.booleans(),
        resolved_only=st.booleans(),
        max_tokens=st.sampled_from([None, 512]),
    )
)
def test_the_sft_filters_fingerprint_is_the_one_of_before(filters):
    """The SFT stage recorded ``filters.__dict__``: every field, always."""
    assert options.fingerprint_of(filters) == filters.__dict__


def test_the_worker_config_takes_the_build_config_fields_by_name():
    config = BuildConfig(
        ["in.jsonl"], "o", tokenizer="t", chat_template="c", rewards="r.csv", group_by="g"
    )
    worker = config.worker_config(2)
    for f in dataclasses.fields(WorkerConfig):
        if hasattr(config, f.name):
            assert getattr(worker, f.name) == getattr(config, f.name), f.name
    assert worker.read.set_options() == {"group_by": "g"}


@pytest.mark.parametrize(
    "flag, value, line",
    [
        ("--rows-per-shard", "0", "--rows-per-shard must be at least 1"),
        ("--workers", "0", "--workers must be at least 1"),
        ("--max-line-mb", "0", "the --max-* limits must be positive"),
        ("--max-depth", "0", "the --max-* limits must be positive"),
        ("--max-quarantine-entries", "0", "the --max-* limits must be positive"),
    ],
)
def test_a_bad_value_is_one_line(flag, value, line, tmp_path, capsys):
    assert (
        main(["build-rl", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o"), flag, value])
        == 2
    )
    assert capsys.readouterr().err == f"seam build-rl: error: {line}\n"
    assert not (tmp_path / "o").exists()
