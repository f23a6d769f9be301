"""Range-read channel names: valid for nsqd, carry their creation time, told apart from others."""

from __future__ import annotations

import pytest

from nsq_ha.protocol import validate_channel
from nsq_ha.spark.source.channels import range_channel, range_channel_created


@pytest.mark.parametrize("base", ["spark_0123456789abcdef", "q", "x" * 80, "my-query.v2"])
@pytest.mark.parametrize("partition", [0, 7, 1023])
def test_range_channel_names_are_valid_and_say_when_they_were_made(
    base: str, partition: int
) -> None:
    name = range_channel(base, partition, now=1_790_000_000.7)
    validate_channel(name)
    assert len(name) <= 64
    assert name.startswith(base[:20])
    assert f"_{partition}_nsqr" in name
    assert range_channel_created(name) == 1_790_000_000.0
    assert range_channel(base, partition, now=1_790_000_000) != range_channel(
        base, partition, now=1_790_000_000
    )  # random tail: a retried task never reuses a channel


@pytest.mark.parametrize(
    "name",
    [
        "spark_0123456789abcdef",  # a query's own channel (driver mode): never swept
        "orders",
        "spark_0123456789abcdef_0_1a2b3c4d",  # the old range names: no creation time
        "q_0_nsqr6a9f1c00",  # mark without the random tail
        "q_0_nsqr6a9f1c00abcdeg",  # not hex
        "q_nsqr6a9f1c00abcdef",  # no partition
    ],
)
def test_other_channels_are_not_range_channels(name: str) -> None:
    assert range_channel_created(name) is None
