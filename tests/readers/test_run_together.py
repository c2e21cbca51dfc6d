"""Lines holding several JSON records run together (every JSONL reader reads them through
``iter_json_records``): each whole record is read, each unreadable stretch is one error."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.readers.common import (
    RUN_TOGETHER_LOST,
    _expects_value,
    iter_json_records,
    run_together,
    top_level_fields,
)
from tests.examples import examples

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12))
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
records = st.dictionaries(st.text(min_size=1, max_size=6), values, min_size=1, max_size=4)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.lists(records, min_size=2, max_size=4))
def test_whole_records_run_together_are_all_read(recs):
    line = "".join(json.dumps(r, ensure_ascii=False) for r in recs)
    assert [obj for obj, _ in run_together(line)] == recs


@settings(max_examples=examples(50, 150), deadline=None)
@given(records, st.integers(min_value=1, max_value=200), st.lists(records, min_size=1, max_size=3))
def test_a_cut_record_before_whole_ones_loses_only_itself(cut_record, cut_at, recs):
    text = json.dumps(cut_record, ensure_ascii=False)
    cut = text[: min(cut_at, len(text) - 1)]
    # Cut where a value is expected ('{"k":'), the next object reads as nested in it:
    # ambiguous, and seam does not guess (one error for the line).
    assume(not _expects_value(cut))
    parts = run_together(cut + "".join(json.dumps(r, ensure_ascii=False) for r in recs))
    assert parts is not None
    assert [obj for obj, _ in parts if obj is not None] == recs
    assert [t for obj, t in parts if obj is None] == [cut]


def test_one_bad_line_is_not_split():
    assert run_together('{"a": 1') is None
    assert run_together('{"a": 1}') is None
    assert run_together('{"a": {"b": 1}') is None  # a complete value nested in a cut record
    assert run_together('{"a": [1, {"b": 1}') is None  # ... or in an array of one


def test_a_file_line_with_records_run_together_yields_each(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"n": 1}{"n": 2}\n{"n": 3, "cut\n{"n": 3, "cu{"n": 4}\n')
    got = [(line, rec, error) for line, rec, error, _ in iter_json_records(path)]
    assert got[:2] == [(1, {"n": 1}, None), (1, {"n": 2}, None)]
    assert got[2][0] == 2 and got[2][2].startswith("invalid JSON")  # one bad record: one error
    assert got[3:] == [(3, {}, RUN_TOGETHER_LOST), (3, {"n": 4}, None)]


def test_the_type_of_a_cut_record_is_its_own_not_a_nested_one():
    cut = '{"parentUuid":"p","data":{"type":"hook_progress"},"type":"progress","uuid":"u1","ti'
    assert top_level_fields(cut) == {"type": "progress", "uuid": "u1"}
    assert top_level_fields('{"data":{"type":"assistant"},"ty') == {}
