"""``seam gateway``'s flags are defined once (issue 24, item 3): on ``GatewayConfig`` and
``GatewayOptions`` (``pipeline/gateway/config.py``), from which the parser and the
configs are generated. Proved here: the parser is the hand-written one of before (each
flag's name, default, type, choices, metavar, order); a command line with no flags gives
the configs' defaults; every flag sets its own field and no other; a bad value is the
one line it was before, and nothing is created."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from pipeline.cli import main
from pipeline.common import options
from pipeline.gateway.config import (
    DEFAULT_SUMMARY_PROMPTS,
    FLAG_ORDER,
    MIB,
    GatewayConfig,
    GatewayOptions,
)
from tests.cli.parsers import all_parsers

UPSTREAM = "http://127.0.0.1:9/v1"
REQUIRED = ["--upstream", UPSTREAM, "--out", "collected"]

# The parser as pipeline/cli/gateway.py wrote it by hand before (flag: dest, default, type,
# choices, metavar, required, action), in its order.
BEFORE = {
    "--upstream": ("upstream", None, None, None, "URL", True, "store"),
    "--out": ("out", None, None, None, "DIR", True, "store"),
    "--host": ("host", "127.0.0.1", None, None, None, False, "store"),
    "--port": ("port", 8788, int, None, None, False, "store"),
    "--allow-host": ("allow_host", [], None, None, "NAME", False, "append"),
    "--durability": ("durability", "group", None, ["group", "sync", "none"], None, False, "store"),
    "--log": ("log", "delta", None, ["delta", "full"], None, False, "store"),
    "--full-every": ("full_every", 32, int, None, "K", False, "store"),
    "--client-timeout": ("client_timeout", 60.0, float, None, "S", False, "store"),
    "--token-ids": ("token_ids", "auto", None, ["auto", "on", "off"], None, False, "store"),
    "--upstream-connections": ("upstream_connections", 0, int, None, "N", False, "store"),
    "--max-response-mb": ("max_response_mb", 64.0, float, None, "MB", False, "store"),
    "--upstream-timeout": ("upstream_timeout", 600.0, float, None, "S", False, "store"),
    "--upstream-connect-timeout": (
        "upstream_connect_timeout",
        30.0,
        float,
        None,
        "S",
        False,
        "store",
    ),
    "--api-key-env": ("api_key_env", None, None, None, "NAME", False, "store"),
    "--judge": ("judge", None, None, None, "rules|URL", False, "store"),
    "--judge-timeout": ("judge_timeout", 30.0, float, None, "S", False, "store"),
    "--summary-prompt": ("summary_prompt", None, None, None, "REGEX", False, "append"),
}
ACTIONS = {argparse._StoreAction: "store", argparse._AppendAction: "append"}

# Per flagged field: the flags that set it to something not its default, and that value.
KEY_ENV = "SEAM_TEST_GATEWAY_KEY"
GIVEN = {
    "upstream": (["--upstream", "https://engine.test/v1"], "https://engine.test/v1"),
    "token_ids": (["--token-ids", "off"], "off"),
    "upstream_timeout_s": (["--upstream-timeout", "2.5"], 2.5),
    "summary_prompts": (["--summary-prompt", "a", "--summary-prompt", "b"], ("a", "b")),
    "api_key": (["--api-key-env", KEY_ENV], "sk-test"),
    "listen_host": (["--host", "0.0.0.0"], "0.0.0.0"),
    "allow_hosts": (["--allow-host", "a.test", "--allow-host", "b.test"], ("a.test", "b.test")),
    "upstream_connections": (["--upstream-connections", "7"], 7),
    "upstream_connect_timeout_s": (["--upstream-connect-timeout", "3"], 3.0),
    "max_response_bytes": (["--max-response-mb", "1.5"], int(1.5 * MIB)),
    "log": (["--log", "full"], "full"),
    "full_every": (["--full-every", "5"], 5),
    "client_timeout_s": (["--client-timeout", "9"], 9.0),
    "out": (["--out", "elsewhere"], "elsewhere"),
    "port": (["--port", "0"], 0),
    "durability": (["--durability", "sync"], "sync"),
    "judge": (["--judge", "rules"], "rules"),
    "judge_timeout": (["--judge-timeout", "4"], 4.0),
}
FLAGGED = [
    (config_class, f)
    for config_class in (GatewayConfig, GatewayOptions)
    for f in options.flagged_fields(config_class)
]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return all_parsers()["gateway"]


def test_the_parser_is_the_one_of_before(parser):
    taken = [a for a in parser._actions if a.option_strings != ["-h", "--help"]]
    assert [a.option_strings[0] for a in taken] == list(BEFORE)  # same flags, same order
    for action in taken:
        flag = action.option_strings[0]
        got = (
            action.dest,
            action.default,
            action.type,
            action.choices,
            action.metavar,
            action.required,
            ACTIONS[type(action)],
        )
        assert got == BEFORE[flag], flag


def test_each_flagged_field_is_listed_once():
    """A field left out of FLAG_ORDER would have no flag: the command could not set it."""
    listed = [(c, name) for c, name in FLAG_ORDER]
    assert len(set(listed)) == len(listed)
    assert set(listed) == {(c, f.name) for c, f in FLAGGED}


def test_no_flags_give_the_configs_defaults(parser):
    args = parser.parse_args(REQUIRED)
    config = options.config_from_args(GatewayConfig, args)
    assert config == GatewayConfig(upstream=UPSTREAM)
    assert config.summary_prompts == DEFAULT_SUMMARY_PROMPTS  # not an empty list
    assert options.config_from_args(GatewayOptions, args) == GatewayOptions(out="collected")


@pytest.mark.parametrize("config_class, field", FLAGGED, ids=lambda x: getattr(x, "name", ""))
def test_every_gateway_flag_sets_its_field(config_class, field, parser, monkeypatch):
    """Each flag reaches its own field, converted (MiB → bytes, an env name → its key),
    and leaves every other field at its default."""
    monkeypatch.setenv(KEY_ENV, "sk-test")
    flags, value = GIVEN[field.name]
    args = parser.parse_args([*REQUIRED, *flags])
    default = options.config_from_args(config_class, parser.parse_args(REQUIRED))
    assert value != getattr(default, field.name)
    expected = dataclasses.replace(default, **{field.name: value})
    assert options.config_from_args(config_class, args) == expected


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--full-every", "0"], "--full-every must be 1 or more and --client-timeout positive"),
        (["--client-timeout", "0"], "--full-every must be 1 or more and --client-timeout positive"),
        (
            ["--upstream-connections", "-1"],
            "--upstream-connections must be 0 or more and --max-response-mb positive",
        ),
        (
            ["--max-response-mb", "0"],
            "--upstream-connections must be 0 or more and --max-response-mb positive",
        ),
        (
            ["--upstream-timeout", "0"],
            "--upstream-timeout and --upstream-connect-timeout must be positive",
        ),
        (
            ["--upstream-connect-timeout", "-2"],
            "--upstream-timeout and --upstream-connect-timeout must be positive",
        ),
        (["--api-key-env", KEY_ENV], f"--api-key-env {KEY_ENV}: that variable is not set"),
        (["--judge", "judge.test"], "--judge 'judge.test': give 'rules' or an http(s) URL"),
    ],
)
def test_a_bad_gateway_value_is_one_line(flags, line, tmp_path, capsys, monkeypatch):
    pytest.importorskip("aiohttp")  # the gateway extra: without it, that is the one line
    monkeypatch.delenv(KEY_ENV, raising=False)
    out = tmp_path / "collected"
    assert main(["gateway", "--upstream", UPSTREAM, "--out", str(out), *flags]) == 2
    assert capsys.readouterr().err == f"seam gateway: error: {line}\n"
    assert not out.exists()


def test_a_key_in_the_upstream_url_is_not_in_the_error(tmp_path, capsys):
    pytest.importorskip("aiohttp")
    out = tmp_path / "collected"
    assert (
        main(["gateway", "--upstream", "ftp://user:sk-secret@engine.test", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert "give an http(s) URL" in err and "sk-secret" not in err
    assert not out.exists()
