"""--format auto: every fixture is recognised by exactly its reader; anything else is refused."""

import json

import pytest

from pipeline.readers import REGISTRY
from pipeline.readers.detect import FormatError, detect_format
from tests.readers.util import FIXTURES

SIDECARS = {
    "result.json"
}  # a Harbor trial's outcome, read next to its trajectory, not a rollout file
FIXTURE_FILES = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name not in SIDECARS)


def expected_format(path):
    return path.relative_to(FIXTURES).parts[0].replace("_", "-")


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_is_detected_as_its_format(path):
    assert detect_format(path) == expected_format(path)


def test_every_reader_has_a_fixture():
    assert {expected_format(p) for p in FIXTURE_FILES} == set(REGISTRY)


def test_a_random_json_file_is_refused_with_the_known_formats_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"learning_rate": 0.001, "layers": [64, 64]}))
    with pytest.raises(FormatError) as info:
        detect_format(path)
    message = str(info.value)
    assert "format not recognised" in message and "--format" in message
    assert all(name in message for name in REGISTRY)


def test_a_file_two_readers_accept_is_refused_as_ambiguous(tmp_path, monkeypatch):
    path = tmp_path / "both.jsonl"
    path.write_text(json.dumps({"messages": [], "history": []}) + "\n")
    monkeypatch.setattr(REGISTRY["codex"], "sniff", lambda p, head: True)
    monkeypatch.setattr(REGISTRY["openai-messages"], "sniff", lambda p, head: True)
    with pytest.raises(FormatError, match="ambiguous format, it could be codex or openai-messages"):
        detect_format(path)


def test_the_registry_refuses_a_second_reader_under_a_taken_name():
    from pipeline.readers import Reader, register

    taken = sorted(REGISTRY)[0]
    before = REGISTRY[taken]

    class Impostor(Reader):
        name = taken

    with pytest.raises(ValueError, match=f"reader name '{taken}' is taken"):
        register(Impostor)
    assert REGISTRY[taken] is before
    # Registering the same class again (a module imported twice) is harmless.
    assert register(type(before)) is type(before)
