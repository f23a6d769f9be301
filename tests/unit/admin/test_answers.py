"""``nsq_ha.admin.answers.parse_json``: the same value as ``json.loads`` whether a container is
parsed whole or walked member by member, the same refusals, and a bound on walked nesting."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_ha.admin import answers
from nsq_ha.admin.answers import parse_json

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=40,
)


def parsed(text: str, widths: tuple[int, ...] = (4, 16)) -> Any:
    """parse_json(text) with windows of ``widths`` characters: most containers are walked."""
    saved = answers._WIDTHS
    answers._WIDTHS = widths
    try:
        return asyncio.run(parse_json(text))
    finally:
        answers._WIDTHS = saved


@settings(max_examples=300, deadline=None)
@given(value=JSON, indent=st.sampled_from([None, 1]))
def test_walked_and_whole_parses_equal_json_loads(value: Any, indent: int | None) -> None:
    text = json.dumps(value, indent=indent)
    assert parsed(text) == json.loads(text)
    assert parsed(text, answers._WIDTHS) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "[1, 2",
        '{"a": 1,}',
        "[1 2]",
        '{"a" 1}',
        "{1: 2}",
        '["a", "b"] x',
        '["' + "a" * 40 + "]",
        "[" + "1, " * 40 + "]",
        '{"k": [1, 2, {"x": tru}]}',
    ],
)
@pytest.mark.parametrize("widths", [(4, 16), (2 << 10, 64 << 10)], ids=["walked", "whole"])
def test_what_json_loads_refuses_is_refused(text: str, widths: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - json.loads raises ValueError too
        json.loads(text)
    with pytest.raises(ValueError):  # noqa: PT011
        parsed(text, widths)


def test_big_containers_nested_too_deep_are_refused() -> None:
    deep = "[" * 100 + "]" * 100
    assert parsed(deep, (2 << 10,)) == json.loads(deep)  # small: parsed whole
    with pytest.raises(ValueError, match="nested more than 64"):
        parsed(deep)


async def test_the_loop_runs_between_slices_of_a_big_answer() -> None:
    text = json.dumps({"topics": [{"n": i, "c": [{"d": [0] * 20}] * 3} for i in range(20_000)]})
    turns = 0

    async def count() -> None:
        nonlocal turns
        for _ in range(1_000_000):  # bounded
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count())
    await asyncio.sleep(0)
    try:
        before = turns
        assert await parse_json(text) == json.loads(text)
        assert turns - before > 3
    finally:
        counter.cancel()
