"""One definition per option (issue 24, item 3): a config dataclass's field carries its
command-line flag, help, default and whether it affects the output, and everything else
is generated from that one place:

- ``add_options(parser, Config)``: the argparse flags of every command that takes the
  options (the same flag, default and help in each);
- ``values_from_args(Config, args)``: the field values a parsed command line gives (no
  field copied by hand; a flag a command lacks leaves its field at the default);
- ``fingerprint_of(config)``: the fields that decide the output bytes, as the build
  fingerprint and the manifest's ``config`` record them.

A field is declared with ``option(...)`` (``dataclasses.field`` with an ``Option`` in its
metadata). Its default is the field's default: the flag's default is derived from it
(``to_flag``: e.g. bytes → MiB) and shown in the help where it says ``{default}``.

How a field enters the fingerprint (``Option.output``):

- ``None``: it does not change the output (``--workers``, ``--out``, ``--no-progress``);
- ``"always"``: recorded under its name, whatever its value;
- ``"when_set"``: recorded only when it is not the default, so the fingerprint of a
  build made before the option existed is unchanged (such builds stay resumable);
- ``"by_content"``: the output depends on what it names, and the build fingerprints that
  content itself (the tokenizer's hashes, the inputs' SHA-256), not the path.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.common.errors import UsageError

ALWAYS = "always"
WHEN_SET = "when_set"
BY_CONTENT = "by_content"
OUTPUTS = (None, ALWAYS, WHEN_SET, BY_CONTENT)
DERIVED = object()  # Option.flag_default: the flag's default comes from the field's
MIB = 1 << 20


@dataclass(frozen=True)
class Option:
    """How the command line sets one config field, and what the field does to the output."""

    flag: str | None = None  # "--rows-per-shard"; None: no flag (set by code, or by ``set_by``)
    required: bool = False  # the command line must give the flag (the field has no default)
    # "{default}" is replaced by the flag's default. ``help`` and ``choices`` may be
    # functions, asked when a parser is made (a registry's entries registered after import).
    help: str | Callable[[], str] = ""
    output: str | None = None  # None, ALWAYS, WHEN_SET or BY_CONTENT (module docstring)
    fingerprint_key: str | None = None  # the key in the fingerprint; None: the field's name
    fingerprint_value: Callable[[Any], Any] | None = None  # the value recorded; None: as is
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    switch: bool = False  # a flag without a value (``store_true``)
    repeatable: bool = False  # a flag given any number of times (argparse "append")
    # A flag whose value may be left out (argparse ``nargs="?"``): ``const`` is then its
    # value (``--synthesize-summary-calls`` alone: the packaged prompt).
    nargs: str | None = None
    const: Any = None
    to_field: Callable[[Any], Any] | None = None  # flag value → field value
    to_flag: Callable[[Any], Any] | None = None  # field default → the flag's default
    check: Callable[[Any], bool] | None = None  # the flag's value must pass it...
    error: str = ""  # ...else this line (a usage error; "{value}" is the value given)
    group: str | None = None  # the argparse group the flag is listed under
    # A flag that sets other fields too (``--std``: use_std and std_ddof): flag value →
    # {field: value}; each of those fields names this flag in ``set_by``.
    sets: Callable[[Any], dict[str, Any]] | None = None
    set_by: str | None = None  # the flag of another field that sets this one
    flag_default: Any = DERIVED  # the flag's default when ``sets`` derives the field

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ValueError(f"Option.output must be one of {OUTPUTS}, not {self.output!r}")


# What a field's output role is, not how its flag reads: ``flag_of`` leaves these out.
_OUTPUT_PARTS = ("output", "fingerprint_key", "fingerprint_value")


def option(default: Any = dataclasses.MISSING, *, factory: Any = None, **spec: Any) -> Any:
    """A dataclass field with its ``Option`` (keyword arguments as ``Option``'s)."""
    metadata = {"option": Option(**spec)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def in_mib() -> dict[str, Any]:
    """``option``'s keyword arguments for a field in bytes that its flag gives in MiB (the
    input limits, the gateway's and the LLM judge's response caps): one conversion for all."""
    return {
        "type": float,
        "metavar": "MB",
        "to_flag": lambda b: b / MIB,
        "to_field": lambda mb: int(mb * MIB),
    }


def nested(factory: Callable[[], Any], **spec: Any) -> Any:
    """A field holding a config dataclass whose own fields carry the flags (e.g. the
    record limits); ``spec`` says how the whole value enters the fingerprint."""
    return dataclasses.field(
        default_factory=factory, metadata={"option": Option(**spec), "nested": True}
    )


def flag_of(config_class: type, name: str) -> dict[str, Any]:
    """The flag of ``config_class.name`` (flag, help, type, check, ...) as ``option``'s
    keyword arguments, for a field of another config that is set by the same flag: one
    definition under two names (the SFT filters' ``max_tokens`` is ``--max-length``). The
    field says itself how it enters its own fingerprint."""
    field = next(f for f in dataclasses.fields(config_class) if f.name == name)
    spec = option_of(field)
    assert spec is not None and spec.flag is not None, f"{config_class.__name__}.{name}"
    return {
        f.name: getattr(spec, f.name)
        for f in dataclasses.fields(Option)
        if f.name not in _OUTPUT_PARTS and getattr(spec, f.name) != f.default
    }


def option_of(field: dataclasses.Field) -> Option | None:
    return field.metadata.get("option")


def field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def flag_default(field: dataclasses.Field) -> Any:
    """The flag's default: derived from the field's (the one definition)."""
    spec = option_of(field)
    assert spec is not None
    if spec.flag_default is not DERIVED:
        return spec.flag_default
    default = field_default(field)
    if spec.switch:
        return False
    return spec.to_flag(default) if spec.to_flag is not None else default


def flagged_fields(config_class: type) -> Iterator[dataclasses.Field]:
    """The fields of ``config_class`` (nested configs' fields included) that have a flag."""
    for f in dataclasses.fields(config_class):
        spec = option_of(f)
        if f.metadata.get("nested"):
            yield from flagged_fields(_nested_class(f))
        elif spec is not None and spec.flag is not None:
            yield f


def _nested_class(field: dataclasses.Field) -> type:
    return type(field_default(field))


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    config_class: type,
    skip: tuple[str, ...] = (),
    only: tuple[str, ...] | None = None,
) -> None:
    """Add the flag of every field of ``config_class`` (and of its nested configs) to
    ``parser``, but those of the fields named in ``skip`` (or, given ``only``, those of the
    fields it names alone): flags with a ``group`` under that argparse group."""
    groups: dict[str, Any] = {}
    for f in flagged_fields(config_class):
        if f.name in skip or (only is not None and f.name not in only):
            continue
        spec = option_of(f)
        assert spec is not None and spec.flag is not None
        target: Any = parser
        if spec.group is not None and isinstance(parser, argparse.ArgumentParser):
            if spec.group not in groups:
                groups[spec.group] = _group(parser, spec.group)
            target = groups[spec.group]
        target.add_argument(spec.flag, **_argparse_kwargs(f))


def _group(parser: argparse.ArgumentParser, title: str) -> Any:
    for group in parser._action_groups:  # a second config adding to the same group
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def _argparse_kwargs(field: dataclasses.Field) -> dict[str, Any]:
    spec = option_of(field)
    assert spec is not None
    default = flag_default(field)
    kwargs: dict[str, Any] = {"help": help_text(field)}
    if spec.switch:
        kwargs["action"] = "store_true"
        return kwargs
    if spec.required:
        kwargs["required"] = True
    else:
        kwargs["default"] = default
    if spec.repeatable:  # its default a list: argparse appends to a copy of it
        kwargs["action"] = "append"
    if spec.type is not None:
        kwargs["type"] = spec.type
    if spec.metavar is not None:
        kwargs["metavar"] = spec.metavar
    if spec.choices is not None:
        kwargs["choices"] = list(spec.choices() if callable(spec.choices) else spec.choices)
    if spec.nargs is not None:
        kwargs["nargs"] = spec.nargs
        kwargs["const"] = spec.const
    return kwargs


def help_text(field: dataclasses.Field) -> str:
    spec = option_of(field)
    assert spec is not None
    default = flag_default(field)
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        shown = str(default)
    elif isinstance(default, float):
        shown = f"{default:g}"
    else:  # thousands separated from five digits on (100,000; 1024)
        shown = f"{default:,}" if default >= 10_000 else str(default)
    text = spec.help() if callable(spec.help) else spec.help
    return text.replace("{default}", shown)


def dest_of(flag: str) -> str:
    """argparse's attribute for a flag (``--max-line-mb`` → ``max_line_mb``)."""
    return flag.lstrip("-").replace("-", "_")


def values_from_args(config_class: type, args: argparse.Namespace) -> dict[str, Any]:
    """The values of the fields of ``config_class`` that ``args`` sets through their flags,
    checked and converted (``to_field``). A flag the command does not have leaves its
    field out (the dataclass default applies); nested configs are built the same way."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config_class):
        spec = option_of(f)
        if spec is None:
            continue
        if f.metadata.get("nested"):
            values[f.name] = _nested_class(f)(**values_from_args(_nested_class(f), args))
            continue
        if spec.flag is None or not hasattr(args, dest_of(spec.flag)):
            continue
        given = getattr(args, dest_of(spec.flag))
        if spec.check is not None and given is not None and not spec.check(given):
            raise UsageError(spec.error.replace("{value}", str(given)))
        if spec.sets is not None:
            values.update(spec.sets(given))
        else:
            values[f.name] = spec.to_field(given) if spec.to_field is not None else given
    return values


def config_from_args(config_class: type, args: argparse.Namespace, **given: Any) -> Any:
    """``config_class`` from a parsed command line (``values_from_args``) and ``given``."""
    return config_class(**given, **values_from_args(config_class, args))


def fingerprint_of(config: Any) -> dict[str, Any]:
    """What of ``config`` decides the output bytes, by its fields' ``Option.output``."""
    fingerprint: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        spec = option_of(f)
        if spec is None or spec.output in (None, BY_CONTENT):
            continue
        value = getattr(config, f.name)
        if spec.output == WHEN_SET and (not value or value == field_default(f)):
            continue  # unset, empty or the default: as before the option existed
        key = spec.fingerprint_key or f.name
        fingerprint[key] = spec.fingerprint_value(value) if spec.fingerprint_value else value
    return fingerprint
