"""Compile chat templates the way ``apply_chat_template`` does, without importing transformers.

Importing ``transformers`` costs about 0.6 s per process, more than a whole small
build's serial part; the build needs only its Jinja environment. This module sets one up
with the same semantics as transformers' chat-template compiler:

- an immutable sandbox (chat templates from the Hub are untrusted code), with
  ``trim_blocks`` and ``lstrip_blocks`` and the ``loopcontrols`` extension;
- ``tojson`` that does not HTML-escape (``json.dumps`` with ``ensure_ascii=False``,
  optional ``indent``, ``separators`` and ``sort_keys``);
- globals ``raise_exception``, ``strftime_now``, a ``dict`` constructor and a
  ``namespace`` that refuses underscore-prefixed names;
- the ``{% generation %}…{% endgeneration %}`` tag, rendered as its body (seam computes
  masks from pieces, not from generation indices).

``tests/test_render.py`` renders random conversations with this environment and with
``transformers``' ``apply_chat_template`` and requires identical text.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}body{% endgeneration %}`` renders ``body``."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _DictConstructor:
    """``dict(...)`` for templates, without exposing the ``dict`` type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's ``namespace`` that refuses names starting with ``_`` (no dunder access)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set {name!r} on a namespace"
            )


@lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictConstructor()
    env.globals["namespace"] = _Namespace
    return env.from_string(source)
