"""Consumer against real vanilla nsqd/nsqlookupd 1.3.0 (nsqd= addresses and lookupd=)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import httpx
import pytest

from nsq_ha import sync
from nsq_ha.consumer import Consumer, Fixed, Message
from nsq_ha.errors import (
    ConfigError,
    MessageAlreadyRespondedError,
    MessageConnectionGoneError,
    UnsupportedByServerError,
)
from nsq_ha.producer import Producer
from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.servers import VanillaCluster

from .helpers import channel_totals, collect, run_and_close_under_load, wait_for_count

pytestmark = pytest.mark.vanilla


def _topic() -> str:
    return f"cv_{uuid.uuid4().hex[:10]}"


async def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer(nsqd=address) as producer:
        for start in range(0, len(bodies), 1000):
            await producer.publish_many(topic, bodies[start : start + 1000])


def channel_stats(cluster: VanillaCluster, topic: str, channel: str) -> dict[str, int]:
    """in_flight_count, depth, deferred_count of ``channel`` summed over the nsqd nodes."""
    keys = ("in_flight_count", "depth", "deferred_count", "client_count")
    return channel_totals([n.http_url for n in cluster.nodes], topic, channel, keys)


async def test_lookupd_consumer_reads_every_node_with_vanilla_message_fields(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    vanilla_cluster.create_topic(topic)
    for index, node in enumerate(vanilla_cluster.nodes):
        await publish(node.tcp_address, topic, [b"n%d-%d" % (index, i) for i in range(50)])
    await asyncio.sleep(0.3)  # nsqd registers the topic with nsqlookupd asynchronously
    async with Consumer(topic, "all", lookupd=vanilla_cluster.lookupd_http) as consumer:
        assert len(consumer.connections) == len(vanilla_cluster.nodes)
        messages = await collect(consumer, 100)
        stats = consumer.stats
    bodies = sorted(m.body for m in messages)
    assert bodies == sorted(b"n%d-%d" % (n, i) for n in range(2) for i in range(50))
    first = messages[0]
    assert len(first.id) == 16
    assert first.id.isalnum()
    assert (first.trace_id, first.partition, first.offset, first.ext) == (None, None, None, {})
    assert first.attempts == 1
    assert first.timestamp > 1_600_000_000 * 10**9
    assert {m.address for m in messages} == {n.tcp_address for n in vanilla_cluster.nodes}
    assert stats["received"] == stats["finished"] == 100
    assert stats["in_flight"] == 0
    assert channel_stats(vanilla_cluster, topic, "all")["in_flight_count"] == 0


async def test_run_finishes_on_return_and_requeues_on_exception_with_attempts(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"ok", b"flaky"])
    seen: list[tuple[bytes, int]] = []
    done = asyncio.Event()

    async def handler(message: Message) -> None:
        seen.append((message.body, message.attempts))
        if message.body == b"flaky" and message.attempts < 3:
            raise RuntimeError("not yet")
        if len(seen) == 4:
            done.set()

    consumer = Consumer(
        topic, "run", nsqd=address, requeue_delay=0.05, backoff=Fixed(0.1), max_in_flight=5
    )
    runner = asyncio.create_task(consumer.run(handler))
    await asyncio.wait_for(done.wait(), 20)
    await consumer.close()
    await runner  # run() returns once the consumer is closed
    assert sorted(seen) == [(b"flaky", 1), (b"flaky", 2), (b"flaky", 3), (b"ok", 1)]
    stats = consumer.stats
    assert (stats["finished"], stats["requeued"], stats["received"]) == (2, 2, 4)
    assert channel_stats(vanilla_cluster, topic, "run")["depth"] == 0


async def test_max_attempts_gives_up_through_on_give_up_then_finishes(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"poison"])
    given_up: list[int] = []
    gave_up = asyncio.Event()

    def on_give_up(message: Message) -> None:
        given_up.append(message.attempts)
        gave_up.set()

    async def handler(message: Message) -> None:
        raise ValueError("always fails")

    consumer = Consumer(
        topic,
        "poison",
        nsqd=address,
        max_attempts=2,
        on_give_up=on_give_up,
        requeue_delay=0,
        backoff=None,
    )
    runner = asyncio.create_task(consumer.run(handler))
    await asyncio.wait_for(gave_up.wait(), 20)
    await consumer.close()
    await runner
    assert given_up == [3]
    stats = consumer.stats
    assert (stats["requeued"], stats["given_up"], stats["finished"]) == (2, 1, 1)
    assert channel_stats(vanilla_cluster, topic, "poison")["depth"] == 0


async def test_touch_keeps_a_slow_message_and_without_it_it_comes_back(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"slow-touched", b"slow-untouched"])
    async with Consumer(topic, "slow", nsqd=address, msg_timeout=1.0, max_in_flight=1) as c:
        touched = await c.get(timeout=10)
        assert touched is not None
        assert touched.body == b"slow-touched"
        for _ in range(6):  # 2.4 s, well past the 1 s msg_timeout
            await asyncio.sleep(0.4)
            await touched.touch()
        await touched.finish()  # still ours: no E_FIN_FAILED, no redelivery
        untouched = await c.get(timeout=10)
        assert untouched is not None
        assert untouched.attempts == 1
        again = await c.get(timeout=10)  # not answered: nsqd times it out and sends it again
        assert again is not None
        assert again.body == b"slow-untouched"
        assert again.attempts == 2
        with pytest.raises(MessageAlreadyRespondedError):
            await untouched.finish()
        await again.finish()
        stats = c.stats
    assert (stats["received"], stats["finished"], stats["timed_out"]) == (3, 2, 1)


async def test_close_under_load_leaves_nothing_in_flight(vanilla_cluster: VanillaCluster) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    published = 50_000
    await publish(address, topic, [b"m%d" % i for i in range(published)])
    consumer = Consumer(topic, "load", nsqd=address, max_in_flight=2500, drain_timeout=5)
    stats = await run_and_close_under_load(consumer)
    after = channel_stats(vanilla_cluster, topic, "load")
    print(f"CLOSE-UNDER-LOAD vanilla stats={stats} nsqd={after}")
    assert after["in_flight_count"] == 0
    assert after["deferred_count"] == 0
    assert stats["requeued"] > 0, "nothing was in flight at close: no load"
    assert stats["finished"] + after["depth"] == published
    assert stats["in_flight"] == 0


async def test_one_in_flight_over_two_nodes_starves_neither(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    vanilla_cluster.create_topic(topic)
    for index, node in enumerate(vanilla_cluster.nodes):
        await publish(node.tcp_address, topic, [b"n%d-%d" % (index, i) for i in range(200)])
    await asyncio.sleep(0.3)
    per_node: dict[str, int] = {}
    async with Consumer(
        topic,
        "starve",
        lookupd=vanilla_cluster.lookupd_http,
        max_in_flight=1,
        rdy_redistribute_interval=0.1,
        low_rdy_timeout=0.3,
    ) as consumer:
        deadline = time.monotonic() + 20
        while len(per_node) < 2 and time.monotonic() < deadline:
            message = await consumer.get(timeout=5)
            assert message is not None
            per_node[message.address] = per_node.get(message.address, 0) + 1
            await message.finish()
            # the budget is never exceeded, whatever the rotation does
            assert sum(c.in_flight for c in consumer.connections.values()) <= 1
    assert len(per_node) == 2, per_node


async def test_backoff_pauses_every_connection_then_recovers(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"a", b"b", b"c"])
    consumer = Consumer(
        topic, "backoff", nsqd=address, backoff=Fixed(2.0), requeue_delay=0, max_in_flight=1
    )
    async with consumer:
        first = await consumer.get(timeout=10)
        assert first is not None
        assert first.body == b"a"
        await first.requeue()  # a failure: level 1, RDY 0 everywhere for 2 s
        assert consumer.stats["backoff_level"] == 1
        assert await consumer.get(timeout=1.0) is None  # paused although 3 are queued
        ready = await asyncio.to_thread(_ready_count, vanilla_cluster, topic, "backoff")
        assert ready == 0
        received: list[Message] = []
        while len(received) < 3:
            message = await consumer.get(timeout=10)
            assert message is not None
            received.append(message)
            await message.finish()
        assert consumer.stats["backoff_level"] == 0
    # (vanilla nsqd puts a requeued message behind the queued ones)
    assert sorted((m.body, m.attempts) for m in received) == [(b"a", 2), (b"b", 1), (b"c", 1)]


def _ready_count(cluster: VanillaCluster, topic: str, channel: str) -> int:
    node = cluster.nodes[0]
    data = httpx.get(
        f"{node.http_url}/stats", params={"format": "json", "topic": topic}, timeout=5
    ).json()
    for entry in data["topics"]:
        for ch in entry["channels"]:
            if ch["channel_name"] == channel:
                return sum(client["ready_count"] for client in ch["clients"])
    raise AssertionError("channel not found")


async def test_batches_and_a_message_whose_connection_is_gone(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"b%d" % i for i in range(250)])
    batches: list[int] = []

    async def handler(batch: list[Message]) -> None:
        batches.append(len(batch))

    consumer = Consumer(topic, "batch", nsqd=address, max_in_flight=100)
    runner = asyncio.create_task(consumer.run_batches(handler, max_size=40, max_wait=0.2))
    await wait_for_count(consumer, "finished", 250)
    await consumer.close()
    await runner
    assert sum(batches) == 250
    assert max(batches) <= 40

    await publish(address, topic, [b"orphan"])
    async with Consumer(topic, "batch", nsqd=address, msg_timeout=1.0) as consumer:
        message = await consumer.get(timeout=10)
        assert message is not None
        assert message.body == b"orphan"
        conn = next(iter(consumer.connections.values()))
        await conn._transport.close()  # type: ignore[union-attr]  # the socket breaks
        await conn.wait_closed()
        with pytest.raises(MessageConnectionGoneError):
            await message.finish()
        again = await consumer.get(timeout=15)  # reconnected; nsqd redelivered it
        assert again is not None
        assert again.body == b"orphan"
        assert again.attempts == 2
        await again.finish()
        assert consumer.stats["abandoned"] == 1


async def test_sync_iterator(vanilla_cluster: VanillaCluster) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"s%d" % i for i in range(20)])

    def consume() -> list[bytes]:
        bodies: list[bytes] = []
        with sync.Consumer(topic, "sync", nsqd=address) as consumer:
            for message in consumer:
                bodies.append(message.body)
                message.finish()
                if len(bodies) == 20:
                    break
        return bodies

    bodies = await asyncio.to_thread(consume)
    assert sorted(bodies) == sorted(b"s%d" % i for i in range(20))


def test_sync_answers_are_posted_and_a_second_answer_is_refused_at_once(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    asyncio.run(publish(address, topic, [b"a", b"b"]))
    with sync.Consumer(topic, "answers", nsqd=address, max_in_flight=2) as consumer:
        first = consumer.get(timeout=10)
        second = consumer.get(timeout=10)
        assert first is not None
        assert second is not None
        first.finish()
        assert first.responded  # at once, before the loop has written the FIN
        with pytest.raises(MessageAlreadyRespondedError, match="already finished"):
            first.requeue()
        with pytest.raises(ConfigError):
            second.requeue(delay=-1)  # a bad delay changes nothing: it can still be answered
        second.requeue(0, backoff=False)
        again = consumer.get(timeout=10)
        assert again is not None
        assert (again.body, again.attempts) == (second.body, 2)
        again.finish()
    assert consumer.stats["finished"] == 2
    assert consumer.stats["requeued"] == 1


def test_sync_close_requeues_what_was_fetched_and_not_handed_out(
    vanilla_cluster: VanillaCluster,
) -> None:
    """The blocking consumer fetches what has arrived in one hand-over; closing gives back at
    once what it fetched and did not hand out, without waiting for drain_timeout."""
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    bodies = [b"f%d" % i for i in range(50)]
    asyncio.run(publish(address, topic, bodies))
    consumer = sync.Consumer(topic, "fetched", nsqd=address, max_in_flight=50)
    deadline = time.monotonic() + 30
    while consumer.stats["received"] < 50:  # all arrived: the first get fetches them all
        assert time.monotonic() < deadline, consumer.stats
        time.sleep(0.05)
    first = consumer.get(timeout=10)
    assert first is not None
    first.finish()
    closer = threading.Thread(target=consumer.close, kwargs={"drain_timeout": 300})
    closer.start()
    closer.join(60)  # a deadline far below drain_timeout: nothing held was waited for
    assert not closer.is_alive(), "close() waited for messages fetched but never handed out"

    async def the_rest() -> list[bytes]:
        async with Consumer(topic, "fetched", nsqd=address, max_in_flight=50) as again:
            return [m.body for m in await collect(again, 49)]

    assert sorted(asyncio.run(the_rest())) == sorted(b for b in bodies if b != first.body)


def test_sync_consumer_close_from_another_thread_ends_the_iteration(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    consumer = sync.Consumer(topic, "idle", nsqd=address)
    closing = threading.Event()

    def close() -> None:
        closing.set()
        consumer.close()

    timer = threading.Timer(0.5, close)
    timer.start()
    assert list(consumer) == []
    assert closing.is_set()  # the iteration ended because of close(), not before it
    timer.join()


async def test_fork_only_features_are_refused_clearly(vanilla_cluster: VanillaCluster) -> None:
    topic = _topic()
    vanilla_cluster.create_topic(topic)
    address = vanilla_cluster.nodes[0].tcp_address
    with pytest.raises(UnsupportedByServerError, match="fork"):
        async with Consumer(topic, "o", nsqd=address, ordered=True):
            pass
    await asyncio.sleep(0.3)
    with pytest.raises(ConfigError, match="partitions"):
        async with Consumer(topic, "p", lookupd=vanilla_cluster.lookupd_http, partitions=[0]):
            pass
    async with Consumer(topic, "seek", lookupd=vanilla_cluster.lookupd_http) as consumer:
        with pytest.raises(UnsupportedByServerError):
            await consumer.seek(0, offset=0)


async def test_a_restarted_nsqd_is_found_again_through_lookup(
    vanilla_binaries: ServerBinaries,
) -> None:
    """The node goes away (SIGTERM) and comes back on the same port: the consumer notices the
    loss, keeps asking nsqlookupd (not hammering the node), and consumes again."""
    topic = _topic()
    with VanillaCluster(vanilla_binaries, node_count=1) as own:
        node = own.nodes[0]
        own.create_topic(topic)
        await asyncio.sleep(0.3)
        async with Consumer(
            topic, "restart", lookupd=own.lookupd_http, lookup_interval=0.5
        ) as consumer:
            await publish(node.tcp_address, topic, [b"before"])
            first = await consumer.get(timeout=10)
            assert first is not None
            await first.finish()
            # FIN has no reply: wait until nsqd has counted it, or a stop that races the FIN
            # rightly redelivers "before" after the restart (at-least-once, not a loss).
            async with asyncio.timeout(10):
                while True:
                    stats = await asyncio.to_thread(channel_stats, own, topic, "restart")
                    if stats["in_flight_count"] == 0:
                        break
                    await asyncio.sleep(0.05)
            await asyncio.to_thread(node.process.stop)
            async with asyncio.timeout(10):
                while consumer.connections:  # noqa: ASYNC110 - waiting for the loss
                    await asyncio.sleep(0.05)
            await asyncio.to_thread(own.start_node, node.index)
            await publish(node.tcp_address, topic, [b"after"])
            second = await consumer.get(timeout=30)
            assert second is not None
            assert second.body == b"after"
            await second.finish()
            assert len(consumer.connections) == 1


async def test_close_cuts_off_a_stuck_on_give_up_and_requeues_its_message(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"stuck"])
    entered = asyncio.Event()
    cut_off = asyncio.Event()

    async def never_returns(message: Message) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cut_off.set()
            raise

    consumer = Consumer(
        topic, "stuck", nsqd=address, max_attempts=1, on_give_up=never_returns, backoff=None
    )
    async with consumer:
        first = await consumer.get(timeout=10)
        assert first is not None
        await first.requeue(0)
        await asyncio.wait_for(entered.wait(), 10)  # attempt 2 > max_attempts: given up
        async with asyncio.timeout(30):  # a guard against a hang, not a speed claim
            await consumer.close(drain_timeout=1.0)
        assert cut_off.is_set()  # close cancelled the stuck on_give_up instead of waiting
    after = channel_stats(vanilla_cluster, topic, "stuck")
    assert (after["in_flight_count"], after["depth"]) == (0, 1)  # requeued, not lost


async def test_cancelled_runners_give_back_what_they_took_at_once(
    vanilla_cluster: VanillaCluster,
) -> None:
    """A run_batches worker cancelled while it gathers a batch, and a run worker cancelled in
    its handler, requeue the messages they took at once: closing does not wait the drain
    timeout for messages no handler will ever answer (the bench's batch consumer waited 30 s)."""
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"b%d" % i for i in range(5)])
    consumer = Consumer(topic, "gather", nsqd=address, max_in_flight=100, drain_timeout=600)
    handled: list[int] = []
    # 5 messages, batches of 50 or after 600 s: the worker holds 5 and waits for more
    runner = asyncio.create_task(
        consumer.run_batches(lambda batch: handled.append(len(batch)), max_size=50, max_wait=600)
    )
    await wait_for_count(consumer, "received", 5)
    await asyncio.sleep(0.2)  # the worker has taken them and waits for the rest of its batch
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert handled == []
    assert consumer.stats["requeued"] == 5  # given back now, not at close
    async with asyncio.timeout(60):  # nothing held: the drain does not wait its 600 s
        await consumer.close()

    started = asyncio.Event()

    async def stuck(message: Message) -> None:
        started.set()
        await asyncio.Event().wait()

    consumer = Consumer(topic, "gather", nsqd=address, max_in_flight=1, drain_timeout=600)
    runner = asyncio.create_task(consumer.run(stuck))
    async with asyncio.timeout(60):
        await started.wait()
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert consumer.stats["requeued"] == 1
    async with asyncio.timeout(60):
        await consumer.close()


async def test_with_offsets_needs_the_fork(vanilla_cluster: VanillaCluster) -> None:
    """SUB_ADVANCED (offsets on every message) is the fork's: vanilla nsqd is refused before a
    subscription is tried, with an error that says so."""
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"x"])
    consumer = Consumer(topic, "offsets", nsqd=address, with_offsets=True)
    with pytest.raises(UnsupportedByServerError, match="with_offsets"):
        await consumer.start()
    await consumer.close()


async def _listed(cluster: VanillaCluster, topic: str, channel: str | None = None) -> None:
    """Wait (10 s at most) until nsqlookupd lists ``topic`` (and ``channel``): nsqd registers
    them asynchronously."""
    async with httpx.AsyncClient() as http, asyncio.timeout(10):
        while True:
            answer = await http.get(f"{cluster.lookupd_http}/lookup", params={"topic": topic})
            if answer.status_code == 200 and (
                channel is None or channel in answer.json().get("channels", [])
            ):
                return
            await asyncio.sleep(0.05)


def _channels_on_nsqd(cluster: VanillaCluster, topic: str) -> set[str]:
    """The channels of ``topic`` every nsqd's /stats lists."""
    names: set[str] = set()
    for node in cluster.nodes:
        data = httpx.get(
            f"{node.http_url}/stats", params={"format": "json", "topic": topic}, timeout=5
        ).json()
        for entry in data.get("topics") or []:
            names.update(c["channel_name"] for c in entry.get("channels") or [])
    return names


async def test_start_earliest_on_a_topics_first_channel_and_again_on_the_existing_channel(
    vanilla_cluster: VanillaCluster,
) -> None:
    """vanilla nsqd hands a topic's first channel what the topic buffered: start="earliest"
    is honoured there. Restarted on the channel (now existing), it keeps its position."""
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"old-%d" % i for i in range(20)])
    await _listed(vanilla_cluster, topic)
    lookupd = vanilla_cluster.lookupd_http
    async with Consumer(topic, "first", lookupd=lookupd, start="earliest") as consumer:
        got = await collect(consumer, 20, within=20)
    assert sorted(m.body for m in got) == sorted(b"old-%d" % i for i in range(20))
    await _listed(vanilla_cluster, topic, "first")
    await publish(address, topic, [b"new"])
    async with Consumer(topic, "first", lookupd=lookupd, start="earliest") as consumer:
        again = await collect(consumer, 1, within=20)
    assert [m.body for m in again] == [b"new"]


@pytest.mark.parametrize(
    ("start", "other_channel", "why"),
    [
        pytest.param(1_700_000_000, False, "needs the fork", id="timestamp"),
        pytest.param({0: 0}, False, "needs the fork", id="offsets"),
        pytest.param("earliest", True, "only messages published after", id="earliest-not-first"),
        pytest.param("latest", False, "everything the topic holds", id="latest-first"),
    ],
)
async def test_vanilla_refuses_a_start_it_cannot_honour_before_subscribing(
    vanilla_cluster: VanillaCluster, start: object, other_channel: bool, why: str
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    await publish(address, topic, [b"held"])
    if other_channel:
        async with Consumer(topic, "other", nsqd=address) as other:
            assert len(await collect(other, 1, within=20)) == 1
        await _listed(vanilla_cluster, topic, "other")
    else:
        await _listed(vanilla_cluster, topic)
    lookupd = vanilla_cluster.lookupd_http
    consumer = Consumer(topic, "mine", lookupd=lookupd, start=start)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedByServerError, match=why):
        await consumer.start()
    assert consumer.connections == {}
    await consumer.close()
    assert "mine" not in _channels_on_nsqd(vanilla_cluster, topic)  # never subscribed
