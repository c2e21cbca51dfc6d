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
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from judge.llm_options import ClientConfig, LlmJudgeOptions
from pipeline.build.config import BuildConfig, LengthConfig, OutputConfig
from pipeline.build.worker import WorkerConfig
from pipeline.cli import build_parser, main
from pipeline.common import options
from pipeline.common.hashing import file_sha256
from pipeline.common.http_guard import HostOptions
from pipeline.sft.config import SftOptions
from pipeline.sft.filter_options import FilterOptions
from pipeline.sft.stage import SftStage
from pipeline.sft.synthesize import load_prompt
from pipeline.sources.input_config import InputConfig
from pipeline.sources.limits import Limits
from tests.cli.parsers import all_parsers
from trainer.ppo_config import PlanOptions, PPOConfig

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
    "train-step",
    "gateway",
    "view",
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
    "--api-key-env": "the LLM judge's key or the gateway engine's",
    "--capture": "the hook's capture directory (install) or a hook's own argument",
    "--html": "the report's file or show's page",
    "--max-response-mb": "the largest answer read from an LLM endpoint, in MiB: the judge's "
    "(a step fails) or the gateway engine's (a 502), each with its default",
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
    for config in (
        BuildConfig,
        InputConfig,
        OutputConfig,
        LengthConfig,
        SftOptions,
        ClientConfig,
        LlmJudgeOptions,
        PPOConfig,
        PlanOptions,
        HostOptions,
    ):
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
                if spec.flag in PER_COMMAND and action.help != options.help_text(field):
                    continue  # another command's own flag of that name (PER_COMMAND: why)
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


def sft_fingerprint_before(stage: SftStage) -> dict:
    """``SftStage.fingerprint`` as it was written by hand before its options were fields."""
    digest = file_sha256(Path(stage.corrections_file)) if stage.corrections_file else None
    found = {"filters": stage.filters.__dict__, "corrections_sha256": digest}
    if stage.synthesize_prompt is not None:
        found["synthesize_summary_calls"] = {"prompt": stage.synthesize_prompt}
    return found


@pytest.fixture(scope="module")
def corrections_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corrections") / "corrections.jsonl"
    path.write_text('{"rollout_id": "r1"}\n')
    return str(path)


@settings(max_examples=30, deadline=None)
@given(
    filters=st.builds(
        FilterOptions,
        malformed=st.booleans(),
        resolved_only=st.booleans(),
        max_tokens=st.sampled_from([None, 512]),
    ),
    corrections=st.booleans(),
    prompt=st.sampled_from([None, "Summarize the work so far."]),
)
def test_the_sft_stage_fingerprint_is_the_one_of_before(
    filters, corrections, prompt, corrections_file
):
    """Its keys in the same order too: the manifest's ``config.stage`` keeps its bytes."""
    stage = SftStage(
        corrections_file=corrections_file if corrections else None,
        filters=filters,
        synthesize_prompt=prompt,
    )
    assert json.dumps(stage.fingerprint()) == json.dumps(sft_fingerprint_before(stage))


def test_every_sft_stage_flag_sets_its_field(tmp_path, corrections_file):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Summarize the work so far.\n")
    build_sft = ["build-sft", "in.jsonl", "--out", "o"]
    for flags, field, value in [
        (["--corrections", corrections_file], "corrections_file", corrections_file),
        (["--synthesize-summary-calls"], "synthesize_prompt", load_prompt(None)),
        ([f"--synthesize-summary-calls={prompt}"], "synthesize_prompt", "Summarize the work so far."),
        (["--max-length", "9"], "filters", FilterOptions(max_tokens=9)),
        (["--max-tokens", "9"], "filters", FilterOptions(max_tokens=9)),  # its old name
        (["--keep-off-task"], "filters", FilterOptions(off_task=False)),
    ]:  # fmt: skip
        stage = options.config_from_args(SftStage, build_parser().parse_args(build_sft + flags))
        assert getattr(stage, field) == value, flags
        assert stage == dataclasses.replace(SftStage(), **{field: value}), flags  # that one alone


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--corrections", "{tmp}/none.jsonl"], "--corrections {tmp}/none.jsonl: no such file"),
        (["--synthesize-summary-calls={tmp}/none.txt"], "--synthesize-summary-calls {tmp}/none.txt: no such file"),
        (["--max-length", "0"], "--max-length must be at least 1"),
    ],
)  # fmt: skip
def test_a_bad_sft_option_is_one_line(flags, line, tmp_path, capsys):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("")
    argv = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    out = tmp_path / "o"
    assert main(["build-sft", str(inputs), "--out", str(out), *argv]) == 2
    assert (
        capsys.readouterr().err
        == f"seam build-sft: error: {line.replace('{tmp}', str(tmp_path))}\n"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "config_class, field",
    [(c, f) for c in (ClientConfig, LlmJudgeOptions) for f in options.flagged_fields(c)],
    ids=lambda x: getattr(x, "name", getattr(x, "__name__", "")),
)
def test_every_llm_judge_flag_sets_its_field(config_class, field):
    argv = ["judge", "in.jsonl", "--llm", "http://127.0.0.1:9/v1", "--model", "m"]
    args = build_parser().parse_args([*argv, *_argv_setting(field)])
    given = options.config_from_args(config_class, args)
    default = options.config_from_args(config_class, build_parser().parse_args(argv))
    assert getattr(given, field.name) != getattr(default, field.name)


def client_config_before(args: argparse.Namespace) -> dict:
    """The client config ``seam judge`` built by hand from its flags before they were
    fields (pipeline/cli/judge.py ``_chat_client``), as a dict."""
    from pipeline.core.tokenizer import cache_dir

    return dict(
        url=args.llm,
        model=args.model,
        api_key_env=args.api_key_env,
        timeout_s=args.timeout,
        max_retries=args.retries,
        json_mode=not args.no_json_mode,
        cache_dir=None if args.no_cache else (args.cache_dir or str(cache_dir() / "judge")),
        max_tokens=args.max_answer_tokens,
        price_in_per_mtok=args.price_in,
        price_out_per_mtok=args.price_out,
        max_response_bytes=int(args.max_response_mb * (1 << 20)),  # was --max-response-bytes
        max_connect_failures=args.max_connect_failures,
        backoff_s=1.0,
        backoff_cap_s=30.0,
        temperature=0.0,
    )


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--no-cache", "--timeout", "5", "--retries", "0", "--no-json-mode"],
        ["--cache-dir", "c", "--max-answer-tokens", "9", "--price-in", "1.5", "--price-out", "2"],
        ["--max-response-bytes", "1000", "--max-connect-failures", "2", "--api-key-env", "K"],
        ["--max-tokens", "7", "--max-response-mb", "0.5"],
    ],
)
def test_the_judge_client_config_is_the_one_of_before(flags):
    """The defaults too: the library's ClientConfig had a 60 s timeout, the flag 120 s;
    one definition keeps the command line's (what users ran)."""
    args = build_parser().parse_args(["judge", "x", "--llm", "http://h/v1", "--model", "m", *flags])
    config = options.config_from_args(ClientConfig, args)
    found = dataclasses.asdict(config)
    if not found.pop("use_cache"):
        found["cache_dir"] = None  # the client reads no cache (ChatClient)
    assert found == client_config_before(args)


def test_the_judge_defaults_are_the_ones_of_before():
    """The flags' defaults before they were fields (pipeline/cli/judge.py's add_argument)."""
    from pipeline.core.tokenizer import cache_dir

    args = build_parser().parse_args(["judge", "x", "--llm", "u", "--model", "m"])
    assert options.config_from_args(ClientConfig, args) == ClientConfig(
        url="u",
        model="m",
        api_key_env="OPENAI_API_KEY",
        timeout_s=120.0,
        max_retries=4,
        max_tokens=1024,
        json_mode=True,
        cache_dir=str(cache_dir() / "judge"),
        price_in_per_mtok=0.0,
        price_out_per_mtok=0.0,
        max_response_bytes=4194304,
        max_connect_failures=5,
    )
    assert options.config_from_args(LlmJudgeOptions, args) == LlmJudgeOptions(
        concurrency=8, every_call=False, max_context_chars=60_000, batch=256
    )


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--batch", "0"], "--batch must be at least 1"),
        (["--max-response-mb", "0"], "--max-response-mb must be positive"),
        (["--max-connect-failures", "0"], "--max-connect-failures must be at least 1"),
        ([], "--llm needs --model (the model name the endpoint serves)"),
    ],
)
def test_a_bad_llm_judge_option_is_one_line(flags, line, tmp_path, capsys):
    """Refused before a request is sent (nothing listens at the URL)."""
    from tests.packaging.inputs import write_rollouts

    inputs = write_rollouts(tmp_path / "in.jsonl")
    model = [] if not flags else ["--model", "m"]
    argv = ["judge", str(inputs), "--llm", "http://127.0.0.1:9/v1", *model, *flags]
    assert main([*argv, "--out", str(tmp_path / "f.jsonl")]) == 2
    assert capsys.readouterr().err == f"seam judge: error: {line}\n"


def test_the_ppo_defaults_are_the_ones_of_before():
    """train-step's flags had these defaults, copied by hand into PPOConfig's: now one."""
    args = build_parser().parse_args(["train-step", "b", "--model", "m"])
    assert options.config_from_args(PPOConfig, args) == PPOConfig(
        policy_lr=2e-6,
        critic_lr=3e-6,
        weight_decay=0.0,
        clip_eps=0.2,
        value_clip=0.2,
        policy_updates=1,
        critic_updates=2,
        critic_warmup_steps=0,
        gamma=1.0,
        lam=None,
        lambda_rule="rollout",
        alpha=1.5,
        max_grad_norm=1.0,
        micro_batch_tokens=4096,
        recompute_old_logprobs=False,
        bf16=False,
        activation_checkpointing=False,
    )
    assert options.config_from_args(PlanOptions, args) == PlanOptions(
        rollouts_per_step=8, steps=1, max_step_tokens=None, shuffle_seed=None
    )


@pytest.mark.parametrize(
    "config_class, field",
    [(c, f) for c in (PPOConfig, PlanOptions) for f in options.flagged_fields(c)],
    ids=lambda x: getattr(x, "name", getattr(x, "__name__", "")),
)
def test_every_ppo_flag_sets_its_field(config_class, field):
    """Every hyperparameter and plan flag reaches the trainer (nothing copied by hand)."""
    spec = options.option_of(field)
    value = {int: ["3"], float: ["0.5"]}.get(spec.type, []) if not spec.choices else []
    flag = _argv_setting(field) if not value else [spec.flag, *value]
    args = build_parser().parse_args(["train-step", "b", "--model", "m", *flag])
    config = options.config_from_args(config_class, args)
    assert getattr(config, field.name) != getattr(config_class(), field.name)


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--model", "m"], "--model applies to the LLM judge: give --llm URL --model M"),
        (["--concurrency", "2"], "--concurrency applies to the LLM judge: give --llm URL --model M"),
        (["--no-cache"], "--no-cache applies to the LLM judge: give --llm URL --model M"),
        (["--max-tokens", "9"], "--max-answer-tokens applies to the LLM judge: give --llm URL --model M"),
        (["--split", "tune"], "--split goes with --eval LABELS"),
        (["--json"], "--json goes with --eval LABELS"),
    ],
)  # fmt: skip
def test_a_judge_option_that_does_not_apply_is_refused(flags, line, tmp_path, capsys):
    """The rule judge has no use for the LLM judge's options: refused, not ignored."""
    from tests.packaging.inputs import write_rollouts

    inputs = write_rollouts(tmp_path / "in.jsonl")
    assert main(["judge", str(inputs), *flags, "--out", str(tmp_path / "f.jsonl")]) == 2
    assert capsys.readouterr().err.endswith(f"seam judge: error: {line}\n")
    assert not (tmp_path / "f.jsonl").exists()


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


@pytest.mark.parametrize("command", [["view", "d"], ["gateway", "--upstream", "u", "--out", "o"]])
def test_allow_host_is_one_repeatable_flag_of_both_servers(command):
    parser = build_parser()
    given = parser.parse_args([*command, "--allow-host", "a.test", "--allow-host", "b.test"])
    assert options.config_from_args(HostOptions, given) == HostOptions(("a.test", "b.test"))
    assert parser.parse_args(command).allow_host == []  # argparse appended to a copy
    assert options.config_from_args(HostOptions, parser.parse_args(command)) == HostOptions()
