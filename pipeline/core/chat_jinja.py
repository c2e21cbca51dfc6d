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
  caps ``range``); so are values stored in a ``namespace``, the only state a loop can
  carry, so a string doubled with ``~`` or ``+`` in a loop stops at the cap;
- bounded renders (``render_bounded``): one render may run ``MAX_RENDER_SECONDS`` and
  write ``MAX_RENDERED_CHARS``; the sandbox's attribute, item, call and operator hooks
  count steps and check the clock, so a template stuck in nested loops fails with
  ``SecurityError`` instead of stalling a worker.

``tests/core/test_chat_jinja.py`` renders conversations with this environment and with
``transformers``' ``apply_chat_template`` and requires identical text.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.runtime
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
    if not ensure_ascii and indent is None and separators is None and not sort_keys:
        return _TOJSON.encode(x)  # what json.dumps does, without making an encoder per call
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


# ``json.dumps(x, ensure_ascii=False)`` builds this encoder for every call (its defaults are
# dumps'), ~2 µs for each tool call's arguments in a build.
_TOJSON = json.JSONEncoder(ensure_ascii=False)


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
        _check_size(value, "a namespace value")
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set {name!r} on a namespace"
            )


MAX_TEMPLATE_VALUE = 1 << 24  # characters or items one `*` may produce; digits for `**`
MAX_RENDER_SECONDS = 120.0  # one render of one context (a long context renders in < 1 s)
MAX_RENDERED_CHARS = 1 << 28  # text one render may write
_CLOCK_EVERY = 256  # sandbox steps between clock checks
_budget = threading.local()  # the deadline of the render running on this thread
_steps = [0]


def _check_size(value, what: str) -> None:
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_TEMPLATE_VALUE:
        raise jinja2.exceptions.SecurityError(
            f"a chat template built {what} of {len(value):,} items: over {MAX_TEMPLATE_VALUE:,}"
        )


def _tick() -> None:
    # A process-wide count (cheap; exactness does not matter), a per-thread deadline.
    _steps[0] += 1
    if _steps[0] % _CLOCK_EVERY == 0:
        _check_clock()


def _check_clock() -> None:
    if time.monotonic() > getattr(_budget, "deadline", float("inf")):
        raise jinja2.exceptions.SecurityError(
            f"a chat template ran for over {MAX_RENDER_SECONDS:g} s in one render"
        )


def render_bounded(template: jinja2.Template, **variables) -> str:
    """``template.render(**variables)`` within ``MAX_RENDER_SECONDS`` and ``MAX_RENDERED_CHARS``.

    The render runs the template's compiled root function on a context built as
    ``Template.new_context`` builds it (``_context``), and an error inside it is raised
    as ``Template.generate`` raises it (``handle_exception``)."""
    return render_bounded_parts(template, variables, None)


def render_bounded_parts(template: jinja2.Template, variables: dict, as_text) -> str:
    """``render_bounded``, each written part passed through ``as_text`` first when given
    (``render_shapes`` turns its stand-ins into their markers there)."""
    _budget.deadline = time.monotonic() + MAX_RENDER_SECONDS
    try:
        parts, size = [], 0
        try:
            for part in template.root_render_func(_context(template, variables)):
                if as_text is not None:
                    part = as_text(part)
                size += len(part)
                if size > MAX_RENDERED_CHARS:
                    raise jinja2.exceptions.SecurityError(
                        f"a chat template wrote over {MAX_RENDERED_CHARS:,} characters in one render"
                    )
                _tick()
                parts.append(part)
        except Exception:
            template.environment.handle_exception()
        return "".join(parts)
    finally:
        _budget.deadline = float("inf")


_FLAT_GLOBALS: weakref.WeakKeyDictionary[jinja2.Template, dict] = weakref.WeakKeyDictionary()


def _context(template: jinja2.Template, variables: dict) -> jinja2.runtime.Context:
    """The context ``template.new_context(variables)`` makes: the template's globals
    overlaid with ``variables``, ``globals_keys`` the globals' names.

    ``new_context`` copies the globals out of their ``ChainMap`` (template globals over
    the environment's) at every render, and ``Context`` iterates that map once more for
    their names: a third of the time of a one-message render went there. The globals of a
    compiled chat template never change (``compile_chat_template`` sets them before
    compiling), so they are flattened once per template."""
    flat = _FLAT_GLOBALS.get(template)
    if flat is None:
        flat = _FLAT_GLOBALS[template] = dict(template.globals)
    return template.environment.context_class(
        template.environment, {**flat, **variables}, template.name, template.blocks, globals=flat
    )


# Every attribute a plain dict has (its type's and object's): ``message.role`` on a dict
# can only be one of these or the item ``message["role"]``.
_DICT_ATTRIBUTES = frozenset(dir(dict))


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with ``*`` and ``**`` checked before they allocate."""

    intercepted_binops = frozenset({"*", "**"})

    def getattr(self, obj, attribute):
        _tick()
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            # What the sandbox's getattr does for such a name, without raising and catching
            # an AttributeError first: a plain dict has no other attribute (no __dict__), so
            # ``getattr(obj, attribute)`` fails and the item is looked up, or is undefined.
            # Chat templates read message fields this way (``message.content``): ~40% of
            # a piece's render time went to that exception.
            try:
                return obj[attribute]
            except LookupError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _tick()
        return super().getitem(obj, argument)

    def call(__self, __context, __obj, *args, **kwargs):  # Jinja's own signature
        _tick()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator, left, right):
        _tick()
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


def chat_environment(kind: type[_BoundedSandbox]) -> _BoundedSandbox:
    """An environment of class ``kind`` set up as ``apply_chat_template``'s is."""
    env = kind(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictConstructor()
    env.globals["namespace"] = _Namespace
    return env


@lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    return chat_environment(_BoundedSandbox).from_string(source)
