"""Producer parts that need no server: retry policy, window, routing decisions, arguments."""

from __future__ import annotations

import asyncio
import time

import pytest

from nsq_ha.connection import ConnectionConfig
from nsq_ha.errors import (
    ConfigError,
    InvalidArgumentError,
    InvalidNameError,
    NotLeaderError,
    ProducerClosedError,
    UnsupportedByServer,
    UnsupportedByServerError,
)
from nsq_ha.lookup import NodeInfo, PartitionMap, TopicMeta
from nsq_ha.producer import Producer, RetryPolicy
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.producer.routes import Routes, check_features
from nsq_ha.producer.topic import MEMO_KEY_LENGTH, MEMO_SIZE, SlotMemo, Topic, Window
from nsq_ha.protocol.publish import PublishMessage
from nsq_ha.retry import retry_after
from nsq_ha.routing import ShardingKey, ShardingStrategy, get_strategy


def node(port: int) -> NodeInfo:
    return NodeInfo("127.0.0.1", port, port + 1, version="0.3.7-HA.1.13.0")


def fork_map(partitions: dict[int, int], num: int, *, ext: bool = False) -> PartitionMap:
    return PartitionMap(
        topic="t",
        access="w",
        partitions={p: node(port) for p, port in partitions.items()},
        meta=TopicMeta(partition_num=num, replica=1, extend_support=ext),
        fork=True,
    )


# -- RetryPolicy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": True},
        {"deadline": 0},
        {"deadline": float("inf")},
        {"initial_backoff": -1},
        {"max_backoff": float("nan")},
        {"jitter": "1"},
        {"attempt_timeout": 0},
    ],
)
def test_retry_policy_refuses_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


async def always_failing(policy: RetryPolicy, retry: bool) -> int:
    """Publish tries that always fail with NotLeaderError, retried as the sender retries them
    (:func:`nsq_ha.retry.retry_after` with the policy's attempts, deadline and waits); return
    how many tries were made."""
    tries = 0

    async def attempt(number: int) -> None:
        nonlocal tries
        tries += 1
        raise NotLeaderError("E_FAILED_ON_NOT_LEADER")

    started = time.monotonic()
    try:
        await attempt(1)
    except NotLeaderError as first:
        with pytest.raises(NotLeaderError):
            await retry_after(
                first,
                attempt,
                what="publish",
                backoff=policy.waits,
                attempts=policy.attempts,
                deadline=policy.deadline,
                started=started,
                should_retry=lambda exc: retry,
            )
    return tries


async def test_retry_policy_stops_after_its_attempts_and_skips_what_it_must_not_retry() -> None:
    policy = RetryPolicy(attempts=3, initial_backoff=0, max_backoff=0, jitter=0)
    assert await always_failing(policy, retry=True) == 3
    assert await always_failing(policy, retry=False) == 1
    assert RetryPolicy.no_retry().attempts == 1


async def test_retry_policy_deadline_ends_retries() -> None:
    policy = RetryPolicy(attempts=1000, deadline=0.05, initial_backoff=0.01, max_backoff=0.01)
    assert 2 <= await always_failing(policy, retry=True) < 50


def test_backoff_doubles_up_to_its_cap_plus_jitter() -> None:
    waits = RetryPolicy(initial_backoff=0.1, max_backoff=0.5, jitter=0.0).waits
    assert [waits.delay(n) for n in (1, 2, 3, 4, 5, 1000)] == [0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
    jittered = RetryPolicy(initial_backoff=0.1, max_backoff=0.5, jitter=0.2).waits
    assert all(0.1 <= jittered.delay(1) <= 0.3 for _ in range(50))


def _topic(strategy: ShardingStrategy) -> Topic:
    """A producer's topic ``"t"`` routing keys with ``strategy``."""
    pool = ConnectionPool(ConnectionConfig(), {})
    return Topic("t", lookup=None, static=None, memo=SlotMemo(strategy), pool=pool)


# -- window -----------------------------------------------------------------------------------


async def test_window_admits_size_holders_in_fifo_order() -> None:
    window = Window(2)
    order: list[int] = []
    release = asyncio.Event()

    async def holder(i: int) -> None:
        async with window:
            order.append(i)
            await release.wait()

    tasks = [asyncio.create_task(holder(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert order == [0, 1]
    tasks[3].cancel()  # a waiter that gives up does not take a slot
    release.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert order == [0, 1, 2, 4]
    assert window.free == 2
    assert not window.waiters


async def test_window_slot_handed_to_a_cancelled_waiter_is_passed_on() -> None:
    window = Window(1)
    await window.__aenter__()
    waiter = asyncio.create_task(window.__aenter__())
    await asyncio.sleep(0)
    await window.__aexit__()  # hands the slot to the waiter...
    waiter.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert window.free == 1


# -- routes -----------------------------------------------------------------------------------


def test_routes_from_a_fork_map_and_a_vanilla_map() -> None:
    routes = Routes.from_map(fork_map({0: 4150, 2: 4152}, 4, ext=True))
    assert routes.fork is True
    assert routes.count == 4
    assert routes.writable == (0, 2)
    assert routes.ext is True
    assert routes.addresses == {0: "127.0.0.1:4150", 2: "127.0.0.1:4152"}
    vanilla = PartitionMap("t", "w", producers=(node(4150), node(4160)))
    vroutes = Routes.from_map(vanilla)
    assert vroutes.fork is False
    assert vroutes.count == 2
    assert vroutes.addresses == {0: "127.0.0.1:4150", 1: "127.0.0.1:4160"}


def slot_of(table: Topic, routes: Routes, key: object, partition: object) -> int | None:
    """The slot ``table`` places a plain message of a call with ``key`` and ``partition`` in."""
    return table.place(routes, [PublishMessage(b"x")], key, partition)


def test_slots_of_keys_partitions_and_round_robin() -> None:
    table = _topic(get_strategy("java"))
    routes = Routes.from_map(fork_map({0: 1, 1: 2, 2: 3, 3: 4}, 4))
    # the java strategy: "publish_test_case" -> 1 of 4 (PROTOCOL.md §6.2)
    assert slot_of(table, routes, "publish_test_case", None) == 1
    assert slot_of(table, routes, "publish_test_case", None) == get_strategy("java").partition(
        "publish_test_case", 4
    )
    assert slot_of(table, routes, None, 3) == 3
    assert slot_of(table, routes, None, None) is None
    with pytest.raises(ConfigError, match="not both"):
        slot_of(table, routes, "k", 1)
    with pytest.raises(ConfigError, match=r"0\.\.3"):
        slot_of(table, routes, None, 4)
    with pytest.raises(ConfigError, match="int"):
        slot_of(table, routes, None, True)
    vanilla = Routes.from_map(PartitionMap("t", "w", producers=(node(1),)))
    with pytest.raises(UnsupportedByServerError, match="no partitions"):
        slot_of(table, vanilla, None, 0)
    with pytest.raises(UnsupportedByServerError, match="fork"):  # nsqd= nodes of unknown kind
        slot_of(table, Routes("t", None, {0: node(1)}, 1), None, 0)
    assert [table.next_slot(routes) for _ in range(5)] == [0, 1, 2, 3, 0]


class CountingStrategy:
    """murmur3, counting the keys it hashes."""

    def __init__(self) -> None:
        self.hashed: list[object] = []
        self.strategy = ShardingStrategy("counting", "murmur3, counted", self.partition)

    def partition(self, key: ShardingKey, n: int) -> int:
        self.hashed.append(key)
        return get_strategy("murmur3").partition(key, n)


def test_a_key_routed_before_is_not_hashed_again() -> None:
    counting = CountingStrategy()
    table = _topic(counting.strategy)
    four = Routes.from_map(fork_map({0: 1, 1: 2, 2: 3, 3: 4}, 4))
    seven = Routes.from_map(fork_map({p: p + 1 for p in range(7)}, 7))
    keys: list[ShardingKey] = ["user-1", "user-2", b"user-1", 1, 2, -(1 << 63), "\u00e9t\u00e9"]
    for _ in range(50):
        for key in keys:
            assert slot_of(table, four, key, None) == get_strategy("murmur3").partition(key, 4)
            assert slot_of(table, seven, key, None) == get_strategy("murmur3").partition(key, 7)
    assert len(counting.hashed) == 2 * len(keys)  # once per key and partition count


def test_keys_equal_to_a_routed_key_but_not_valid_are_still_refused() -> None:
    table = _topic(get_strategy("murmur3"))
    routes = Routes.from_map(fork_map({0: 1, 1: 2, 2: 3, 3: 4}, 4))
    slot_of(table, routes, 1, None)
    for bad in (True, 1.0, "\ud800", "\ud800"):  # True == 1 == 1.0; a lone surrogate twice
        with pytest.raises(InvalidArgumentError):
            slot_of(table, routes, bad, None)


def test_the_keys_remembered_are_bounded() -> None:
    """Long keys are hashed each time (not kept); past the limit the memo starts over."""
    counting = CountingStrategy()
    table = _topic(counting.strategy)
    routes = Routes.from_map(fork_map({0: 1, 1: 2, 2: 3, 3: 4}, 4))
    long_key = "k" * (MEMO_KEY_LENGTH + 1)
    slot_of(table, routes, long_key, None)
    slot_of(table, routes, long_key, None)
    assert counting.hashed == [long_key, long_key]
    for i in range(MEMO_SIZE + 1):
        slot_of(table, routes, i, None)
    counting.hashed.clear()
    slot_of(table, routes, 0, None)
    assert counting.hashed == [0]


def test_a_keyed_message_with_a_feature_the_topic_lacks_is_refused() -> None:
    table = _topic(get_strategy("murmur3"))
    routes = Routes.from_map(fork_map({0: 1, 1: 2}, 2))  # not an ext topic
    plain = table.place(routes, [PublishMessage(b"x")], "k", None)
    assert plain == get_strategy("murmur3").partition("k", 2)
    with pytest.raises(UnsupportedByServer, match="not an ext topic"):
        table.place(routes, [PublishMessage(b"x"), PublishMessage(b"y", None, b"{}")], "k", None)


def test_features_each_server_lacks_are_refused_before_sending() -> None:
    plain, traced, ext = (
        PublishMessage(b"x"),
        PublishMessage(b"x", 1),
        PublishMessage(b"x", None, b"{}"),
    )
    with pytest.raises(UnsupportedByServer, match="DPUB"):
        check_features(True, "t", [plain], defer=1.0, partition=None)
    with pytest.raises(UnsupportedByServer, match="partitions"):
        check_features(False, "t", [plain], defer=None, partition=0)
    with pytest.raises(UnsupportedByServer, match="PUB_TRACE"):
        check_features(False, "t", [traced], defer=None, partition=None)
    with pytest.raises(UnsupportedByServer, match="PUB_EXT"):
        check_features(False, "t", [ext], defer=None, partition=None)
    check_features(None, "t", [traced], defer=1.0, partition=None)  # unknown kind: decided later
    check_features(False, "t", [plain], defer=1.0, partition=None)
    check_features(True, "t", [traced, ext], defer=None, partition=3)


# -- arguments --------------------------------------------------------------------------------


def test_producer_needs_exactly_one_source() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        Producer()
    with pytest.raises(ConfigError, match="exactly one"):
        Producer(nsqd="127.0.0.1:4150", lookupd="127.0.0.1:4161")
    with pytest.raises(ConfigError, match="host:port"):
        Producer(nsqd="nowhere")
    with pytest.raises(ConfigError):
        Producer(nsqd=[])
    with pytest.raises(ConfigError):
        Producer(nsqd="127.0.0.1:4150", unkeyed_window=0)
    with pytest.raises(InvalidArgumentError):
        Producer(nsqd="127.0.0.1:4150", strategy="crc32")


async def test_bad_input_is_refused_before_any_connection() -> None:
    # nothing listens on port 1: any attempt to send would fail with a connection error instead
    producer = Producer(nsqd="127.0.0.1:1")
    with pytest.raises(InvalidNameError):
        await producer.publish("bad topic!", b"x")
    with pytest.raises(InvalidArgumentError, match="empty"):
        await producer.publish("t", b"")
    with pytest.raises(InvalidArgumentError, match="over the limit"):
        await producer.publish("t", b"x" * (producer.config.connection.max_msg_size + 1))
    with pytest.raises(ConfigError, match="defer"):
        await producer.publish("t", b"x", defer=-1)
    with pytest.raises(ConfigError, match="sequence of bodies"):
        await producer.publish_many("t", b"abc")
    with pytest.raises(ConfigError, match="2 entries for 1"):
        await producer.publish_many("t", [b"a"], trace_ids=[1, 2])
    with pytest.raises(ConfigError, match="not both"):
        await producer.publish_many("t", [b"a"], ext={}, exts=[{}])
    assert await producer.publish_many("t", []) == []
    assert producer.stats["connections"] == 0
    await producer.close()
    with pytest.raises(ProducerClosedError):
        await producer.publish("t", b"x")
    await producer.close()  # twice is fine


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"sharding_key": 1.5}, InvalidArgumentError),
        ({"sharding_key": "k", "partition": 1}, ConfigError),
        ({"partition": "1"}, ConfigError),
    ],
)
async def test_a_refused_first_keyed_publish_leaves_no_state(
    options: dict[str, object], error: type[Exception]
) -> None:
    """Bad input is refused before anything is kept for the topic (or looked up, or sent)."""
    async with Producer(nsqd="127.0.0.1:1") as producer:
        with pytest.raises(error):
            await producer.publish("t", b"x", **options)  # type: ignore[arg-type]
        assert producer.topics == frozenset()
