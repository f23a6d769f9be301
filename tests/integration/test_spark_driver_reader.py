"""The driver source's reader, driven the way Spark drives it, without Spark.

Spark commits a micro-batch of a simple stream reader only when it plans the next one, and it
plans one only when ``read`` returns rows. So while batch ``n`` is being processed, its
messages are held in flight, and ``read(n + 1)`` must still be able to receive more. With
several connections nsqd's RDY budget is shared among them: if one partition holds all the
messages, that connection's share must hold a held batch and the next one, or the query stops
for good (seen on the embedded cluster with 2 partitions, all messages on one). On the
embedded cluster and the real fork.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsq_ha.admin import LookupdAdmin
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.spark.options import parse_read_options
from nsq_ha.spark.source import DriverReader
from nsq_ha.sync import Producer

TOPIC = "sp_driver_rdy"
TOTAL = 1000
BATCH = 200


@pytest.fixture(scope="module", params=["devcluster", "fork"])
def lookupd(request: pytest.FixtureRequest) -> Iterator[str]:
    """A 2-partition topic whose messages are all on partition 0, and the channel ``spark``."""

    def fill(address: str) -> None:
        async def create() -> None:
            async with LookupdAdmin(address) as admin:
                await admin.create_topic(TOPIC, partitions=2, replicas=1)
                await admin.create_channel(TOPIC, "spark", rewind=True)

        asyncio.run(create())
        with Producer(lookupd=address) as producer:
            producer.publish_many(TOPIC, [b"m%05d" % i for i in range(TOTAL)], partition=0)

    if request.param == "devcluster":
        with DevClusterThread(nodes=2) as dev:
            fill(dev.lookupd_http)
            yield dev.lookupd_http
    else:
        fork = request.getfixturevalue("fork_cluster")
        fill(fork.lookupd_http)
        yield fork.lookupd_http


def test_the_next_batch_arrives_while_the_last_one_is_held(lookupd: str, tmp_path: Path) -> None:
    opts = parse_read_options(
        {
            "lookupd": lookupd,
            "topic": TOPIC,
            "mode": "driver",
            "channel": "spark",
            "walPath": str(tmp_path / "wal"),
            "maxMessagesPerTrigger": str(BATCH),
            "pollTimeout": "2",
        }
    )
    reader = DriverReader(opts, "spark")
    bodies: list[bytes] = []
    seq, empty = 0, 0
    try:
        while len(bodies) < TOTAL and empty < 3:
            rows = reader.read(seq)
            if not rows:  # Spark plans no batch, so it commits nothing either
                empty += 1
                continue
            bodies += [bytes(row[10]) for row in rows]
            if seq:
                reader.commit(seq - 1)  # what Spark does when it plans batch ``seq``
            seq += 1
    finally:
        reader.close()
    assert sorted(set(bodies)) == [b"m%05d" % i for i in range(TOTAL)], (
        f"{len(set(bodies))} of {TOTAL} read in {seq} batches, then nothing came"
    )
