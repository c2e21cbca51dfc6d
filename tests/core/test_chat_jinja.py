"""seam's Jinja environment renders chat templates exactly like ``apply_chat_template``."""

from __future__ import annotations

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.chat_jinja import compile_chat_template
from pipeline.core.render import template_message
from pipeline.core.tokenizer import CHAT_TEMPLATES, load_tokenizer
from schemas.replay import replay
from tests.examples import examples
from tests.strategies import TOOLS, rollouts

SETTINGS = settings(
    max_examples=examples(15, 40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Exercises every feature the environment adds: tojson options, namespace, dict,
# loop controls, raise_exception, the generation tag and whitespace control.
FEATURES = """
{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'skip' %}{% continue %}{% endif -%}
  {%- set ns.n = ns.n + 1 -%}
  {%- if m.role == 'assistant' %}{% generation %}<a>{{ m.content }}</a>{% endgeneration %}
  {%- else %}<{{ m.role }}>{{ m.content | tojson }}|{{ dict(k=m.content) | tojson(indent=1, sort_keys=True) }}
  {%- endif %}
{% endfor -%}
{{ ns.n }}{% if ns.n > 5 %}{{ raise_exception('too many') }}{% endif %}
    {% if messages %}
  indented
    {% endif %}
"""


@pytest.mark.parametrize("name", sorted(CHAT_TEMPLATES))
@SETTINGS
@given(rollout=rollouts())
def test_shipped_templates_render_like_apply_chat_template(name, rollout):
    hf = load_tokenizer(None, name)
    ours = compile_chat_template(hf.chat_template)
    for call in replay(rollout):
        messages = [template_message(m) for m in call.context]
        for gen in (True, False):
            expected = hf.apply_chat_template(
                messages, tools=TOOLS, add_generation_prompt=gen, tokenize=False
            )
            assert (
                ours.render(
                    messages=messages,
                    tools=TOOLS,
                    add_generation_prompt=gen,
                    **hf.special_tokens_map,
                )
                == expected
            )


def test_every_added_feature_renders_like_apply_chat_template():
    hf = load_tokenizer()
    messages = [
        {"role": "system", "content": 'a "quoted" <b>é</b>'},
        {"role": "skip", "content": "x"},
        {"role": "user", "content": "u\nv"},
        {"role": "assistant", "content": "done"},
    ]
    expected = hf.apply_chat_template(messages, chat_template=FEATURES, tokenize=False)
    assert compile_chat_template(FEATURES).render(messages=messages) == expected
    assert "<b>é</b>" in expected  # tojson neither escapes HTML nor non-ASCII
    too_many = messages + [{"role": "user", "content": "u"}] * 4
    with pytest.raises(jinja2.TemplateError, match="too many"):
        compile_chat_template(FEATURES).render(messages=too_many)


@pytest.mark.parametrize(
    "template",
    [
        "{% set ns = namespace(_x=1) %}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ ''.__class__ }}{{ messages.__class__.__mro__ }}",
    ],
)
def test_the_sandbox_refuses_underscore_names_and_internals(template):
    with pytest.raises(jinja2.exceptions.SecurityError):
        compile_chat_template(template).render(messages=[])


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x' * (10 ** 10) }}",
        "{{ 10 * 'abc' * (10 ** 9) }}",
        "{{ messages * (10 ** 9) }}",
        "{{ (messages | list) * 100000000 }}",
        "{{ 7 ** (10 ** 9) }}",
    ],
)
def test_a_template_cannot_allocate_without_bound(template):
    """Each of these would allocate gigabytes (or compute for minutes) in one expression."""
    with pytest.raises(jinja2.exceptions.SecurityError):
        compile_chat_template(template).render(messages=[{"role": "user", "content": "hi"}])


def test_bounded_arithmetic_still_renders():
    rendered = compile_chat_template("{{ '=' * 3 }}{{ 2 ** 10 }}{{ [1] * 2 }}").render()
    assert rendered == "===1024[1, 1]"


_NAMES = st.sampled_from(
    ["role", "content", "items", "keys", "get", "__class__", "__init__", "_x", "missing"]
)


@settings(max_examples=200, deadline=None)
@given(
    obj=st.one_of(
        st.dictionaries(st.one_of(_NAMES, st.text(max_size=4)), st.integers(), max_size=5),
        st.builds(
            lambda d: type("D", (dict,), {"role": "class attr"})(d),
            st.dictionaries(_NAMES, st.integers()),
        ),
        st.lists(st.integers(), max_size=2),
    ),
    name=st.one_of(_NAMES, st.text(max_size=4)),
)
def test_attribute_lookup_is_the_sandboxes_own(obj, name):
    """The fast path for plain dicts (``_BoundedSandbox.getattr``) answers what Jinja's
    sandbox answers: the item, the attribute (checked for safety), or undefined."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    ours = compile_chat_template("{{ x }}").environment.getattr(obj, name)
    theirs = ImmutableSandboxedEnvironment().getattr(obj, name)
    if isinstance(theirs, jinja2.Undefined):
        assert isinstance(ours, jinja2.Undefined) and type(ours) is type(theirs)
        assert ours._undefined_name == theirs._undefined_name
    else:
        assert ours == theirs
