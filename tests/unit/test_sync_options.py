"""Durations of the blocking facade (``nsq_ha.sync``) that need no server: a bad value raises
ConfigError before anything is scheduled, and the object is left as it was."""

from __future__ import annotations

import inspect
import math
from decimal import Decimal
from fractions import Fraction

import pytest

from nsq_ha import sync
from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer import ConsumerConfig
from nsq_ha.errors import ConfigError, NsqTimeoutError
from nsq_ha.producer import Producer as AsyncProducer
from nsq_ha.producer import ProducerConfig

#: nowhere listens here; nothing in these tests connects
NOWHERE = "127.0.0.1:9"

BAD_WAITS: list[object] = [
    math.nan,
    math.inf,
    -math.inf,
    -0.5,
    1e12,
    10**400,
    "5",
    True,
    object(),
    Decimal("1"),
]


@pytest.mark.parametrize("bad", [*BAD_WAITS, 0, 0.0, None])
def test_producer_close_timeout_option(bad: object) -> None:
    with pytest.raises(ConfigError, match="close_timeout"):
        sync.Producer(nsqd=NOWHERE, close_timeout=bad)  # type: ignore[arg-type]


def test_producer_close_timeout_accepts_a_positive_number() -> None:
    producer = sync.Producer(nsqd=NOWHERE, close_timeout=2)
    assert producer.producer_config.close_timeout == 2
    producer.close()


@pytest.mark.parametrize("bad", BAD_WAITS)
def test_producer_close_timeout_argument(bad: object) -> None:
    producer = sync.Producer(nsqd=NOWHERE)
    with pytest.raises(ConfigError, match="timeout"):
        producer.close(bad)  # type: ignore[arg-type]
    assert not producer.closed  # nothing happened: the producer is still open
    producer.close(0.5)
    assert producer.closed


@pytest.mark.parametrize("bad", BAD_WAITS)
def test_publish_timeouts_are_checked_before_the_publish_starts(bad: object) -> None:
    with sync.Producer(nsqd=NOWHERE) as producer:
        with pytest.raises(ConfigError, match="timeout"):
            producer.publish("t", b"x", timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="timeout"):
            producer.publish_many("t", [b"x"], timeout=bad)  # type: ignore[arg-type]
        assert producer.aio.stats["commands"] == 0
        assert producer.aio.stats["connections"] == 0


@pytest.mark.parametrize("good", [0, 0.2, Fraction(1, 5)])
def test_a_real_number_timeout_is_a_deadline(good: float) -> None:
    with sync.Producer(nsqd=NOWHERE, close_timeout=0.5) as producer:
        with pytest.raises(NsqTimeoutError):  # nothing listens: the deadline ends the wait
            producer.publish("t", b"x", timeout=good)
        with pytest.raises(NsqTimeoutError):
            producer.publish_many("t", [b"x"], timeout=good)


# -- the consumer: the same ConsumerConfig as the async one ------------------------------------


@pytest.mark.parametrize(
    ("option", "bad"),
    [("drain_timeout", 0), ("max_in_flight", -1), ("requeue_delay", math.nan), ("member", (0, 2))],
)
def test_consumer_options_are_checked_before_anything_starts(option: str, bad: object) -> None:
    with pytest.raises(ConfigError, match=option):
        sync.Consumer("t", "c", nsqd=NOWHERE, **{option: bad})  # type: ignore[arg-type]


def test_consumer_builds_the_same_config_as_the_async_one() -> None:
    with sync.Consumer("t", "c", nsqd=NOWHERE, max_in_flight=3, drain_timeout=1) as consumer:
        assert consumer.aio.config == ConsumerConfig(
            topic="t", channel="c", nsqd=NOWHERE, max_in_flight=3, drain_timeout=1
        )


def test_the_sync_producer_takes_exactly_the_async_producers_options() -> None:
    """The same keywords, typed by the same ProducerOptions: no default written twice."""
    blocking = inspect.signature(sync.Producer).parameters.values()
    asyncio = inspect.signature(AsyncProducer).parameters.values()
    assert [(p.name, p.kind, p.default) for p in blocking] == [
        ("config", inspect.Parameter.KEYWORD_ONLY, None),
        ("options", inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty),
    ]
    assert [(p.name, p.kind, p.default) for p in asyncio] == [
        (p.name, p.kind, p.default) for p in blocking
    ]
    assert {p.annotation for p in [*blocking, *asyncio] if p.name == "options"} == {
        "Unpack[ProducerOptions]"
    }


def test_the_sync_producer_takes_connection_settings_under_connection() -> None:
    settings = ConnectionConfig(client_id="orders-1")
    with sync.Producer(nsqd=NOWHERE, connection=settings) as producer:
        assert producer.producer_config.connection is settings
        assert producer.aio.config == producer.producer_config


def test_the_sync_producer_builds_the_same_config_as_the_async_one() -> None:
    options = {"nsqd": NOWHERE, "strategy": "jump", "max_batch": 9, "linger": 0.25}
    producer = sync.Producer(**options)  # type: ignore[arg-type]
    try:
        assert producer.producer_config == ProducerConfig(**options)  # type: ignore[arg-type]
        assert producer.aio.config == producer.producer_config
    finally:
        producer.close()
    with pytest.raises(ConfigError, match="max_batch"):
        sync.Producer(nsqd=NOWHERE, max_batch=0)
