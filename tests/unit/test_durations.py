"""The one duration check every layer uses (nsq_ha.durations)."""

from __future__ import annotations

import threading
from decimal import Decimal
from fractions import Fraction

import pytest

from nsq_ha.durations import optional_seconds, seconds
from nsq_ha.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "zero", "expected"),
    [(2, False, 2.0), (0.25, False, 0.25), (Fraction(1, 5), False, 0.2), (0, True, 0.0)],
)
def test_durations_that_are_accepted(value: object, zero: bool, expected: float) -> None:
    assert seconds(value, "x", zero=zero) == expected


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        -float("inf"),
        -1,
        0,
        10**400,
        threading.TIMEOUT_MAX * 2,
        True,
        "5",
        None,
        Decimal("1"),
        object(),
    ],
)
def test_durations_that_are_refused(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^x must be a (finite )?number of seconds"):
        seconds(value, "x")


def test_a_maximum_and_none() -> None:
    assert seconds(3, "x", maximum=3) == 3.0
    with pytest.raises(ConfigError, match="at most 3"):
        seconds(3.5, "x", maximum=3)
    assert optional_seconds(None, "x") is None
    assert optional_seconds(0, "x") == 0.0
    with pytest.raises(ConfigError, match="> 0"):
        optional_seconds(0, "x", zero=False)
