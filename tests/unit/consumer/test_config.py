"""ConsumerConfig: one checked set of options shared by the async Consumer and the blocking one.

No server: nothing here connects."""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, get_type_hints

import pytest

import nsq_ha
from nsq_ha import sync
from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer import Consumer, ConsumerConfig, ConsumerOptions, Fixed
from nsq_ha.errors import ConfigError, InvalidNameError

NSQD = "127.0.0.1:1"
#: nowhere listens here; the blocking consumer's tests connect nowhere that answers
NOWHERE = "127.0.0.1:9"


def _options_of(cls: type) -> tuple[list[tuple[str, object, object]], object]:
    """A constructor's named parameters (name, kind, default) and its ``**`` annotation."""
    named = []
    rest: object = None
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            rest = p.annotation
        elif p.name != "self":
            named.append((p.name, p.kind, p.default))
    return named, rest


def test_the_options_are_the_config_fields_but_topic_and_channel() -> None:
    """ConsumerConfig is the one place of every option's name, type and default: the
    keywords' TypedDict names exactly its fields, with the same types."""
    fields = get_type_hints(ConsumerConfig)
    assert get_type_hints(ConsumerOptions) == {
        name: kind for name, kind in fields.items() if name not in ("topic", "channel")
    }
    assert ConsumerOptions.__required_keys__ == frozenset()


def test_both_consumers_take_the_options_and_write_no_default() -> None:
    named, rest = _options_of(Consumer)
    assert [name for name, _, _ in named] == ["topic", "channel", "config"]
    assert all(default is None for _, _, default in named)
    assert rest == "Unpack[ConsumerOptions]"
    assert _options_of(sync.Consumer) == (named, rest)


def test_connection_settings_go_under_connection() -> None:
    settings = ConnectionConfig(client_id="orders-1")
    consumer = Consumer("t", "c", nsqd=NSQD, connection=settings)
    assert consumer.config.connection is settings
    with sync.Consumer("t", "c", nsqd=NOWHERE, connection=settings) as blocking:
        assert blocking.config.connection is settings


@pytest.mark.parametrize("make", [Consumer, sync.Consumer])
@pytest.mark.parametrize("given", [{"client_id": "x"}, ConnectionConfig(client_id="x")], ids=repr)
def test_a_config_that_is_not_a_consumer_config_is_refused_with_what_to_do(
    make: Any, given: object
) -> None:
    with pytest.raises(ConfigError, match=r"connection=ConnectionConfig"):
        make("t", "c", nsqd=NSQD, config=given)


@pytest.mark.parametrize("make", [Consumer, sync.Consumer])
def test_an_unknown_option_is_refused_with_the_nearest_name(make: Any) -> None:
    with pytest.raises(ConfigError, match=r"'max_inflight'.*did you mean 'max_in_flight'"):
        make("t", "c", nsqd=NSQD, max_inflight=3)


def test_config_is_where_the_options_are_read() -> None:
    """``Consumer.config`` holds every option; the consumer forwards none of them but its
    topic and channel (what the consumer is) and the live ``max_in_flight``."""
    forwarded = {
        name
        for name, value in vars(Consumer).items()
        if isinstance(value, property) and name in ConsumerConfig.__dataclass_fields__
    }
    assert forwarded == {"topic", "channel", "max_in_flight"}


def test_config_is_frozen_and_exported() -> None:
    config = ConsumerConfig(topic="t", channel="c", nsqd=NSQD)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_in_flight = 5  # type: ignore[misc]
    assert nsq_ha.ConsumerConfig is ConsumerConfig


def test_config_normalizes_what_it_is_given() -> None:
    config = ConsumerConfig(
        topic="t",
        channel="c",
        nsqd=[NSQD, NSQD, "127.0.0.1:2"],
        partitions=[2, 1, 2],
        requeue_delay=2,
        msg_timeout=5,
        connection=ConnectionConfig(sample_rate=0),
    )
    assert config.nsqd == (NSQD, "127.0.0.1:2")
    assert config.partitions == frozenset({1, 2})
    assert isinstance(config.requeue_delay, float)
    assert config.connection_config().msg_timeout == 5.0
    assert config.connection_config(extend_support=True).extend_support is True
    assert config.wants(1)
    assert not config.wants(0)
    seeds = ConsumerConfig(topic="t", channel="c", lookupd=["http://a:1", "http://a:1"])
    assert seeds.lookupd == ("http://a:1",)
    assert ConsumerConfig(topic="t", channel="c", lookupd="http://a:1").lookupd == ("http://a:1",)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({}, ConfigError, "exactly one of"),
        ({"nsqd": NSQD, "lookupd": "http://a:1"}, ConfigError, "exactly one of"),
        ({"nsqd": []}, ConfigError, "nsqd"),
        ({"lookupd": []}, ConfigError, "lookupd"),
        ({"nsqd": NSQD, "max_in_flight": -1}, ConfigError, "max_in_flight"),
        ({"nsqd": NSQD, "max_in_flight": True}, ConfigError, "max_in_flight"),
        ({"nsqd": NSQD, "max_attempts": 1.5}, ConfigError, "max_attempts"),
        ({"nsqd": NSQD, "ordered": True, "sample_rate": 5}, ConfigError, "sample_rate"),
        ({"nsqd": NSQD, "ordered": "yes"}, ConfigError, "ordered"),
        ({"nsqd": NSQD, "with_offsets": 1}, ConfigError, "with_offsets"),
        ({"nsqd": NSQD, "backoff": 3}, ConfigError, "backoff"),
        ({"nsqd": NSQD, "on_give_up": 3}, ConfigError, "on_give_up"),
        ({"nsqd": NSQD, "member": (0, 2)}, ConfigError, "member"),
        ({"lookupd": "http://a:1", "member": (2, 2)}, ConfigError, "member"),
        ({"nsqd": NSQD, "partitions": [-1]}, ConfigError, "partitions"),
        ({"nsqd": NSQD, "drain_timeout": 0}, ConfigError, "drain_timeout"),
        ({"nsqd": NSQD, "lookup_interval": math.nan}, ConfigError, "lookup_interval"),
        ({"nsqd": NSQD, "requeue_delay": math.inf}, ConfigError, "requeue_delay"),
        ({"nsqd": NSQD, "msg_timeout": -1}, ConfigError, "msg_timeout"),
        (
            {"nsqd": NSQD, "reconnect_interval": 5, "max_reconnect_interval": 2},
            ConfigError,
            "max_reconnect_interval",
        ),
        ({"nsqd": NSQD, "connection": "fast"}, ConfigError, "ConnectionConfig"),
        ({"lookup": "http://a:1"}, ConfigError, "LookupClient"),
    ],
)
def test_bad_values_are_typed_errors(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ConsumerConfig(topic="t", channel="c", **options)


def test_bad_names_are_invalid_name_errors() -> None:
    with pytest.raises(InvalidNameError):
        ConsumerConfig(topic="bad topic!", channel="c", nsqd=NSQD)
    with pytest.raises(InvalidNameError):
        ConsumerConfig(topic="t", channel="", nsqd=NSQD)


async def test_a_consumer_takes_a_whole_config() -> None:
    config = ConsumerConfig(
        topic="t", channel="c", nsqd=NSQD, max_in_flight=7, backoff=Fixed(0.5), drain_timeout=2
    )
    consumer = Consumer(config=config)
    assert consumer.config is config
    assert (consumer.topic, consumer.channel, consumer.max_in_flight) == ("t", "c", 7)
    assert consumer.config.drain_timeout == 2.0
    assert Consumer("t", "c", config=config).config is config  # the same names: fine
    await consumer.close()


def test_a_whole_config_and_other_options_do_not_mix() -> None:
    config = ConsumerConfig(topic="t", channel="c", nsqd=NSQD)
    with pytest.raises(ConfigError, match="max_in_flight"):
        Consumer(config=config, max_in_flight=5)
    with pytest.raises(ConfigError, match="max_in_flight"):  # given, even at its default
        Consumer(config=config, max_in_flight=100)
    with pytest.raises(ConfigError, match="topic"):
        Consumer("other", "c", config=config)
    with pytest.raises(ConfigError, match="topic"):
        Consumer(nsqd=NSQD)


def test_keywords_and_config_build_the_same_config() -> None:
    keywords = {"nsqd": NSQD, "max_in_flight": 3, "partitions": [1], "reconnect_interval": 2}
    assert Consumer("t", "c", **keywords).config == ConsumerConfig(
        topic="t", channel="c", **keywords
    )
