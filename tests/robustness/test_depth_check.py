"""``limits.check_depth`` (the ``max_depth`` limit every reader applies) against a
recursive reference: it refuses exactly the JSON values that nest deeper than the
limit, with the reason naming the first level past it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.sources.limits import DepthError, Limits, check_depth, in_force

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=12,
)


def nesting(value) -> int:
    """Containers on the deepest path (a scalar: 0)."""
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(nesting, value), default=0)
    return 0


@settings(max_examples=80, deadline=None)
@given(JSON, st.integers(0, 8), st.booleans())
def test_refuses_exactly_what_nests_deeper_than_the_limit(value, limit, with_raw):
    raw = json.dumps(value).encode() if with_raw else None
    with in_force(Limits(max_depth=limit)):
        if nesting(value) <= limit:
            check_depth(value, raw)
        else:
            with pytest.raises(DepthError, match=rf"JSON nesting of {limit + 1}\+ levels"):
                check_depth(value, raw)


def test_a_deep_record_is_checked_without_recursion():
    deep: list = []
    for _ in range(5_000):  # past Python's recursion limit
        deep = [deep]
    with in_force(Limits(max_depth=5_001)):
        check_depth(deep)
    with in_force(Limits(max_depth=4_999)), pytest.raises(DepthError):
        check_depth(deep)
