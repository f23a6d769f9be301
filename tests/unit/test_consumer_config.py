"""ConsumerConfig: one checked set of options shared by the async Consumer and the blocking one.

No server: nothing here connects."""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import pytest

import nsq_ha
from nsq_ha import sync
from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer import Consumer, ConsumerConfig, Fixed
from nsq_ha.errors import ConfigError, InvalidNameError

NSQD = "127.0.0.1:1"


def parameters(function: Any) -> list[tuple[str, object, object]]:
    """(name, kind, default) of every parameter but self."""
    return [
        (p.name, p.kind, p.default)
        for p in inspect.signature(function).parameters.values()
        if p.name != "self"
    ]


def test_the_sync_consumer_takes_exactly_the_async_consumers_options() -> None:
    assert parameters(sync.Consumer.__init__) == parameters(Consumer.__init__)


def test_every_consumer_option_is_a_config_field() -> None:
    fields = {f.name: f for f in dataclasses.fields(ConsumerConfig)}
    options = {name for name, kind, _ in parameters(Consumer.__init__)}
    # the Consumer's config= is the ConsumerConfig's connection (or a whole ConsumerConfig)
    assert options - {"config"} | {"connection"} == set(fields)
    for name, kind, default in parameters(Consumer.__init__):
        if kind is inspect.Parameter.KEYWORD_ONLY and name != "config":
            field = fields[name]
            made = field.default_factory() if callable(field.default_factory) else field.default
            assert made == default, name


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
    assert consumer.drain_timeout == 2.0
    assert Consumer("t", "c", config=config).config is config  # the same names: fine
    await consumer.close()


def test_a_whole_config_and_other_options_do_not_mix() -> None:
    config = ConsumerConfig(topic="t", channel="c", nsqd=NSQD)
    with pytest.raises(ConfigError, match="max_in_flight"):
        Consumer(config=config, max_in_flight=5)
    with pytest.raises(ConfigError, match="topic"):
        Consumer("other", "c", config=config)
    with pytest.raises(ConfigError, match="topic"):
        Consumer(nsqd=NSQD)


def test_keywords_and_config_build_the_same_config() -> None:
    keywords = {"nsqd": NSQD, "max_in_flight": 3, "partitions": [1], "reconnect_interval": 2}
    assert Consumer("t", "c", **keywords).config == ConsumerConfig(
        topic="t", channel="c", **keywords
    )
