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
  masks from pieces, not from generation indices);
- bounded values: ``'x' * 10**10``, ``messages * 10**9`` or a huge ``**`` would allocate
  gigabytes in one expression, so ``*`` and ``**`` results are capped
  (``MAX_TEMPLATE_VALUE``) and raise ``SecurityError`` past it (Jinja's sandbox already
  caps ``range``).

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


MAX_TEMPLATE_VALUE = 1 << 24  # characters or items one `*` may produce; digits for `**`


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with ``*`` and ``**`` checked before they allocate."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if (
                    isinstance(seq, (str, list, tuple))
                    and isinstance(times, int)
                    and len(seq) * times > MAX_TEMPLATE_VALUE
                ):
                    raise jinja2.exceptions.SecurityError(
                        f"a chat template multiplied a {type(seq).__name__} of {len(seq):,} "
                        f"by {times:,}: over {MAX_TEMPLATE_VALUE:,} items"
                    )
        # The result's bits are about right * log2(left); an int that long is already huge.
        if (
            operator == "**"
            and isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and right * abs(left).bit_length() > MAX_TEMPLATE_VALUE
        ):
            raise jinja2.exceptions.SecurityError(
                f"a chat template raised {left} to the power {right:,}: too large"
            )
        return super().call_binop(context, operator, left, right)


@lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    env = _BoundedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictConstructor()
    env.globals["namespace"] = _Namespace
    return env.from_string(source)
