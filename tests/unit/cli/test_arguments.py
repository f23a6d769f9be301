"""The command line's duration argument types follow the library's duration rule."""

from __future__ import annotations

import argparse

import pytest

from nsq_ha.cli.arguments import duration, wait


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "0", "1e400", "soon", ""])
def test_a_deadline_must_be_finite_and_positive(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


@pytest.mark.parametrize("text", ["nan", "inf", "-0.5", "x"])
def test_a_delay_must_be_finite_and_not_negative(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        wait(text)


def test_good_values_are_seconds() -> None:
    assert duration("2.5") == 2.5
    assert wait("0") == 0.0
