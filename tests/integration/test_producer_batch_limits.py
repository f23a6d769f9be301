"""Group commit under nsqd's size limits: a batch nsqd refuses for one message, or for its
body size, is split and sent again, so every publish call gets the answer for its own
messages, each message is stored once, keyed calls keep their order, and later batches stay
under the limit the refusal named.

Vanilla nsqd runs with ``--max-msg-size=1000`` or ``--max-body-size=100000`` (one small
cluster per limit, for this module); the embedded broker runs with the same limits. A lying
nsqd refuses a batch for one message without naming any limit.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from nsq_ha.admin import NsqdAdmin
from nsq_ha.devcluster import DevCluster
from nsq_ha.errors import BadMessageError, PublishError
from nsq_ha.producer import Producer, PublishResult, RetryPolicy
from nsq_ha.protocol.command_decoder import ClientCommand
from nsq_ha.protocol.frames import FrameType, encode_frame
from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.servers import VanillaCluster

from .helpers import Subscriber, drain_all
from .lying_nsqd import LyingNsqd, Peer

MAX_MSG = 1000
MAX_BODY = 100_000
#: a failure here is a bug, not an outage: give up quickly rather than retry for a minute
RETRY = RetryPolicy(deadline=15.0, max_backoff=0.2, jitter=0.0)
BACKENDS = ["devcluster", pytest.param("vanilla", marks=pytest.mark.vanilla)]


@dataclass
class Target:
    """Where a test publishes (``Producer`` keywords) and how it reads what was stored."""

    where: dict[str, Any]
    #: the bodies stored on ``topic``, partition by partition in offset order
    stored: Callable[[str, int], Awaitable[list[bytes]]]
    #: make ``topic`` ready to take publishes
    create: Callable[[str], None]


def _topic() -> str:
    return f"lim_{uuid.uuid4().hex[:10]}"


def _vanilla(cluster: VanillaCluster) -> Target:
    node = cluster.nodes[0]

    async def stored(topic: str, expect: int) -> list[bytes]:
        # nsqd's own count of messages put on the topic (duplicates included), and the bodies
        async with NsqdAdmin(node.http_url) as admin:
            (entry,) = await admin.topic_stats(topic)
        conn = Subscriber(node.tcp_address)
        await conn.connect()
        try:
            await conn.subscribe(topic, "check")
            read = await drain_all({0: conn}, expect=expect, idle=5.0, within=60.0)
        finally:
            await conn.close()
        bodies = [m.body for m in read[0]]
        assert entry["message_count"] == len(bodies)
        return bodies

    return Target({"nsqd": node.tcp_address}, stored, lambda topic: None)


def _embedded(cluster: DevCluster) -> Target:
    async def stored(topic: str, expect: int) -> list[bytes]:
        return [m.body for p in range(2) for m in cluster.partition(topic, p).store.log]

    def create(topic: str) -> None:
        cluster.create_topic(topic, partitions=2, replicas=1)

    return Target({"lookupd": cluster.lookupd_http}, stored, create)


@pytest.fixture(scope="module")
def vanilla_small_messages(vanilla_binaries: ServerBinaries) -> Iterator[VanillaCluster]:
    """One vanilla nsqd that refuses messages over 1000 bytes."""
    args = [f"--max-msg-size={MAX_MSG}"]
    with VanillaCluster(vanilla_binaries, nsqd_args=args, node_count=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def vanilla_small_bodies(vanilla_binaries: ServerBinaries) -> Iterator[VanillaCluster]:
    """One vanilla nsqd that refuses MPUB bodies over 100000 bytes."""
    args = [f"--max-body-size={MAX_BODY}"]
    with VanillaCluster(vanilla_binaries, nsqd_args=args, node_count=1) as cluster:
        yield cluster


@pytest.fixture(params=BACKENDS)
async def small_messages(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """A server whose ``max_msg_size`` is 1000 bytes."""
    if request.param == "vanilla":
        yield _vanilla(request.getfixturevalue("vanilla_small_messages"))
        return
    async with DevCluster(nodes=2, max_msg_size=MAX_MSG) as cluster:
        yield _embedded(cluster)


@pytest.fixture(params=BACKENDS)
async def small_bodies(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """A server whose ``max_body_size`` is 100000 bytes."""
    if request.param == "vanilla":
        yield _vanilla(request.getfixturevalue("vanilla_small_bodies"))
        return
    async with DevCluster(nodes=2, max_body_size=MAX_BODY) as cluster:
        yield _embedded(cluster)


def _published(outcomes: list[Any]) -> int:
    """How many of ``outcomes`` are results (the others are errors)."""
    return sum(isinstance(o, PublishResult) for o in outcomes)


def _good(count: int) -> list[bytes]:
    return [b"ok-%04d" % i for i in range(count)]


async def test_a_too_big_message_fails_alone_and_its_batch_neighbours_are_stored(
    small_messages: Target,
) -> None:
    topic = _topic()
    small_messages.create(topic)
    good = _good(50)
    bad = b"B" * (2 * MAX_MSG)
    bodies = [*good[:25], bad, *good[25:]]
    async with Producer(**small_messages.where, retry=RETRY) as producer:
        await producer.publish(topic, b"warm-up")  # routes cached: the calls below queue at once
        outcomes = await asyncio.gather(
            *(producer.publish(topic, body) for body in bodies), return_exceptions=True
        )
    refused = outcomes.pop(25)
    assert isinstance(refused, BadMessageError), refused
    assert "too big" in str(refused)
    assert _published(outcomes) == 50
    stored = await small_messages.stored(topic, 51)
    assert sorted(stored) == sorted([b"warm-up", *good])


async def test_keyed_publishes_keep_their_order_around_a_refused_message(
    small_messages: Target,
) -> None:
    topic = _topic()
    small_messages.create(topic)
    good = _good(50)
    bad = b"B" * (2 * MAX_MSG)
    bodies = [*good[:25], bad, *good[25:]]
    async with Producer(**small_messages.where, retry=RETRY) as producer:
        await producer.publish(topic, b"warm-up", sharding_key="k")
        outcomes = await asyncio.gather(
            *(producer.publish(topic, body, sharding_key="k") for body in bodies),
            return_exceptions=True,
        )
    assert isinstance(outcomes.pop(25), BadMessageError)
    assert _published(outcomes) == 50
    assert len({(o.partition, o.address) for o in outcomes}) == 1  # type: ignore[union-attr]
    stored = await small_messages.stored(topic, 51)
    assert stored == [b"warm-up", *good]


async def test_publish_many_with_a_too_big_message_stores_the_others_in_order(
    small_messages: Target,
) -> None:
    topic = _topic()
    small_messages.create(topic)
    good = _good(30)
    bodies = [*good[:10], b"B" * (2 * MAX_MSG), *good[10:]]
    async with Producer(**small_messages.where, retry=RETRY) as producer:
        with pytest.raises(PublishError) as caught:
            await producer.publish_many(topic, bodies, sharding_key="k")
    results = caught.value.results
    assert results is not None
    assert isinstance(results.pop(10), BadMessageError)
    assert _published(results) == 30
    assert await small_messages.stored(topic, 30) == good


async def test_a_batch_over_the_body_limit_is_split_and_later_batches_stay_under_it(
    small_bodies: Target,
) -> None:
    topic = _topic()
    small_bodies.create(topic)
    first = [b"%04d" % i + b"x" * 4996 for i in range(40)]
    second = [b"%04d" % i + b"y" * 4996 for i in range(40)]
    async with Producer(**small_bodies.where, retry=RETRY) as producer:
        await producer.publish(topic, b"warm-up")
        results = await asyncio.gather(*(producer.publish(topic, body) for body in first))
        assert _published(results) == 40
        split = producer.stats["batches_split"]
        connections = producer.stats["connections"]
        assert split >= 1  # the first wave was refused (each refusal closes the connection)
        results = await asyncio.gather(*(producer.publish(topic, body) for body in second))
        assert _published(results) == 40
        # the second wave's batches stayed under the limit nsqd named: nothing was refused
        assert (producer.stats["batches_split"], producer.stats["connections"]) == (
            split,
            connections,
        )
    stored = await small_bodies.stored(topic, 81)
    assert sorted(stored) == sorted([b"warm-up", *first, *second])


async def test_publish_many_over_the_body_limit_is_split_in_order(small_bodies: Target) -> None:
    topic = _topic()
    small_bodies.create(topic)
    bodies = [b"%04d" % i + b"z" * 4996 for i in range(70)]  # 350 KB: at least four MPUBs
    async with Producer(**small_bodies.where, retry=RETRY) as producer:
        results = await producer.publish_many(topic, bodies, sharding_key="k")
        assert _published(results) == 70
    assert await small_bodies.stored(topic, 70) == bodies


async def test_a_batch_refused_for_one_message_without_a_named_limit_is_halved_to_it() -> None:
    """A refusal that names no limit (here a lying nsqd's, for one poisoned body) still
    reaches only its message: the batch is halved until that message is alone."""
    stored: list[bytes] = []
    poison = b"poison"

    async def script(peer: Peer) -> None:
        await peer.handshake()
        while True:
            command = await peer.next_event()
            assert isinstance(command, ClientCommand)
            assert command.body is not None
            bodies = _published_bodies(command.name, command.body)
            if poison in bodies:  # refused as a whole, as nsqd refuses an MPUB, and closed
                await peer.send(encode_frame(FrameType.ERROR, b"E_BAD_MESSAGE bad message"))
                return
            stored.extend(bodies)
            await peer.ok()

    good = _good(15)
    bodies = [*good[:5], poison, *good[5:]]
    async with LyingNsqd(script) as nsqd, Producer(nsqd=nsqd.address, retry=RETRY) as producer:
        await producer.publish(topic := _topic(), b"warm-up", sharding_key="k")
        outcomes = await asyncio.gather(
            *(producer.publish(topic, body, sharding_key="k") for body in bodies),
            return_exceptions=True,
        )
        refusals = nsqd.connections - 1
    assert isinstance(outcomes.pop(5), BadMessageError)
    assert _published(outcomes) == 15
    assert stored == [b"warm-up", *good]
    assert refusals <= 5  # batches of 16, 8, 4 and 2, then the message alone


def _published_bodies(name: bytes, body: bytes) -> list[bytes]:
    """The message bodies of a PUB or MPUB command's body."""
    if name == b"PUB":
        return [body]
    count, position, bodies = int.from_bytes(body[:4], "big"), 4, []
    for _ in range(count):
        size = int.from_bytes(body[position : position + 4], "big")
        bodies.append(body[position + 4 : position + 4 + size])
        position += 4 + size
    return bodies
