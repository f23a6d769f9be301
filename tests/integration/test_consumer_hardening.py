"""Consumer hardening: serial handling of ordered partitions through redeliveries,
answers validated before anything changes, every duration option checked, unknown partitions
refused.

The order tests record every handler call (partition, offset, start, end) and check, per
partition, that no two calls overlap and that calls complete in offset order (a redelivered copy
counts again, right after the first call of the same message). They run on the embedded broker
(leader move, and ``msg_timeout``) and on the real fork cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from nsq_ha import sync
from nsq_ha.consumer import Consumer, Message
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.errors import ConfigError, MessageResponseError, TopicNotFoundError
from nsq_ha.producer import Producer
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

from .helpers import wait_for_count

BODIES = [b"m0", b"m1", b"m2"]
#: how each test consumes: Consumer.run, three ``async for`` readers, run_batches x 3
MODES = ["run", "iter", "batches"]


@dataclass(frozen=True)
class Call:
    """One handler call."""

    partition: int | None
    offset: int | None
    body: bytes
    attempts: int
    start: float
    end: float


def assert_serial_per_partition(calls: list[Call]) -> None:
    """No overlap within a partition, and completion in offset order."""
    by_partition: dict[int | None, list[Call]] = {}
    for call in calls:
        by_partition.setdefault(call.partition, []).append(call)
    for partition, group in by_partition.items():
        by_start = sorted(group, key=lambda c: c.start)
        for before, after in itertools.pairwise(by_start):
            assert after.start >= before.end, (
                f"partition {partition}: {after.body!r} (attempt {after.attempts}) started at "
                f"{after.start:.3f} before {before.body!r} (attempt {before.attempts}) ended at "
                f"{before.end:.3f}"
            )
        completed = [(c.offset, c.body) for c in sorted(group, key=lambda c: c.end)]
        assert completed == sorted(completed), f"partition {partition}: completed {completed}"


async def consume_through_redelivery(
    consumer: Consumer,
    mode: str,
    fault: Callable[[], Awaitable[object]],
    *,
    lookupd: str,
    within: float,
) -> list[Call]:
    """Consume m0..m2 of one ordered partition; the first m0 handler runs ``fault`` and then
    holds on until the consumer has received m0 again (the redelivered copy), plus 0.3 s."""
    loop = asyncio.get_running_loop()
    calls: list[Call] = []
    finished = asyncio.Event()
    first = True

    async def handle(message: Message) -> None:
        nonlocal first
        start = loop.time()
        if message.body == b"m0" and first:
            first = False
            await fault()
            await wait_for_count(consumer, "received", 2, within=within)  # the copy is here
            await asyncio.sleep(0.3)
        end = loop.time()
        calls.append(
            Call(message.partition, message.offset, message.body, message.attempts, start, end)
        )
        if message.body == b"m2":
            finished.set()

    async def batch(messages: list[Message]) -> None:
        for message in messages:
            await handle(message)

    async def reader() -> None:
        async for message in consumer:
            await handle(message)
            if not message.responded:
                with contextlib.suppress(MessageResponseError):
                    await message.finish()

    await consumer.start()  # the channel exists from here on: publish
    assert consumer.is_ordered
    async with Producer(lookupd=lookupd) as producer:
        for body in BODIES:
            await producer.publish(consumer.topic, body, partition=0)
    runner: asyncio.Future[object]
    if mode == "run":
        runner = asyncio.ensure_future(consumer.run(handle))
    elif mode == "iter":
        runner = asyncio.gather(*(reader() for _ in range(3)))
    else:
        runner = asyncio.ensure_future(consumer.run_batches(batch, max_wait=0.05, concurrency=3))
    try:
        async with asyncio.timeout(within):
            await finished.wait()
            await asyncio.sleep(0.5)  # let anything still running end (it would overlap)
    finally:
        await consumer.close(drain_timeout=5)
        async with asyncio.timeout(30):
            await runner
    return calls


# -- 1. ordered partitions are handled serially, redeliveries included ------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_devcluster_leader_move_copy_waits_for_the_first_handler(
    devcluster: DevClusterThread, mode: str
) -> None:
    devcluster.create_topic("ord_move", 1, 2, ordered=True)
    consumer = Consumer(
        "ord_move", "c", lookupd=devcluster.lookupd_http, lookup_interval=1.0, max_in_flight=16
    )

    async def move() -> None:
        await asyncio.sleep(0.3)
        await asyncio.to_thread(devcluster.move_leader, "ord_move", 0)

    calls = await consume_through_redelivery(
        consumer, mode, move, lookupd=devcluster.lookupd_http, within=20
    )
    assert [c.body for c in calls].count(b"m0") == 2  # the first call, then the copy
    assert_serial_per_partition(calls)


@pytest.mark.devcluster(nodes=1)
@pytest.mark.parametrize("mode", MODES)
async def test_devcluster_msg_timeout_copy_waits_for_the_first_handler(
    devcluster: DevClusterThread, mode: str
) -> None:
    devcluster.create_topic("ord_timeout", 1, 1, ordered=True)
    consumer = Consumer(
        "ord_timeout", "c", lookupd=devcluster.lookupd_http, msg_timeout=1.0, max_in_flight=16
    )

    async def nothing() -> None:
        return None

    calls = await consume_through_redelivery(
        consumer, mode, nothing, lookupd=devcluster.lookupd_http, within=20
    )
    assert [c.body for c in calls].count(b"m0") == 2
    assert_serial_per_partition(calls)


@pytest.mark.fork
async def test_fork_msg_timeout_copy_waits_for_the_first_handler(
    fork_cluster: ForkCluster,
) -> None:
    topic = "ch_ord_timeout"
    if topic not in fork_cluster.topics:
        await asyncio.to_thread(fork_cluster.create_topic, topic, 1, 1, True)
    consumer = Consumer(
        topic, f"c{uuid.uuid4().hex[:8]}", lookupd=fork_cluster.lookupd_http, msg_timeout=1.0
    )

    async def nothing() -> None:
        return None

    calls = await consume_through_redelivery(
        consumer, "run", nothing, lookupd=fork_cluster.lookupd_http, within=60
    )
    assert [c.body for c in calls].count(b"m0") >= 2
    assert_serial_per_partition(calls)


@pytest.mark.fork
async def test_fork_leader_move_copy_waits_for_the_first_handler(
    fork_cluster: ForkCluster,
) -> None:
    topic = "ch_ord_move"
    if topic not in fork_cluster.topics:
        await asyncio.to_thread(fork_cluster.create_topic, topic, 1, 2, True)
    consumer = Consumer(
        topic,
        f"c{uuid.uuid4().hex[:8]}",
        lookupd=fork_cluster.lookupd_http,
        lookup_interval=1.0,
        reconnect_interval=0.5,
    )

    moves: list[asyncio.Future[object]] = []

    async def move() -> None:  # in the background: the handler goes on waiting for the copy
        moves.append(asyncio.ensure_future(asyncio.to_thread(fork_cluster.move_leader, topic, 0)))

    calls = await consume_through_redelivery(
        consumer, "run", move, lookupd=fork_cluster.lookupd_http, within=240
    )
    await asyncio.wait_for(moves[0], 200)
    assert [c.body for c in calls].count(b"m0") >= 2
    assert_serial_per_partition(calls)


@pytest.mark.devcluster(nodes=1)
async def test_devcluster_copy_after_a_requeue_waits_for_the_handler_that_requeued(
    devcluster: DevClusterThread,
) -> None:
    devcluster.create_topic("ord_req", 1, 1, ordered=True)
    loop = asyncio.get_running_loop()
    calls: list[Call] = []
    done = asyncio.Event()

    async def handle(message: Message) -> None:
        start = loop.time()
        if message.attempts == 1 and message.body == b"m0":
            await message.requeue(backoff=False)  # nsqd sends it straight back
            await asyncio.sleep(0.5)  # ... while this call still runs
        calls.append(
            Call(
                message.partition,
                message.offset,
                message.body,
                message.attempts,
                start,
                loop.time(),
            )
        )
        if message.body == b"m2":
            done.set()

    async with Consumer("ord_req", "c", lookupd=devcluster.lookupd_http) as consumer:
        async with Producer(lookupd=devcluster.lookupd_http) as producer:
            for body in BODIES:
                await producer.publish("ord_req", body, partition=0)
        runner = asyncio.ensure_future(consumer.run(handle))
        async with asyncio.timeout(20):
            await done.wait()
        await consumer.close()
        await asyncio.wait_for(runner, 10)
    assert [(c.body, c.attempts) for c in calls] == [(b"m0", 1), (b"m0", 2), (b"m1", 1), (b"m2", 1)]
    assert_serial_per_partition(calls)


# -- 8. a bad requeue delay changes nothing ----------------------------------------------------


@pytest.mark.vanilla
@pytest.mark.parametrize("delay", [-1, math.nan, math.inf, -math.inf, 1e300, True, "5"])
async def test_bad_requeue_delay_is_refused_and_the_message_stays_answerable(
    vanilla_cluster: VanillaCluster, delay: object
) -> None:
    topic = f"ch_{uuid.uuid4().hex[:10]}"
    address = vanilla_cluster.nodes[0].tcp_address
    async with Consumer(topic, "c", nsqd=address, max_in_flight=1) as consumer:
        async with Producer(nsqd=address) as producer:
            await producer.publish_many(topic, [b"first", b"second"])
        message = await consumer.get(timeout=10)
        assert message is not None
        with pytest.raises(ConfigError, match="requeue delay"):
            await message.requeue(delay)  # type: ignore[arg-type]
        assert not message.responded
        assert consumer.stats["in_flight"] == 1
        assert consumer.stats["requeued"] == 0
        await message.requeue(0, backoff=False)  # still held, and answerable
        seen: list[bytes] = []
        async with asyncio.timeout(15):
            while set(seen) != {b"first", b"second"}:
                got = await consumer.get()
                assert got is not None
                seen.append(got.body)
                await got.finish()
        assert seen.count(message.body) == 1  # it came back once, after the good requeue
        assert consumer.stats["in_flight"] == 0
        assert consumer.stats["requeued"] == 1


# -- 18. a partition the topic does not have is refused at start ---------------------------------


@pytest.mark.parametrize("partitions", [[999], [0, 2]])
async def test_devcluster_unknown_partition_is_refused_at_start(
    devcluster: DevClusterThread, partitions: list[int]
) -> None:
    devcluster.create_topic("two_parts", 2, 1)
    consumer = Consumer("two_parts", "c", lookupd=devcluster.lookupd_http, partitions=partitions)
    async with asyncio.timeout(15):
        with pytest.raises(ConfigError, match=r"has 2 partitions.*\[2|has 2 partitions.*999"):
            await consumer.start()
        assert consumer.connections == {}
        await consumer.close()


@pytest.mark.fork
async def test_fork_unknown_partition_is_refused_at_start(fork_cluster: ForkCluster) -> None:
    topic = "ch_two_parts"
    if topic not in fork_cluster.topics:
        await asyncio.to_thread(fork_cluster.create_topic, topic, 2, 1)
    consumer = Consumer(topic, "c", lookupd=fork_cluster.lookupd_http, partitions=[1, 999])
    async with asyncio.timeout(30):
        with pytest.raises(ConfigError, match=r"has 2 partitions \(0\.\.1\).*\[999\]"):
            await consumer.start()
        assert consumer.connections == {}
        await consumer.close()
    async with Consumer(topic, "c", lookupd=fork_cluster.lookupd_http, partitions=[1]) as good:
        assert [key[1] for key in good.connections] == [1]


@pytest.mark.fork
async def test_an_unknown_fork_topic_names_the_command_and_the_admin_call_that_create_it(
    fork_cluster: ForkCluster,
) -> None:
    """A consumer of a topic the fork does not have says how to create one: the command line's
    nsq-ha topic create and LookupdAdmin.create_topic, not nsqlookupd's raw HTTP call."""
    consumer = Consumer("ch_no_such_topic", "c", lookupd=fork_cluster.lookupd_http)
    async with asyncio.timeout(30):
        with pytest.raises(TopicNotFoundError) as raised:
            await consumer.start()
        await consumer.close()
    text = str(raised.value)
    assert "nsq-ha topic create" in text, text
    assert "LookupdAdmin.create_topic" in text, text


@pytest.mark.devcluster(nodes=1)
@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()], ids=["exit", "ctrl-c"])
def test_an_on_give_up_that_calls_sys_exit_requeues_its_message(
    devcluster: DevClusterThread, raised: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """``on_give_up`` runs on the client's event loop: sys.exit() (or KeyboardInterrupt) there
    is logged as the callback's error and the message is requeued, as for any other failure,
    instead of being held, unanswered, until nsqd's msg_timeout (and close's drain)."""
    devcluster.create_topic("give_up_exit", 1, 1)
    lookupd = devcluster.lookupd_http
    attempts: list[int] = []
    again = threading.Event()

    def stops(message: Message) -> None:
        attempts.append(message.attempts)
        if len(attempts) == 1:
            raise raised
        again.set()  # the requeued message, given up once more: this time it returns

    consumer = sync.Consumer(
        "give_up_exit",
        "c",
        lookupd=lookupd,
        max_attempts=1,
        on_give_up=stops,
        backoff=None,
        requeue_delay=0,
        drain_timeout=30,
    )
    try:
        with sync.Producer(lookupd=lookupd) as producer:
            producer.publish("give_up_exit", b"poison")
        first = consumer.get(timeout=10)
        assert first is not None
        with caplog.at_level(logging.ERROR):
            first.requeue(0)  # attempt 2 > max_attempts: on_give_up
            came_back = again.wait(10)
    finally:
        started = time.monotonic()
        consumer.close()
        closed_in = time.monotonic() - started
    assert came_back, f"the message given up was never requeued (on_give_up saw {attempts})"
    assert attempts == [2, 3]
    assert closed_in < 10, f"close waited {closed_in:.1f} s for a held message"
    assert "on_give_up" in caplog.text
    assert "must not" in caplog.text
