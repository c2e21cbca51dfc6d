"""A rollout's first piece (system prompt and tool schemas, rendered by Jinja) is kept by
value (``ChatRenderer._first_piece``): a kept render is the one Jinja would give again,
for values a template prints apart, and templates that read the clock are not kept."""

from __future__ import annotations

import pytest

from pipeline.core.render import ChatRenderer
from pipeline.core.tokenizer import CHAT_TEMPLATES, load_build_tokenizer


def _tools(value) -> list[dict]:
    return [{"type": "function", "function": {"name": "grep", "parameters": {"x": value}}}]


# Equal under ==, or under a JSON round trip, yet printed apart by a template.
VALUES = [1, 1.0, True, float("nan"), None, "1", [1], {"1": 1}]
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "system", "content": "You are a coding agent. "},
    {"role": "user", "content": "You are a coding agent."},
]


@pytest.mark.parametrize("template", sorted(CHAT_TEMPLATES))
def test_a_kept_first_piece_is_the_render_of_its_own_values(template):
    tokenizer = load_build_tokenizer(None, template)
    kept, reference = ChatRenderer(tokenizer), ChatRenderer(tokenizer, by_shape=False)
    cases = [(m, _tools(v)) for m in MESSAGES for v in VALUES] + [(m, None) for m in MESSAGES]
    for _ in range(2):  # the second round is answered from what the first kept
        for message, tools in cases:
            want = reference.render([message], tools, False)
            assert kept.piece(message, True, tools) == want, (message, tools)
    message, tools = cases[0]
    assert kept.piece(message, True, tools) is kept.piece(message, True, tools)  # kept


def test_a_template_that_reads_the_clock_is_rendered_every_time(tmp_path):
    source = CHAT_TEMPLATES["chatml-tools"] + "{#- strftime_now: not a function of the messages -#}"
    (tmp_path / "clock.jinja").write_text(source)
    renderer = ChatRenderer(load_build_tokenizer(None, str(tmp_path / "clock.jinja")))
    message = MESSAGES[0]
    assert renderer.piece(message, True, None) is not renderer.piece(message, True, None)
