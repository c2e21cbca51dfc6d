"""Pieces filled in by shape (``pipeline/core/render_shapes.py``) equal Jinja's, or are not used.

The property: for every template here and every generated message, the shape path either
declines (``None``: the caller renders through Jinja) or returns exactly the text Jinja
renders. The bundled templates and two Hub-style ones never read a text, so there the
shape path must also be *taken* for every message; the templates in ``LOOKS`` each read
a text in one way and must be declined for the shapes that reach it.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.chat_jinja import compile_chat_template, render_bounded
from pipeline.core.junctions import Piece
from pipeline.core.render import ChatRenderer, template_message
from pipeline.core.render_shapes import ShapeRenderer, _output_split, flatten, flatten_event
from pipeline.core.tokenizer import CHAT_TEMPLATES
from schemas.rollout import MessageEvent, ToolCall
from tests.examples import examples

BASE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
VARIABLES = {"tools": None, "add_generation_prompt": False, "eos_token": "<|im_end|>"}

# Hub-style templates that only place texts: Llama-3-like (tojson with options, ``default``,
# item access), and one with macros, the generation tag, ``is defined`` and ``loop``.
LLAMA_LIKE = (
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message.tool_calls is defined and message.tool_calls %}"
    "{%- for tc in message.tool_calls %}"
    '{{- \'{"name": "\' + tc.function.name + \'", "parameters": \' }}'
    "{{- tc.function.arguments | tojson(indent=2) }}{{- '}' }}"
    "{%- endfor %}"
    "{%- else %}{{- message['content'] | default('') }}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
)
MACROS = (
    "{%- macro wrap(tag, body) -%}<{{ tag }}>{{ body }}</{{ tag }}>{%- endmacro -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}{% generation %}{{ wrap('a', m.content or '') }}"
    "{% endgeneration %}"
    "{%- else -%}{{ wrap(m.role, m.content) }}{%- endif -%}"
    "{%- if m.reasoning_content is defined and m.reasoning_content %}[{{ m.reasoning_content }}]"
    "{%- endif -%}"
    "{%- if m.name is string %}({{ m.name }}){% endif -%}"
    "{{- loop.index }}|{{ loop.first }}"
    "{%- endfor -%}"
)
# Qwen3-style: reads the assistant's text ('</think>' in it, split, lstrip).
QWEN3_LIKE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}{%- set content = message.content %}"
    "{%- if '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
)
PLACING = {**CHAT_TEMPLATES, "llama-like": LLAMA_LIKE, "macros": MACROS}
TEMPLATES = {**PLACING, "qwen3-like": QWEN3_LIKE}

# Pieces of text a template might react to: its own markers, whitespace, JSON syntax.
MARKERS = ["</think>", "<think>", "<|im_end|>", "<|im_start|>", "\n", " ", "", '"', "\\", "{}"]
TEXTS = st.lists(
    st.one_of(st.sampled_from(MARKERS), st.text("ab é中🙂\x00\t{}[]:,", max_size=4)), max_size=5
).map("".join)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXTS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXTS, inner, max_size=3),
    max_leaves=6,
)


def chat_messages(texts, arguments, max_calls: int, tool_call_ids) -> st.SearchStrategy[dict]:
    """Chat-message dicts as ``template_message`` writes them, in every shape they can have:
    ``texts`` for every text, ``arguments`` for a tool call's, up to ``max_calls`` calls."""

    @st.composite
    def message(draw) -> dict:
        role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
        out: dict = {"role": role, "content": draw(texts)}
        if role == "assistant":
            if draw(st.booleans()):
                out["reasoning_content"] = draw(texts.filter(bool))
            calls = [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": draw(texts), "arguments": draw(arguments)},
                }
                for i in range(draw(st.integers(0, max_calls)))
            ]
            if calls:
                out["tool_calls"] = calls
        if role == "tool":
            out["tool_call_id"] = draw(tool_call_ids)
            if draw(st.booleans()):
                out["name"] = draw(texts.filter(bool))
        return out

    return message()


def messages() -> st.SearchStrategy[dict]:
    """Messages with any texts, JSON arguments and tool-call ids."""
    return chat_messages(
        TEXTS, st.one_of(st.dictionaries(TEXTS, JSON, max_size=3), TEXTS), 3, TEXTS
    )


def jinja_piece(source: str, message: dict) -> str:
    """``render(BASE + [m]) − render(BASE)`` through Jinja: the definition of a piece."""
    template = compile_chat_template(source)
    base = render_bounded(template, messages=BASE, **VARIABLES)
    full = render_bounded(template, messages=[*BASE, message], **VARIABLES)
    assert full.startswith(base)
    return full[len(base) :]


def shapes_for(source: str) -> ShapeRenderer:
    base = render_bounded(compile_chat_template(source), messages=BASE, **VARIABLES)
    return ShapeRenderer(source, BASE, base, VARIABLES)


@pytest.fixture(scope="module")
def renderers() -> dict[str, ShapeRenderer]:
    return {name: shapes_for(source) for name, source in TEMPLATES.items()}


@settings(
    max_examples=examples(150, 1000),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=messages())
def test_a_piece_by_shape_is_the_jinja_piece_or_declined(renderers, message):
    for name, source in TEMPLATES.items():
        got = renderers[name].piece(message)
        if name in PLACING:
            assert got is not None, name  # these templates never read a text
        if got is not None:
            assert got == jinja_piece(source, message), name
    if message["role"] == "assistant" and message["content"]:  # an empty text is not a slot
        assert renderers["qwen3-like"].piece(message) is None


# End-of-turn texts to split outputs at: each template's own, and a newline (also inside texts).
EOS = ["<|im_end|>", "<|eot_id|>", "</a>", "\n"]


def generation_prompt(source: str) -> str:
    template = compile_chat_template(source)
    without = render_bounded(template, messages=BASE, **VARIABLES)
    gen = {**VARIABLES, "add_generation_prompt": True}
    return render_bounded(template, messages=BASE, **gen)[len(without) :]


def cut_output(piece: str, gen: str, eos: str) -> tuple[str, str]:
    """What a renderer makes of a piece: cut after ``gen`` and after its last ``eos``."""
    assert piece.startswith(gen)
    return ChatRenderer._split_output_at(SimpleNamespace(eos_text=eos), piece, len(gen))


def same_cut(got: str, expected: str) -> bool:
    """Equal text, type (``Piece`` or plain) and, for a ``Piece``, parts."""
    if got != expected or type(got) is not type(expected):
        return False
    return type(got) is not Piece or (
        tuple(got.parts) == tuple(expected.parts) and tuple(got.fixed) == tuple(expected.fixed)
    )


@settings(
    max_examples=examples(100, 600),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=messages())
def test_an_output_split_by_shape_is_the_cut_of_its_piece(renderers, message):
    """``output_pair``'s split, found once per shape, is what cutting each piece gives:
    the same texts and the same parts (the tokenizer cuts at them)."""
    for name in PLACING:
        shapes, gen = renderers[name], generation_prompt(PLACING[name])
        for eos in EOS:
            got = shapes.output_pair(message, gen, eos)
            if got is None:
                continue
            expected = cut_output(shapes.piece(message), gen, eos)
            assert same_cut(got[0], expected[0]) and same_cut(got[1], expected[1]), (name, eos)


def test_an_output_split_is_found_once_per_shape_where_the_template_ends_the_turn():
    """Hand-checked on chatml-tools: an assistant turn's output ends at its <|im_end|>, the
    trailer is the newline after it, both kept per shape; a shape whose last part is a
    text (the cut would depend on the text) is left to the caller."""
    shapes = shapes_for(CHAT_TEMPLATES["chatml-tools"])
    gen = "<|im_start|>assistant\n"
    call = {"id": "c", "type": "function", "function": {"name": "grep", "arguments": {"q": "x"}}}
    message = {"role": "assistant", "content": "Looking.", "tool_calls": [call]}
    output, trailer = shapes.output_pair(message, gen, "<|im_end|>")
    assert (output, trailer) == (
        'Looking.\n<tool_call>\n{"name": "grep", "arguments": {"q": "x"}}\n</tool_call><|im_end|>',
        "\n",
    )
    assert output.parts[0] == "Looking." and not output.fixed[0]
    (split,) = shapes._splits.values()
    assert split is not None and split[2] == "\n"
    # The macros template writes the turn's number after its last text: no "\n" there.
    macros = shapes_for(MACROS)
    assert macros.output_pair({"role": "assistant", "content": "a"}, "", "\n") is None
    # An output of template text alone is a plain string when cut: left to the caller too.
    assert _output_split(("<a>", "</a>\n"), "<a>", "</a>") is None
    assert _output_split(("<a>", 0, "</a>\n"), "<a>", "</a>") == (
        (0, "</a>"),
        (False, True),
        "\n",
        4,
    )


ARGUMENTS = st.one_of(
    st.dictionaries(TEXTS, JSON, max_size=3).map(json.dumps),  # a JSON object, {} too
    JSON.map(json.dumps),  # any JSON value: an array, a string, a number...
    TEXTS,  # most are not JSON at all
)


@st.composite
def canonical_messages(draw) -> MessageEvent:
    """Canonical messages of every role, with the optional fields set or not."""
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    fields: dict = {"id": "m1", "role": role, "content": draw(TEXTS)}
    if role == "assistant":
        fields["reasoning"] = draw(st.none() | TEXTS)
        fields["tool_calls"] = [
            ToolCall(id=f"c{i}", name=draw(TEXTS.filter(bool)), arguments=draw(ARGUMENTS))
            for i in range(draw(st.integers(0, 3)))
        ]
    if role == "tool":
        fields["tool_call_id"] = draw(TEXTS.filter(bool))
        fields["name"] = draw(st.none() | TEXTS)
    return MessageEvent(**fields)


@settings(
    max_examples=examples(200, 1000),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=canonical_messages())
def test_a_canonical_message_flattens_as_its_template_message(renderers, message):
    """``flatten_event`` reads the shape and texts off the message as ``flatten`` reads them
    off ``template_message``'s dict, so both find the same piece (or both decline)."""
    as_dict = template_message(message)
    assert flatten_event(message) == flatten(as_dict)
    for name in ("chatml-tools", "llama-like", "qwen3-like"):
        shapes = renderers[name]
        assert shapes.piece(message) == shapes.piece(as_dict), name
    # A shape first met as a canonical message is analysed as its template message.
    source = CHAT_TEMPLATES["chatml-tools"]
    assert shapes_for(source).piece(message) == jinja_piece(source, as_dict)


def test_a_tool_result_piece_is_constants_around_its_text():
    """Hand-checked on chatml-tools: one shape, its constants, and the texts filled in."""
    shapes = shapes_for(CHAT_TEMPLATES["chatml-tools"])
    message = {"role": "tool", "content": 'a "b" </tool_response>', "tool_call_id": "c1"}
    assert shapes.piece(message) == (
        '<|im_start|>user\n<tool_response>\na "b" </tool_response>\n</tool_response><|im_end|>\n'
    )
    (skeleton,) = shapes._skeletons.values()
    assert skeleton == ("<|im_start|>user\n<tool_response>\n", 0, "\n</tool_response><|im_end|>\n")
    call = {"id": "c", "type": "function", "function": {"name": "grep", "arguments": {"q": "é"}}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    assert shapes.piece(message) == (
        '<|im_start|>assistant\n<tool_call>\n{"name": "grep", "arguments": {"q": "é"}}\n'
        "</tool_call><|im_end|>\n"
    )


def test_the_shape_leaves_texts_out_and_keeps_structure():
    a = {"role": "tool", "content": "x", "tool_call_id": "c1"}
    b = {"role": "tool", "content": "yy", "tool_call_id": "c2"}
    assert flatten(a)[0] == flatten(b)[0]
    assert flatten(a)[1] == ["x", "c1"]
    empty = {"role": "tool", "content": "", "tool_call_id": "c1"}
    reordered = {"role": "tool", "tool_call_id": "c1", "content": "x"}
    other_role = {"role": "user", "content": "x", "tool_call_id": "c1"}
    for other in (empty, reordered, other_role):
        assert flatten(other)[0] != flatten(a)[0]
    args = {"id": "c", "type": "function", "function": {"name": "n", "arguments": {}}}
    with_args = {**args, "function": {"name": "n", "arguments": {"k": 1}}}
    as_text = {**args, "function": {"name": "n", "arguments": "{"}}
    shapes = {
        flatten({"role": "assistant", "tool_calls": [c]})[0] for c in (args, with_args, as_text)
    }
    assert len(shapes) == 3


# Each template reads the user's text in one way; the user shape must be declined.
LOOKS = {
    "length": "{{ m.content | length }}",
    "compare": "{% if m.content == 'x' %}x{% endif %}",
    "order": "{{ m.content < 'b' }}",
    "haystack": "{% if 'x' in m.content %}x{% endif %}",
    "needle": "{% if m.content in 'abc' %}x{% endif %}",
    "method": "{{ m.content.strip() }}",
    "filter": "{{ m.content | trim }}",
    "replace": "{{ m.content | replace('a', 'b') }}",
    "index": "{{ m.content[0] }}",
    "slice": "{{ m.content[1:] }}",
    "iterate": "{% for c in m.content %}{{ c }}{% endfor %}",
    "tilde": "{{ 'a' ~ m.content }}",
    "set-block": "{% set x %}{{ m.content }}{% endset %}{{ x | length }}",
    "macro-result": "{% macro f(c) %}{{ c }}{% endmacro %}{% if f(m.content) == 'x' %}x{% endif %}",
    "percent": "{{ '%s!' % m.content }}",
    "percent-tuple": "{% if '%s' % (m.content,) == 'x' %}x{% endif %}",  # formats a plain str
    "times": "{{ m.content * 2 }}",
    "sequence-test": "{% if m.content is sequence %}s{% endif %}",  # Jinja's test catches errors
    "repr": "{{ m }}",
    "list-repr": "{{ [m.content] }}",
    "namespace": "{% set ns = namespace(c=m.content) %}{{ ns.c }}",
    "namespace-set": "{% set ns = namespace(c='') %}{% set ns.c = m.content %}{{ ns.c }}",
    "dict": "{{ dict(c=m.content) | tojson }}",
    "tojson-length": "{{ (m.content | tojson) | length }}",
    "tojson-message": "{{ m | tojson }}",
    "join": "{{ [m.content, 'x'] | join(',') }}",
    "list-compare": "{% if [m.content] == ['x'] %}x{% endif %}",
    "format": "{{ '%s' | format(m.content) }}",
    "clock": "{{ strftime_now('%S') }}{{ m.content }}",
    "upper-test": "{% if m.content is upper %}U{% endif %}",
    "hash": "{% if m.content in {'x': 1} %}x{% endif %}",
}


@pytest.mark.parametrize("name", sorted(LOOKS))
def test_a_template_that_reads_a_text_renders_through_jinja(name):
    source = "{%- for m in messages %}" + LOOKS[name] + "{% endfor -%}"
    shapes = shapes_for(source)
    user = {"role": "user", "content": "ab"}
    assert shapes.piece(user) is None
    assert shapes._template is None or list(shapes._skeletons.values()) == [None]
    # A shape the reading never reaches is still filled in (the template is not refused
    # as a whole) where no syntax rule refuses it.
    if name == "clock":  # the clock changes the text without any message changing
        assert shapes.piece({"role": "user", "content": ""}) is None
    elif shapes._template is not None:
        bare = {"role": "user", "content": ""}  # an empty text is no slot: nothing to read
        assert shapes.piece(bare) == jinja_piece(source, bare)


def test_a_template_error_is_left_to_jinja():
    source = "{%- for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no') }}{% endif %}{{ m.content }}{% endfor -%}"
    shapes = shapes_for(source)
    assert shapes.piece({"role": "tool", "content": "x"}) is None
    with pytest.raises(jinja2.TemplateError):
        jinja_piece(source, {"role": "tool", "content": "x"})
    assert shapes.piece({"role": "user", "content": "x"}) == "x"


@pytest.mark.parametrize(
    "look",
    [
        "{{ a }}",
        "{{ a | length }}",
        "{% for k in a %}{{ k }}{% endfor %}",
        "{{ a.items() | list }}",
        "{% if a == {} %}e{% endif %}",
        "{{ a | tojson | tojson }}",
        "{{ a['q'] }}",
    ],
)
def test_a_template_that_reads_tool_call_arguments_renders_through_jinja(look):
    source = (
        "{%- for m in messages %}{% for c in m.tool_calls or [] %}{% set a = c.function.arguments %}"
        + look
        + "{% endfor %}{% endfor -%}"
    )
    call = {"id": "c", "type": "function", "function": {"name": "n", "arguments": {"q": "1"}}}
    assert shapes_for(source).piece({"role": "assistant", "tool_calls": [call]}) is None
    placed = source.replace(look, "{{ a | tojson(indent=1) }}")
    assert shapes_for(placed).piece({"role": "assistant", "tool_calls": [call]}) == jinja_piece(
        placed, {"role": "assistant", "tool_calls": [call]}
    )
