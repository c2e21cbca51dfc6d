"""A message's piece rendered without Jinja, where the chat template provably does not read its text.

Most of a build's render time is the template re-running for messages that differ only in
their text (tool results, assistant turns). When a template only *places* a message's text
in its output — never compares it, measures it, searches it, slices it, or passes it to a
function — the piece of every message of the same **shape** is one fixed sequence of
constant strings and message texts. This module finds that sequence once per shape and
fills it in after; a shape whose render looks into a text is rendered by Jinja, as before.

**Shape** (``flatten``): the message dict's structure with its texts left out — the key
order of every dict, the length of every list, the value of the ``role`` and ``type``
strings, the type and value of every non-string scalar, which text fields are empty, which
tool-call arguments are mappings and whether they are empty. The **texts** (every other
non-empty string, and each tool call's ``arguments`` mapping) are the shape's slots.

**How the sequence is found** (``_analyse``): the template renders the message once more,
in a copy of seam's Jinja environment, with each slot replaced by a stand-in — a ``str``
(or ``dict``) subclass whose characters are a marker naming the slot — and every way a
template can look at a value reports a stand-in that reaches it:

- the stand-in's own operators (``==``, ``<``, ``len``, ``in`` with it as the haystack,
  iteration, indexing, hashing, ``%``, ``*``) and the sandbox's attribute, item, call and
  operator hooks (methods such as ``.split`` or ``.startswith`` are attributes);
- every filter and test (wrapped): a stand-in may reach only the type tests (``string``,
  ``mapping``, ``defined``, ``none`` …, answered by ``isinstance`` alike for the stand-in and
  the text), ``length``/``first``/``last``/``list``/``default`` (whose only look inside a
  stand-in is one of its own operators), and ``tojson`` of a slot itself, which becomes a
  slot of its own (the fill calls the same filter on the text);
- every call: macros and the ``generation`` tag take stand-ins (their output is turned
  back into a stand-in of the pieces it joins); other callees must be pure
  (``namespace``, ``dict``, ``range``, ``cycler``/``joiner``, loop helpers, methods of
  plain ``str``/``list``/``dict``/``tuple`` values) and receive no stand-in, at any depth;
  ``strftime_now`` (the clock), ``lipsum`` (random) and anything else end the analysis;
- ``+`` joins stand-ins and strings into a stand-in of the joined pieces (its truth value
  is the text's: every slot text is non-empty, so a join with a slot is non-empty);
- what no hook sees is refused by reading the template's syntax tree (``_unsupported``):
  ``a in b`` where ``a`` is not a literal (``str`` searches its haystack for a needle's
  characters without calling the needle), ``~`` and ``{% set %}…{% endset %}`` (they join
  text into a plain string that later expressions could inspect), ``{% autoescape %}``
  (``escape`` reads the characters) and anything that loads another template.

Any report, and any error, marks the shape: its messages render through Jinja. Otherwise
the only facts about a text the render used are its truth value and its type — both part
of the shape — so for every message of that shape the template takes the same steps and
writes the same constants, with each slot's text (or its ``tojson``) where the marker is.
``tests/core/test_render_shapes.py`` checks this against Jinja on generated messages for
every bundled template and shows each way of looking at a text being refused.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Callable
from typing import Any

import jinja2
import jinja2.nodes
import jinja2.runtime
import jinja2.utils

from pipeline.core.chat_jinja import (
    MAX_RENDERED_CHARS,
    _BoundedSandbox,
    _DictConstructor,
    _GenerationTag,
    _Namespace,
    chat_environment,
    render_bounded_parts,
)
from pipeline.core.junctions import Piece
from pipeline.core.render import call_arguments, template_message
from schemas.rollout import MessageEvent

# Strings whose value is part of a message's shape: a handful of values each, and templates
# branch on them (``message.role == "user"``, ``call.type``).
SHAPE_KEYS = frozenset({"role", "type"})
MAX_SHAPES = 4096  # shapes remembered per template (a build sees a few dozen)

_NONCE = secrets.token_hex(8)  # markers no template constant can contain by chance
_MARKER = re.compile(f"\x00{_NONCE}:([0-9]+)\x00")
_DICT, _LIST, _END, _TEXT, _EMPTY, _MAP, _EMPTY_MAP = range(7)  # shape tokens (keys are str)


class Unsupported(Exception):
    """A message holds a value ``flatten`` does not describe (never from ``template_message``)."""


def flatten(message: dict) -> tuple[tuple, list]:
    """(shape, texts) of a template message; ``texts`` in the order ``_standins`` numbers them."""
    shape: list = []
    texts: list = []
    _walk(message, None, shape, texts)
    return tuple(shape), texts


def _walk(value: Any, key: str | None, shape: list, texts: list) -> None:
    kind = type(value)
    if kind is str:
        if key in SHAPE_KEYS:
            shape.append(value)
        elif value:
            shape.append(_TEXT)
            texts.append(value)
        else:
            shape.append(_EMPTY)
    elif kind is dict:
        if key == "arguments":  # a tool call's arguments: one slot, never looked into
            shape.append(_MAP if value else _EMPTY_MAP)
            texts.append(value)
            return
        shape.append(_DICT)
        for k, v in value.items():
            if type(k) is not str:
                raise Unsupported("a dict key that is not a string")
            shape.append(k)
            _walk(v, k, shape, texts)
        shape.append(_END)
    elif kind is list:
        shape.append(_LIST)
        for v in value:
            _walk(v, None, shape, texts)
        shape.append(_END)
    elif value is None or kind in (bool, int, float):
        shape.append((kind, value))
    else:
        raise Unsupported(f"a value of type {kind.__name__}")


def flatten_event(msg: MessageEvent) -> tuple[tuple, list]:
    """``flatten(template_message(msg))``, read off the canonical message without building
    the dict (a build flattens every message it renders: the dict and the walk over it
    cost about as much as filling in the piece). Keys, in ``template_message``'s order:
    role, content, reasoning_content (when set), tool_calls (id, type, function: name,
    arguments), tool_call_id and name (tool messages)."""
    content = msg.content
    shape: list = [_DICT, "role", msg.role, "content"]
    texts: list = []
    if content:
        shape.append(_TEXT)
        texts.append(content)
    else:
        shape.append(_EMPTY)
    if msg.reasoning:
        shape += ("reasoning_content", _TEXT)
        texts.append(msg.reasoning)
    if msg.tool_calls:
        shape += ("tool_calls", _LIST)
        for call in msg.tool_calls:
            shape += (_DICT, "id")
            _text(call.id, shape, texts)
            shape += ("type", "function", "function", _DICT, "name")
            _text(call.name, shape, texts)
            shape.append("arguments")
            args = call_arguments(call.arguments)
            if isinstance(args, dict):  # one slot, never looked into (``_walk``)
                shape.append(_MAP if args else _EMPTY_MAP)
                texts.append(args)
            else:
                _text(args, shape, texts)
            shape += (_END, _END)
        shape.append(_END)
    if msg.role == "tool":
        shape.append("tool_call_id")
        _walk(msg.tool_call_id, "tool_call_id", shape, texts)
        if msg.name:
            shape += ("name", _TEXT)
            texts.append(msg.name)
    shape.append(_END)
    return tuple(shape), texts


def _text(value: str, shape: list, texts: list) -> None:
    """A text that is no shape key, as ``_walk`` describes it."""
    if value:
        shape.append(_TEXT)
        texts.append(value)
    else:
        shape.append(_EMPTY)


# -- stand-ins ------------------------------------------------------------------------------


class _Observed(BaseException):
    """The template looked into a stand-in. A ``BaseException``: Jinja's and the tests'
    ``except Exception`` (``test_sequence``) must not turn it into an answer."""


class _Analysis(threading.local):
    """The analysis running on this thread: its slots and whether a stand-in was read."""

    slots: list | None = None  # index -> ("text", i) | ("filter", fn, slot, args, kwargs)
    observed: str | None = None


_current = _Analysis()


def _observe(what: str) -> _Observed:
    _current.observed = _current.observed or what
    return _Observed(what)


def _marker(slot: int) -> str:
    return f"\x00{_NONCE}:{slot}\x00"


class _Text(str):
    """A stand-in for text: its characters are the markers of the slots it joins."""

    def __bool__(self) -> bool:  # slots are non-empty texts, so any join with one is too
        return True

    def __add__(self, other):
        if isinstance(other, str):
            return _Text(str.__str__(self) + str.__str__(other))
        raise _observe("+ with a non-string")

    def __radd__(self, other):
        if isinstance(other, str):
            return _Text(str.__str__(other) + str.__str__(self))
        raise _observe("+ with a non-string")

    def __str__(self) -> str:
        return str.__str__(self)

    def _look(self, *args, **kwargs):
        raise _observe("an operator on a text")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _look
    __hash__ = __len__ = __iter__ = __contains__ = __getitem__ = _look
    __mul__ = __rmul__ = __mod__ = __rmod__ = __format__ = __int__ = __float__ = _look
    __reversed__ = __getnewargs__ = __repr__ = _look


class _Mapping(dict):
    """A stand-in for a tool call's arguments mapping: empty, with the real one's truth value."""

    def __init__(self, slot: int, truth: bool):
        super().__init__()
        self.slot = slot
        self.truth = truth

    def __bool__(self) -> bool:
        return self.truth

    def _look(self, *args, **kwargs):
        raise _observe("an operator on a mapping")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _look
    __hash__ = __len__ = __iter__ = __contains__ = __getitem__ = _look  # type: ignore[assignment]
    __or__ = __ror__ = __reversed__ = __str__ = __repr__ = __format__ = _look


def _standins(message: dict, texts: list) -> dict:
    """``message`` with slot ``i`` (``texts[i]``) replaced by its stand-in (``_walk``'s order)."""
    count = iter(range(len(texts)))

    def build(value, key):
        kind = type(value)
        if kind is str:
            return value if key in SHAPE_KEYS or not value else _Text(_marker(next(count)))
        if kind is dict:
            if key == "arguments":
                return _Mapping(next(count), bool(value))
            return {k: build(v, k) for k, v in value.items()}
        if kind is list:
            return [build(v, None) for v in value]
        return value

    return build(message, None)


def _holds_standin(value, depth: int = 0) -> bool:
    """Whether ``value`` holds a stand-in or marked text anywhere inside (containers walked)."""
    if isinstance(value, (_Text, _Mapping)):
        return True
    if isinstance(value, str):
        return _NONCE in value
    if depth > 50:
        return True  # too deep to check: treat as holding one
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds_standin(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(
            _holds_standin(k, depth + 1) or _holds_standin(v, depth + 1) for k, v in value.items()
        )
    if isinstance(value, jinja2.utils.Namespace):
        return _holds_standin(dict(value._Namespace__attrs), depth + 1)
    return False


def _plain(part: str) -> str:
    """A written part as plain text (a call block's output is written without ``str()``)."""
    return str.__str__(part) if isinstance(part, _Text) else part


def _rejoin(text: str) -> str:
    """Text written by a macro or call block: a stand-in again when it holds markers."""
    return _Text(text) if _NONCE in text else text


# -- the analysis environment ---------------------------------------------------------------

# Tests whose answer is ``isinstance``/identity alone: the same for a stand-in and its text.
_TYPE_TESTS = frozenset(
    {"defined", "undefined", "none", "string", "mapping", "number", "integer", "float"}
    | {"boolean", "true", "false", "callable"}
)
# Filters that look inside a value only through its own operators (len, iter, truth).
_STRUCTURE_FILTERS = frozenset({"length", "count", "first", "last", "list", "default", "d"})


def _wrap_filter(name: str, fn: Any) -> Callable:
    passes = jinja2.utils._PassArg.from_obj(fn) is not None  # first argument: context/env

    def wrapped(*args, **kwargs):
        own = args[1:] if passes else args
        if name in _STRUCTURE_FILTERS:
            return fn(*args, **kwargs)
        source = _slot_of(own[0]) if own and isinstance(own[0], (_Text, _Mapping)) else None
        if (
            name == "tojson"
            and not passes
            and source is not None
            and not _holds_standin((own[1:], kwargs))
        ):
            slots = _current.slots
            assert slots is not None
            if slots[source][0] != "text":
                raise _observe("tojson of a tojson")
            slots.append(("filter", fn, slots[source][1], own[1:], kwargs))
            return _Text(_marker(len(slots) - 1))
        if _holds_standin((own, kwargs)):
            raise _observe(f"filter {name}")
        return fn(*args, **kwargs)

    wrapped.__dict__.update(getattr(fn, "__dict__", {}))  # keeps jinja_pass_arg
    return wrapped


def _wrap_test(name: str, fn: Any) -> Callable:
    passes = jinja2.utils._PassArg.from_obj(fn) is not None

    def wrapped(*args, **kwargs):
        if name not in _TYPE_TESTS and _holds_standin((args[1:] if passes else args, kwargs)):
            raise _observe(f"test {name}")
        return fn(*args, **kwargs)

    wrapped.__dict__.update(getattr(fn, "__dict__", {}))
    return wrapped


def _slot_of(value) -> int | None:
    """The slot a stand-in is exactly (not a join of several), else None."""
    if isinstance(value, _Mapping):
        return value.slot
    found = _MARKER.fullmatch(str.__str__(value))
    return int(found.group(1)) if found else None


_PURE_TYPES = (str, list, dict, tuple)
_PURE_OBJECTS = (
    _DictConstructor,
    jinja2.utils.Cycler,
    jinja2.utils.Joiner,
    jinja2.runtime.LoopContext,
)


def _pure(fn) -> bool:
    """Callees whose result depends on their arguments alone (no clock, no randomness)."""
    if fn is _Namespace or isinstance(fn, _PURE_OBJECTS) or fn is range:
        return True
    owner = getattr(fn, "__self__", None)
    return type(owner) in _PURE_TYPES or isinstance(owner, _PURE_OBJECTS)


class _AnalysisSandbox(_BoundedSandbox):
    """seam's sandbox, reporting every stand-in that reaches an attribute, item, call or operator.

    Every binary operator goes through ``call_binop`` here (the real environment runs
    ``+ - / // %`` inline; the result is the same operator): ``'%s' % (text,)`` would
    otherwise format a stand-in's characters into a plain string."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def getattr(self, obj, attribute):
        if isinstance(obj, (_Text, _Mapping)):
            raise _observe(f"attribute {attribute!r} of a text")
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        if _holds_standin(obj if isinstance(obj, (_Text, _Mapping)) else argument):
            raise _observe("an item of or by a text")
        return super().getitem(obj, argument)

    def call(__self, __context, __obj, *args, **kwargs):  # Jinja's own signature
        # Macros, call blocks and the generation tag may take texts: what they write is
        # only placed. Their output (and a recursive loop's) is joined text: a stand-in again.
        if not (isinstance(__obj, jinja2.runtime.Macro) or _is_generation_body(__obj)):
            if not _pure(__obj):
                raise _observe("a call of an impure or unknown callable")
            if _holds_standin((args, kwargs)):
                raise _observe("a text passed to a callable")
        result = super().call(__context, __obj, *args, **kwargs)
        return _rejoin(result) if type(result) is str else result

    def call_binop(self, context, operator, left, right):
        if operator == "+" and isinstance(left, str) and isinstance(right, str):
            return left + right  # a stand-in joins (``_Text.__add__``)
        if _holds_standin((left, right)):
            raise _observe(f"operator {operator} on a text")
        return super().call_binop(context, operator, left, right)


def _is_generation_body(fn) -> bool:
    return isinstance(getattr(fn, "__self__", None), _GenerationTag) and fn.__name__ == "_body"


_REFUSED_NODES = (
    jinja2.nodes.Concat,
    jinja2.nodes.AssignBlock,
    jinja2.nodes.EvalContextModifier,
    jinja2.nodes.Extends,
    jinja2.nodes.Include,
    jinja2.nodes.Import,
    jinja2.nodes.FromImport,
)


def _unsupported(env: jinja2.Environment, source: str) -> str | None:
    """Why no shape of this template can skip Jinja (syntax a stand-in cannot watch), or None."""
    tree = env.parse(source)
    for node in tree.find_all(_REFUSED_NODES):
        return f"{type(node).__name__} in the template"
    for node in tree.find_all(jinja2.nodes.Compare):
        left = node.expr
        for operand in node.ops:
            if operand.op in ("in", "notin") and not isinstance(left, jinja2.nodes.Const):
                return "'in' with a needle that is not a literal"
            left = operand.expr
    return None


def _analysis_environment() -> jinja2.Environment:
    env = chat_environment(_AnalysisSandbox)
    env.filters = {name: _wrap_filter(name, fn) for name, fn in env.filters.items()}
    env.tests = {name: _wrap_test(name, fn) for name, fn in env.tests.items()}
    return env


# -- pieces ---------------------------------------------------------------------------------

Skeleton = tuple  # constant strings and slot descriptions, in output order
_UNSEEN: Any = object()  # a shape not analysed yet


class ShapeRenderer:
    """Pieces of non-first messages, ``render(base + [m]) − render(base)``, by shape.

    ``piece`` returns None where the shape renders through Jinja (the caller renders it).
    """

    def __init__(self, source: str, base: list[dict], base_text: str, variables: dict):
        self.base = base
        self.base_text = base_text
        self.variables = variables  # tools, add_generation_prompt and the special tokens
        env = _analysis_environment()
        self.refused = _unsupported(env, source)
        self._template = None if self.refused else env.from_string(source)
        self._skeletons: dict[tuple, Skeleton | None] = {}
        # Per shape: its skeleton and which of its parts are constants (None: Jinja renders
        # it), found with one lookup per message.
        self._plans: dict[tuple, tuple[Skeleton, tuple[bool, ...]] | None] = {}
        # Per shape: its output's skeleton, which parts are constants, its trailer and the
        # characters of the piece around the output (``output_pair``; None: cut the piece).
        self._splits: dict[tuple, tuple[Skeleton, tuple[bool, ...], str, int] | None] = {}
        self._split_by: tuple[str, str] | None = None  # the (gen, eos) of ``_splits``

    def _flattened(self, message: dict | MessageEvent) -> tuple[tuple, list] | None:
        """(shape, texts) of ``message`` (a template message, or a canonical one read as
        ``template_message`` writes it), or None where Jinja renders every message."""
        if self._template is None:
            return None
        try:
            return flatten(message) if isinstance(message, dict) else flatten_event(message)
        except Unsupported:
            return None

    def piece(self, message: dict | MessageEvent) -> Piece | None:
        flat = self._flattened(message)
        if flat is None:
            return None
        shape, texts = flat
        plan = self._plan_of(shape, message, texts)
        if plan is None:
            return None
        skeleton, fixed = plan
        parts = _filled(skeleton, texts)
        if sum(map(len, parts)) + len(self.base_text) > MAX_RENDERED_CHARS:
            return None  # Jinja raises the size error
        return Piece.of(parts, fixed)

    def output_pair(
        self, message: dict | MessageEvent, gen: str, eos: str
    ) -> tuple[Piece, str] | None:
        """``piece(message)`` after the generation prompt ``gen``, split after its last
        ``eos``: (output, trailer), equal in text and parts to what cutting the piece gives
        (``ChatRenderer._split_output_at``). Where the shape's first part is template text
        that starts with ``gen`` and its last is template text holding ``eos``, the cut
        falls at the same place in every piece of the shape (``eos`` found last in the
        piece is found in its last part, which ends it): the split is found once per
        shape and only the output's parts are filled in, instead of filling the whole
        piece, searching it for ``eos`` and cutting it twice at every assistant message.
        None where the caller cuts the piece itself (another shape, or Jinja renders it)."""
        if (gen, eos) != self._split_by:  # the splits hold for one prompt and one token
            self._splits.clear()
            self._split_by = (gen, eos)
        flat = self._flattened(message)
        if flat is None:
            return None
        shape, texts = flat
        split = self._splits.get(shape, _UNSEEN)
        if split is _UNSEEN:
            plan = self._plan_of(shape, message, texts)
            split = None if plan is None else _output_split(plan[0], gen, eos)
            if len(self._splits) < MAX_SHAPES:
                self._splits[shape] = split
        if split is None:
            return None
        skeleton, fixed, trailer, around = split
        parts = _filled(skeleton, texts)
        if sum(map(len, parts)) + around + len(self.base_text) > MAX_RENDERED_CHARS:
            return None  # the piece is over the limit: Jinja raises the size error
        return Piece.of(parts, fixed), trailer

    def _plan_of(
        self, shape: tuple, message: dict | MessageEvent, texts: list
    ) -> tuple[Skeleton, tuple[bool, ...]] | None:
        """The shape's plan: known (one lookup per message), or made now (``_plan``)."""
        plan = self._plans.get(shape, _UNSEEN)
        return self._plan(shape, message, texts) if plan is _UNSEEN else plan

    def _plan(
        self, shape: tuple, message: dict | MessageEvent, texts: list
    ) -> tuple[Skeleton, tuple[bool, ...]] | None:
        """A new shape's skeleton (``_analyse``) and which of its parts are the template's
        own text: what the tokenizer may cut at (``junctions``)."""
        assert self._template is not None  # ``piece`` asks only then
        if not isinstance(message, dict):  # the analysis renders the template message
            message = template_message(message)
        skeleton = self._analyse(self._template, message, texts)
        plan = None if skeleton is None else (skeleton, tuple(type(p) is str for p in skeleton))
        if len(self._plans) < MAX_SHAPES:
            self._skeletons[shape] = skeleton
            self._plans[shape] = plan
        return plan

    def _analyse(self, template: jinja2.Template, message: dict, texts: list) -> Skeleton | None:
        """The skeleton of this shape's piece, or None when the render looked into a text."""
        _current.slots = [("text", i) for i in range(len(texts))]
        _current.observed = None
        try:
            variables = {**self.variables, "messages": [*self.base, _standins(message, texts)]}
            rendered = render_bounded_parts(template, variables, _plain)
        except _Observed:
            return None
        except Exception:
            return None  # Jinja renders this shape (and raises the same error)
        finally:
            slots, _current.slots = _current.slots, None
        if _current.observed is not None or not rendered.startswith(self.base_text):
            return None
        return _skeleton(rendered[len(self.base_text) :], slots)


def _filled(skeleton: Skeleton, texts: list) -> list[str]:
    """The parts of a piece of ``skeleton``'s shape: constants, texts and filtered texts."""
    return [
        part
        if type(part) is str
        else texts[part]
        if type(part) is int
        else part[0](texts[part[1]], *part[2], **part[3])
        for part in skeleton
    ]


def _output_split(
    skeleton: Skeleton, gen: str, eos: str
) -> tuple[Skeleton, tuple[bool, ...], str, int] | None:
    """A shape's output skeleton, which of its parts are constants, its trailer and how
    many characters of the piece lie outside the output (``ShapeRenderer.output_pair``),
    or None where the cut is not the same for every piece of the shape: the first part is
    not template text starting with ``gen``, the last is not template text holding
    ``eos``, or the output holds no text of the message. The output's parts are those a
    cut of the piece keeps (``Piece.cut``): the first part after ``gen`` (left out where
    nothing remains of it), the parts between, the last part up to the end of its last
    ``eos``."""
    if len(skeleton) < 2 or type(skeleton[0]) is not str or type(skeleton[-1]) is not str:
        return None
    first, last = skeleton[0], skeleton[-1]
    at = last.rfind(eos)
    if not first.startswith(gen) or at < 0:
        return None
    end = at + len(eos)
    head = first[len(gen) :]
    output = ((head,) if head else ()) + skeleton[1:-1] + (last[:end],)
    if all(type(p) is str for p in output):
        return None  # template text only: a cut makes it a plain string, not a ``Piece``
    return output, tuple(type(p) is str for p in output), last[end:], len(gen) + len(last) - end


def _skeleton(rendered: str, slots: list) -> Skeleton:
    parts: list = []
    for i, chunk in enumerate(_MARKER.split(rendered)):
        if i % 2 == 0:
            if chunk:
                parts.append(chunk)
            continue
        slot = slots[int(chunk)]
        if slot[0] == "text":
            parts.append(slot[1])  # the message's i-th text
        else:
            parts.append(slot[1:])  # (filter, i, args, kwargs): the filter of the i-th text
    return tuple(parts)
