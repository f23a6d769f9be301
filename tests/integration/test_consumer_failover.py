"""Ordered consumption keeps per-key order and loses nothing while a leader moves or dies.

An ordered consumer (SUB_ORDERED, found through lookup's ``meta.ordered``) reads a replica-3,
4-partition ordered topic while 50 keys publish ``key:seq`` bodies through the keyed producer
and the test moves partition leaders, or kills a leader with SIGKILL. The consumer finishes
every message; the tally (printed, run with -s) counts deliveries, duplicates (redeliveries after
the fault) and order violations (a key's *new* message arriving after a later one).

These tests stop and move things, so they get a cluster of their own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from nsq_ha.consumer import Consumer, Message
from nsq_ha.producer import Producer
from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.servers import ForkCluster

from .helpers import publish_keyed

pytestmark = pytest.mark.fork

KEYS = [f"k{i:02d}" for i in range(50)]
PER_KEY = 200  # 50 keys x 200 = 10k messages per run
PARTITIONS = 4
TOPICS = {"cfo_move": "leader move", "cfo_kill": "kill -9"}
CHANNEL = "tally"


@pytest.fixture(scope="module")
def cluster(fork_binaries: ServerBinaries) -> Iterator[ForkCluster]:
    with ForkCluster(fork_binaries) as own:
        for topic in TOPICS:
            own.create_topic(topic, PARTITIONS, replicas=3, ordered=True, wait=False)
        for topic in TOPICS:
            own.wait_writable(topic)
        yield own


@dataclass
class Tally:
    run: str
    published: int = 0
    acknowledged: int = 0
    consumed: int = 0
    deliveries: int = 0
    duplicates: int = 0
    order_violations: int = 0
    lost: int = 0
    leader_changes: int = 0
    abandoned: int = 0
    fault_done_while_consuming: bool = False
    seconds: float = 0.0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    def line(self) -> str:
        return f"TALLY {json.dumps(dict(self.__dict__, errors=dict(self.errors)))}"


class Checker:
    """Per-key bookkeeping of what the consumer saw, in delivery order."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.seen: set[tuple[str, int]] = set()
        self.highest: dict[str, int] = {}
        self.arrived = asyncio.Event()

    async def handle(self, message: Message) -> None:
        key, seq_text = message.body.decode().split(":")
        seq = int(seq_text)
        self.tally.deliveries += 1
        if (key, seq) in self.seen:
            self.tally.duplicates += 1  # a replay after the fault: allowed (at least once)
        else:
            if seq < self.highest.get(key, -1):
                self.tally.order_violations += 1
            self.seen.add((key, seq))
            self.highest[key] = max(seq, self.highest.get(key, -1))
        self.arrived.set()


async def run(cluster: ForkCluster, topic: str, fault: Callable[[], None]) -> Tally:
    await asyncio.to_thread(cluster.wait_writable, topic)
    tally = Tally(TOPICS[topic])
    checker = Checker(tally)
    acked: set[tuple[str, int]] = set()
    started = time.monotonic()
    consumer = Consumer(
        topic, CHANNEL, lookupd=cluster.lookupd_http, lookup_interval=2.0, msg_timeout=10.0
    )
    await consumer.start()
    assert consumer.is_ordered
    consuming = asyncio.create_task(consumer.run(checker.handle))
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        publishing = asyncio.create_task(
            publish_keyed(producer, topic, KEYS, PER_KEY, tally, acked)
        )
        await asyncio.sleep(1.0)
        await asyncio.to_thread(fault)
        tally.fault_done_while_consuming = not consuming.done()
        await publishing
    deadline = time.monotonic() + 180
    while not acked <= checker.seen and time.monotonic() < deadline:
        checker.arrived.clear()
        try:
            await asyncio.wait_for(checker.arrived.wait(), 5)
        except TimeoutError:
            continue
    stats = consumer.stats
    await consumer.close()
    await consuming
    tally.consumed = len(checker.seen)
    tally.lost = len(acked - checker.seen)
    tally.leader_changes = sum(p.get("leader_changes", 0) for p in stats["partitions"].values())
    tally.abandoned = stats["abandoned"]  # held when their connection went away
    tally.seconds = round(time.monotonic() - started, 1)
    print(tally.line())
    return tally


def assert_sound(tally: Tally) -> None:
    assert tally.fault_done_while_consuming
    assert tally.lost == 0
    assert tally.order_violations == 0
    assert tally.consumed >= tally.acknowledged


async def test_ordered_consumption_through_leader_moves(cluster: ForkCluster) -> None:
    await asyncio.to_thread(cluster.wait_stable)

    def move() -> None:
        for partition in (0, 1):
            cluster.move_leader("cfo_move", partition)

    tally = await run(cluster, "cfo_move", move)
    assert_sound(tally)
    assert tally.leader_changes >= 2


async def test_ordered_consumption_through_a_killed_leader(cluster: ForkCluster) -> None:
    victim = cluster.leader_of("cfo_kill", 0)
    tally = await run(cluster, "cfo_kill", lambda: cluster.stop_node(victim.index, kill=True))
    try:
        assert_sound(tally)
        assert tally.leader_changes >= 1
    finally:
        await asyncio.to_thread(cluster.start_node, victim.index)
