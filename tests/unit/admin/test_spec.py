"""TopicSpec: what /topic/create is asked for, durability options included."""

from __future__ import annotations

import pytest

from nsq_ha.admin import TopicSpec
from nsq_ha.errors import ConfigError


def test_a_durable_spec_asks_for_syncdisk_1() -> None:
    spec = TopicSpec.with_durability(
        "t", 2, 3, durable=True, retention_days=7, channel_auto_create=False
    )
    assert spec.durable
    assert spec.query() == {
        "topic": "t",
        "partition_num": "2",
        "replicator": "3",
        "syncdisk": "1",
        "retention": "7",
        "disable_channel_auto_create": "true",
    }
    assert "syncdisk" not in TopicSpec("t").query()  # nsqd's default unless asked


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"durable": True, "sync_every": 5}, "durable means sync_every=1"),
        ({"sync_every": 0}, r"sync_every must be 1\.\.4000"),
        ({"sync_every": 4001}, r"sync_every must be 1\.\.4000"),
        ({"retention_days": 61}, r"retention_days must be 1\.\.60"),
        ({"sync_every": True}, "sync_every must be an int"),
    ],
)
def test_bad_durability_options(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TopicSpec.with_durability("t", **kwargs)  # type: ignore[arg-type]


def test_an_option_not_given_takes_the_fields_default() -> None:
    assert TopicSpec.with_durability("t") == TopicSpec("t")
    nothing = dict.fromkeys(
        ("partitions", "replicas", "ordered", "ext", "multi_part", "channel_auto_create")
    )
    assert TopicSpec.with_durability("t", **nothing) == TopicSpec("t")
    given = TopicSpec.with_durability("t", 3, 2, True, channel_auto_create=False)
    assert given == TopicSpec("t", 3, 2, True, channel_auto_create=False)
