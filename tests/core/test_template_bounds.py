"""Chat templates are untrusted code: a render is bounded in memory and in time."""

from __future__ import annotations

import time

import jinja2
import pytest

from pipeline.core import chat_jinja
from pipeline.core.chat_jinja import compile_chat_template, render_bounded

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "source",
    [
        # a string doubled through a namespace with ~ (the 6.1 GB template)
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}",
        # the same with +
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}{{ ns.s | length }}",
        # a list doubled with +
        "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
        "{% endfor %}{{ ns.l | length }}",
    ],
)
def test_values_a_template_grows_in_a_loop_are_capped(source):
    started = time.monotonic()
    with pytest.raises(jinja2.exceptions.SecurityError, match="over"):
        render_bounded(compile_chat_template(source), messages=MESSAGES)
    assert time.monotonic() - started < 10


def test_a_template_stuck_in_nested_loops_fails_at_the_deadline(monkeypatch):
    monkeypatch.setattr(chat_jinja, "MAX_RENDER_SECONDS", 0.3)
    source = (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% if j == -1 %}x{% endif %}"
        "{% endfor %}{% endfor %}done"
    )
    # CPU time, not wall time: on a loaded CI machine the 0.3 s of wall clock the render
    # may take, and the unwinding after it, can stretch past 5 s of wall clock (seen: 6.2 s).
    started = time.process_time()
    with pytest.raises(jinja2.exceptions.SecurityError, match="ran for over 0.3 s"):
        render_bounded(compile_chat_template(source), messages=MESSAGES)
    assert time.process_time() - started < 5


def test_a_template_that_writes_without_end_is_stopped_by_size(monkeypatch):
    monkeypatch.setattr(chat_jinja, "MAX_RENDERED_CHARS", 1000)
    source = "{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}"
    with pytest.raises(jinja2.exceptions.SecurityError, match="wrote over 1,000"):
        render_bounded(compile_chat_template(source), messages=MESSAGES)


def test_a_bounded_render_equals_the_plain_render_and_resets_its_clock():
    template = compile_chat_template(
        "{% for m in messages %}<{{ m.role }}>{{ m.content + '!' }}{% endfor %}"
    )
    assert render_bounded(template, messages=MESSAGES) == template.render(messages=MESSAGES)
    assert chat_jinja._budget.deadline == float("inf")


def test_the_build_quarantines_a_rollout_whose_template_stalls(monkeypatch, renderer):
    from pipeline.core.render import TemplateError

    monkeypatch.setattr(chat_jinja, "MAX_RENDER_SECONDS", 0.2)
    monkeypatch.setattr(
        renderer,
        "template",
        compile_chat_template(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
        ),
    )
    with pytest.raises(TemplateError, match="ran for over 0.2 s"):
        renderer.render(MESSAGES, None, False)
