"""Producer and RetryPolicy options: every duration is a finite number of
seconds; NaN, infinities, negatives, bools and strings are refused with ConfigError, before any
state changes. Also the small pure parts added with them: routes that never guess a partition
count, ext refusals, and the redaction of lookupd credentials."""

from __future__ import annotations

import math

import pytest

from nsq_ha.connection import ConnectionConfig
from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError, UnsupportedByServerError
from nsq_ha.lookup import NodeInfo, PartitionMap, TopicMeta
from nsq_ha.producer import Producer, RetryPolicy
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.producer.routes import Routes, check_features
from nsq_ha.producer.topic import SlotMemo, Topic
from nsq_ha.protocol.publish import PublishMessage
from nsq_ha.redact import redact_text as redact
from nsq_ha.routing import get_strategy

NAN, INF = float("nan"), float("inf")
BAD_SECONDS = [NAN, INF, -INF, -1, -0.001, True, "5", None]


@pytest.mark.parametrize("value", BAD_SECONDS)
@pytest.mark.parametrize("name", ["linger", "close_timeout", "topic_idle_timeout"])
def test_producer_durations_refuse_nan_infinity_negatives_and_non_numbers(
    name: str, value: object
) -> None:
    with pytest.raises(ConfigError, match=name):
        Producer(nsqd="127.0.0.1:1", **{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["close_timeout", "topic_idle_timeout"])
def test_producer_timeouts_must_be_positive(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Producer(nsqd="127.0.0.1:1", **{name: 0})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 1.5, True, "3", -2])
@pytest.mark.parametrize("name", ["unkeyed_window", "max_batch"])
def test_producer_counts_must_be_ints_of_at_least_one(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=name):
        Producer(nsqd="127.0.0.1:1", **{name: value})  # type: ignore[arg-type]


def test_producer_accepts_sound_durations() -> None:
    producer = Producer(nsqd="127.0.0.1:1", linger=0, close_timeout=0.5, topic_idle_timeout=7)
    config = producer.config
    assert (config.linger, config.close_timeout, config.topic_idle_timeout) == (0, 0.5, 7)


@pytest.mark.parametrize("value", [NAN, INF, -1, True, "1"])
async def test_close_refuses_a_bad_timeout_and_stays_open(value: object) -> None:
    producer = Producer(nsqd="127.0.0.1:1")
    with pytest.raises(ConfigError, match="timeout"):
        await producer.close(timeout=value)  # type: ignore[arg-type]
    assert not producer.closed
    await producer.close(timeout=0)
    assert producer.closed


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (name, value)
        for name in ("initial_backoff", "max_backoff", "jitter", "deadline", "attempt_timeout")
        for value in (NAN, INF, -INF, -1, True, "1")
    ]
    + [("deadline", 0), ("attempt_timeout", 0)],
)
def test_retry_policy_durations_are_finite_seconds(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=name):
        RetryPolicy(**{name: value})  # type: ignore[arg-type]


def test_check_seconds_bounds() -> None:
    assert seconds(0, "x", zero=True) == 0.0
    assert seconds(2, "x") == 2.0
    with pytest.raises(ConfigError, match=r"x must be a finite number of seconds > 0"):
        seconds(0, "x")
    with pytest.raises(ConfigError, match="x must be a number of seconds"):
        seconds(math, "x")


# -- routes never guess a partition count ------------------------------------------------------


def node(port: int) -> NodeInfo:
    return NodeInfo("127.0.0.1", port, port + 1, version="0.3.7-HA.1.13.0")


def watched_topic() -> Topic:
    """A producer's topic ``"t"`` as the lookup's watch keeps it."""
    pool = ConnectionPool(ConnectionConfig(), {})
    memo = SlotMemo(get_strategy("murmur3"))
    topic = Topic("t", lookup=None, static=None, memo=memo, pool=pool)
    topic.watched = True
    return topic


def test_a_fork_map_without_meta_keeps_the_last_known_count() -> None:
    topic = watched_topic()
    with_meta = PartitionMap(
        "t", "w", {0: node(1), 1: node(2), 2: node(3)}, meta=TopicMeta(3), fork=True
    )
    without = PartitionMap("t", "w", {0: node(1), 1: node(2)}, fork=True)
    assert Routes.from_map(without).count == 0  # unknown: never max(listed) + 1

    def routes_of(pmap: PartitionMap, topic: Topic = topic) -> Routes:
        topic._on_map(pmap)  # as the lookup's watch hands a new map over
        routes = topic.routes
        assert routes is not None
        return routes

    assert routes_of(without).count == 0
    assert routes_of(with_meta).count == 3
    routes = routes_of(PartitionMap("t", "w", {0: node(1), 1: node(2)}, fork=True))
    assert (routes.count, routes.writable, routes.ext) == (3, (0, 1), None)
    zero_meta = PartitionMap("t", "w", {0: node(1)}, meta=TopicMeta(0), fork=True)
    assert routes_of(zero_meta).count == 3  # a 0 from lookupd tells nothing either
    assert routes_of(without, watched_topic()).count == 0  # an expired topic starts over


def test_ext_headers_for_a_topic_lookup_describes_as_not_ext_are_refused() -> None:
    ext = PublishMessage(b"x", None, b"{}")
    with pytest.raises(UnsupportedByServerError, match="not an ext topic"):
        check_features(True, "t", [ext], defer=None, partition=0, ext_topic=False)
    check_features(True, "t", [ext], defer=None, partition=0, ext_topic=None)  # unknown: nsqd
    check_features(True, "t", [ext], defer=None, partition=0, ext_topic=True)
    check_features(True, "t", [PublishMessage(b"x")], defer=None, partition=0, ext_topic=False)


# -- redaction -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://alice:pw@h:4161", "http://***@h:4161"),
        (
            "['http://a:b@h:1', 'https://tok@[::1]:2/x']",
            "['http://***@h:1', 'https://***@[::1]:2/x']",
        ),
        ("nsqlookupd http://u:p@ss@h:1 unreachable", "nsqlookupd http://***@h:1 unreachable"),
        ("http://h:1/lookup?topic=a@b", "http://h:1/lookup?topic=a@b"),
        ("no url, a@b", "no url, a@b"),
    ],
)
def test_redact_hides_url_user_info(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_repr_of_a_producer_hides_lookupd_credentials() -> None:
    producer = Producer(lookupd=["http://alice:pw-1@127.0.0.1:4161", "127.0.0.1:4261"])
    text = repr(producer)
    assert "pw-1" not in text
    assert "alice" not in text
    assert "http://***@127.0.0.1:4161" in text


# -- idle topics -----------------------------------------------------------------------------


async def test_idle_topics_expire_after_their_timeout_and_busy_ones_wait() -> None:
    producer = Producer(nsqd="127.0.0.1:1", topic_idle_timeout=10.0)
    topics = {name: producer._topic(name) for name in "abc"}
    topics["a"].last_used, topics["b"].last_used, topics["c"].last_used = 100.0, 105.0, 109.0
    producer._free_idle_topics(now=109.0)
    assert producer.topics == {"a", "b", "c"}
    topics["a"].active += 1  # "a" busy (a lookup under way): used now
    producer._free_idle_topics(now=112.0)
    assert producer.topics == {"a", "b", "c"}
    topics["a"].active -= 1
    producer._free_idle_topics(now=119.0)
    assert producer.topics == {"a"}
    assert topics["a"].last_used == 112.0
    producer._free_idle_topics(now=122.0)
    assert producer.topics == frozenset()
    await producer.close()
