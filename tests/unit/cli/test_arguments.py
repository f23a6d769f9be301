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


def test_field_default_reads_the_dataclass_field() -> None:
    from nsq_ha.admin import TopicSpec
    from nsq_ha.cli.arguments import field_default

    assert field_default(TopicSpec, "partitions") == TopicSpec("t").partitions
    assert field_default(TopicSpec, "channel_auto_create") is TopicSpec("t").channel_auto_create
