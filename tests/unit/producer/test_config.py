"""ProducerConfig: one frozen, validated value holds every producer option;
the asyncio Producer, the blocking one and (later) the CLI and Spark all build it, so a bad
value is refused the same way everywhere, with a typed error, before anything starts."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing

import pytest

import nsq_ha
import nsq_ha.sync
from nsq_ha.connection import ConnectionConfig
from nsq_ha.errors import ConfigError, InvalidArgumentError
from nsq_ha.producer import Producer, ProducerConfig, RetryPolicy
from nsq_ha.producer.config import ProducerOptions
from nsq_ha.retry import PUBLISH
from nsq_ha.routing import DEFAULT_STRATEGY, ShardingStrategy, get_strategy

WHERE = {"nsqd": "127.0.0.1:1"}


def test_producer_config_is_exported_frozen_and_normalised() -> None:
    assert nsq_ha.ProducerConfig is ProducerConfig
    config = ProducerConfig(lookupd="http://127.0.0.1:4161", strategy="java", linger=1)
    assert config.lookupd == ("http://127.0.0.1:4161",)
    assert isinstance(config.strategy, ShardingStrategy)
    assert config.strategy.name == get_strategy("java").name
    assert config.linger == 1.0
    assert isinstance(config.linger, float)
    assert config.connection == ConnectionConfig()
    assert config.retry == RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_batch = 2  # type: ignore[misc]
    assert ProducerConfig(nsqd=["a:1", "b:2", "a:1"]).nsqd == ("a:1", "b:2")


BAD: list[tuple[dict[str, object], type[Exception], str]] = [
    ({}, ConfigError, "exactly one of"),
    ({"lookupd": "http://x:1", "nsqd": "x:1"}, ConfigError, "exactly one of"),
    ({"nsqd": []}, ConfigError, "at least one"),
    ({"nsqd": "no-port"}, ConfigError, "host:port"),
    ({"nsqd": ["x:1", ""]}, InvalidArgumentError, "non-empty"),
    ({"nsqd": b"x:1"}, InvalidArgumentError, "address"),
    ({"lookup": "http://x:1"}, InvalidArgumentError, "LookupClient"),
    ({"strategy": "nope", **WHERE}, ConfigError, "nope"),
    ({"connection": {}, **WHERE}, InvalidArgumentError, "ConnectionConfig"),
    ({"retry": 3, **WHERE}, ConfigError, "RetryPolicy"),
    ({"trace": 1, **WHERE}, InvalidArgumentError, "trace"),
    ({"unkeyed_window": 0, **WHERE}, ConfigError, "unkeyed_window"),
    ({"max_batch": True, **WHERE}, ConfigError, "max_batch"),
    ({"max_batch": 1.5, **WHERE}, ConfigError, "max_batch"),
    ({"linger": -1, **WHERE}, ConfigError, "linger"),
    ({"linger": math.nan, **WHERE}, ConfigError, "linger"),
    ({"close_timeout": 0, **WHERE}, ConfigError, "close_timeout"),
    ({"topic_idle_timeout": math.inf, **WHERE}, ConfigError, "topic_idle_timeout"),
    ({"topic_idle_timeout": "5", **WHERE}, ConfigError, "topic_idle_timeout"),
]


@pytest.mark.parametrize(("options", "error", "match"), BAD)
def test_producer_config_refuses_bad_values_with_typed_errors(
    options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ProducerConfig(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("options", "error", "match"), BAD)
def test_the_producer_refuses_the_same_values_the_same_way(
    options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Producer(**options)  # type: ignore[arg-type]


async def test_a_producer_takes_a_whole_config_or_keywords_not_both() -> None:
    config = ProducerConfig(nsqd="127.0.0.1:1", max_batch=7, linger=0.5)
    producer = Producer(config=config)
    assert producer.config is config
    await producer.close()
    with pytest.raises(ConfigError, match=r"not both \(linger, max_batch given as keywords\)"):
        Producer(config=config, max_batch=8, linger=0.0)
    connection = ConnectionConfig(client_id="keyed")
    keyed = Producer(nsqd="127.0.0.1:1", connection=connection, max_batch=8)
    assert keyed.config == ProducerConfig(nsqd="127.0.0.1:1", connection=connection, max_batch=8)
    assert keyed.config.connection == connection
    await keyed.close()


def test_the_producer_keywords_are_the_config_fields_with_no_default_of_their_own() -> None:
    """One option set: ProducerOptions names exactly ProducerConfig's fields, and the
    Producer's signature holds no option (so no default is written twice)."""
    fields = [f.name for f in dataclasses.fields(ProducerConfig)]
    assert list(typing.get_type_hints(ProducerOptions)) == fields
    parameters = inspect.signature(Producer).parameters
    assert [(p.name, p.kind) for p in parameters.values()] == [
        ("config", inspect.Parameter.KEYWORD_ONLY),
        ("options", inspect.Parameter.VAR_KEYWORD),
    ]
    assert parameters["config"].default is None


@pytest.mark.parametrize("make", [Producer, nsq_ha.sync.Producer])
@pytest.mark.parametrize(
    "config", [{"max_batch": 2}, "nsqd=127.0.0.1:1", 3, ConnectionConfig()], ids=repr
)
def test_config_takes_only_a_whole_producer_config(make: typing.Any, config: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"ProducerConfig.*connection="):
        make(nsqd="127.0.0.1:1", config=config)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_batchs": 3}, r"no option 'max_batchs'; did you mean 'max_batch'\?"),
        ({"colour": "red"}, r"no option 'colour' \(the options: lookupd, lookup, nsqd, "),
    ],
)
def test_an_unknown_option_is_a_config_error_naming_the_nearest(
    options: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        Producer(nsqd="127.0.0.1:1", **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=match):
        ProducerConfig.from_options(None, {"nsqd": "127.0.0.1:1", **options})  # type: ignore[typeddict-item]


def test_the_default_strategy_and_waits_are_the_librarys_own() -> None:
    """The routing module's default strategy and the retry module's PUBLISH waits, read, not
    written again."""
    assert ProducerConfig(nsqd="127.0.0.1:4150").strategy is DEFAULT_STRATEGY
    assert RetryPolicy().waits == PUBLISH
