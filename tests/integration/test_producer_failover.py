"""No acknowledged message lost, no per-key order broken, while leaders move and nodes stop.

50 keys publish ``key:seq`` bodies concurrently (each key awaits its previous publish, so its
call order is seq order) to a replica-3, 4-partition topic while the test moves partition leaders
(lookupd's admin API), or stops a node gracefully, or kills one (SIGKILL). Afterwards every
partition is read back from its current leader from offset 0 (SUB_ADVANCED + /channel/setoffset)
and sorted by queue offset, which is the order nsqd stored. The tally is printed (run with -s).

These tests stop and move things, so they get a cluster of their own instead of the session's.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from nsq_ha.producer import Producer
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.servers import ForkCluster

from .helpers import Subscriber, drain, publish_keyed

pytestmark = pytest.mark.fork

KEYS = [f"k{i:02d}" for i in range(50)]
PER_KEY = 400  # 50 keys x 400 = 20k messages per run
PARTITIONS = 4
TOPICS = {"fo_move": "leader move", "fo_stop": "graceful node stop", "fo_kill": "kill -9"}


@pytest.fixture(scope="module")
def cluster(fork_binaries: ServerBinaries) -> Iterator[ForkCluster]:
    with ForkCluster(fork_binaries) as own:
        for topic in TOPICS:
            own.create_topic(topic, PARTITIONS, replicas=3, wait=False)
        for topic in TOPICS:
            own.wait_writable(topic)
        yield own


@dataclass
class Tally:
    run: str
    published: int = 0
    acknowledged: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    consumed: int = 0
    deliveries: int = 0
    duplicates: int = 0
    order_violations: int = 0
    lost: int = 0
    retries: int = 0
    fault_done_while_publishing: bool = False
    seconds: float = 0.0

    def line(self) -> str:
        data = dict(self.__dict__, errors=dict(self.errors))
        return f"TALLY {json.dumps(data)}"


async def read_partition(cluster: ForkCluster, topic: str, partition: int) -> list[DecodedMessage]:
    """Everything stored in one partition, from offset 0, in queue order (deduplicated)."""
    leader = cluster.leader_of(topic, partition)
    channel = f"tally{int(time.time() * 1000)}"
    conn = Subscriber(leader.tcp_address)
    await conn.connect()
    await conn.subscribe(topic, channel, partition, advanced=True)
    async with httpx.AsyncClient() as http:
        resp = await http.post(
            f"{leader.http_url}/channel/setoffset",
            params={"topic": topic, "partition": str(partition), "channel": channel},
            content=b"virtual_queue:0",
        )
        resp.raise_for_status()
    messages = await drain(conn, idle=3.0, within=300)
    await conn.close()
    by_offset = {m.offset: m for m in messages}  # a redelivery repeats its offset
    return [by_offset[o] for o in sorted(by_offset, key=lambda o: o or 0)]


def check(tally: Tally, logs: dict[int, list[DecodedMessage]], acked: set[tuple[str, int]]) -> None:
    seen: set[tuple[str, int]] = set()
    last: dict[str, int] = {}
    for messages in logs.values():
        for message in messages:
            key, seq_text = message.body.decode().split(":")
            seq = int(seq_text)
            tally.deliveries += 1
            if (key, seq) in seen:
                tally.duplicates += 1
            seen.add((key, seq))
            if key in last and seq < last[key]:
                tally.order_violations += 1
            last[key] = max(seq, last.get(key, -1))
    tally.consumed = len(seen)
    tally.lost = len(acked - seen)


async def run(
    cluster: ForkCluster, topic: str, fault: Callable[[], None], fault_after: float = 1.0
) -> Tally:
    # an earlier run may have restarted a node: start with every partition writable
    await asyncio.to_thread(cluster.wait_writable, topic)
    tally = Tally(TOPICS[topic])
    acked: set[tuple[str, int]] = set()
    started = time.monotonic()
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        publishing = asyncio.create_task(
            publish_keyed(producer, topic, KEYS, PER_KEY, tally, acked)
        )
        await asyncio.sleep(fault_after)
        await asyncio.to_thread(fault)
        tally.fault_done_while_publishing = not publishing.done()
        await publishing
        tally.retries = producer.stats["retries"]
    tally.seconds = round(time.monotonic() - started, 1)
    logs = {p: await read_partition(cluster, topic, p) for p in range(PARTITIONS)}
    check(tally, logs, acked)
    print(tally.line())
    return tally


def assert_sound(tally: Tally) -> None:
    assert tally.fault_done_while_publishing, "the fault came after publishing ended"
    assert tally.retries > 0, "no publish had to be retried: the fault was not exercised"
    assert tally.lost == 0
    assert tally.order_violations == 0
    assert tally.acknowledged == tally.published - sum(tally.errors.values())


async def test_leader_moves_lose_nothing_and_keep_key_order(cluster: ForkCluster) -> None:
    await asyncio.to_thread(cluster.wait_stable)

    def move() -> None:
        for partition in (0, 1):
            cluster.move_leader("fo_move", partition)

    tally = await run(cluster, "fo_move", move)
    assert_sound(tally)
    assert tally.acknowledged == tally.published


async def test_a_graceful_node_stop_loses_nothing_and_keeps_key_order(
    cluster: ForkCluster,
) -> None:
    await asyncio.to_thread(cluster.wait_writable, "fo_stop")
    victim = cluster.leader_of("fo_stop", 0)
    tally = await run(cluster, "fo_stop", lambda: cluster.stop_node(victim.index))
    try:
        assert_sound(tally)
        assert tally.acknowledged == tally.published
    finally:
        await asyncio.to_thread(cluster.start_node, victim.index)


async def test_a_killed_leader_loses_nothing_and_keeps_key_order(cluster: ForkCluster) -> None:
    await asyncio.to_thread(cluster.wait_writable, "fo_kill")
    victim = cluster.leader_of("fo_kill", 0)
    tally = await run(cluster, "fo_kill", lambda: cluster.stop_node(victim.index, kill=True))
    try:
        assert_sound(tally)
    finally:
        await asyncio.to_thread(cluster.start_node, victim.index)
