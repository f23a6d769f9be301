"""The driver source's reader, driven the way Spark drives it, without Spark.

Spark commits a micro-batch of a simple stream reader only when it plans the next one, and it
plans one only when ``read`` returns rows. So while batch ``n`` is being processed, its
messages are held in flight, and ``read(n + 1)`` must still be able to receive more. With
several connections nsqd's RDY budget is shared among them: if one partition holds all the
messages, that connection's share must hold a held batch and the next one, or the query stops
for good (seen on the embedded cluster with 2 partitions, all messages on one). On the
embedded cluster and the real fork.

A commit is on nsqd when it returns: Spark ends its Python worker right after the last
commit of an ``availableNow`` run, without ``stop()`` (on vanilla nsqd, the embedded cluster
and the fork).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsq_ha.admin import LookupdAdmin
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.spark.options import parse_read_options
from nsq_ha.spark.source.driver_reader import DriverReader
from nsq_ha.sync import Producer

from .helpers import unfinished_and_clients

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


#: commit, then end the process as Spark ends its Python worker: no close(), no atexit
_COMMIT_AND_DIE = """
import json, os, sys
from nsq_ha.spark.options import parse_read_options
from nsq_ha.spark.source.driver_reader import DriverReader

reader = DriverReader(parse_read_options(json.loads(sys.argv[1])), "spark")
rows = reader.read(1)
reader.commit(1)
print(len(rows), flush=True)
os._exit(0)
"""


@pytest.fixture(scope="module", params=["vanilla", "devcluster", "fork"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, str]]]:
    """nsqlookupd's address and where to publish (a vanilla topic is made by its first
    publish, and keeps its messages for its first channel)."""
    if request.param == "vanilla":
        vanilla = request.getfixturevalue("vanilla_cluster")
        yield vanilla.lookupd_http, {"nsqd": vanilla.nodes[0].tcp_address}
    elif request.param == "devcluster":
        with DevClusterThread(nodes=2) as dev:
            yield dev.lookupd_http, {"lookupd": dev.lookupd_http}
    else:
        fork = request.getfixturevalue("fork_cluster").lookupd_http
        yield fork, {"lookupd": fork}


def test_a_commit_is_on_nsqd_when_it_returns(
    backend: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    lookupd, publish = backend
    topic = f"sp_driver_commit_{secrets.token_hex(3)}"
    total = 60
    if "lookupd" in publish:

        async def create() -> None:
            async with LookupdAdmin(lookupd) as admin:
                await admin.create_topic(topic, partitions=2, replicas=1)
                await admin.create_channel(topic, "spark", rewind=True)

        asyncio.run(create())
    with Producer(**publish) as producer:  # type: ignore[arg-type]
        producer.publish_many(topic, [b"c%03d" % i for i in range(total)])
    options = {
        "lookupd": lookupd,
        "topic": topic,
        "mode": "driver",
        "channel": "spark",
        "walPath": str(tmp_path / "wal"),
        "maxMessagesPerTrigger": str(total),
        "pollTimeout": "10",
    }
    deadline = time.monotonic() + 30
    while True:  # vanilla nsqd registers a new topic with nsqlookupd shortly
        try:
            asyncio.run(unfinished_and_clients(lookupd, topic, "spark"))
            break
        except Exception:
            assert time.monotonic() < deadline, f"nsqlookupd never listed {topic}"
            time.sleep(0.2)
    done = subprocess.run(
        [sys.executable, "-c", _COMMIT_AND_DIE, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    committed = int(done.stdout)
    assert committed > 0
    deadline = time.monotonic() + 30
    while (left := asyncio.run(unfinished_and_clients(lookupd, topic, "spark")))[1]:
        assert time.monotonic() < deadline, f"nsqd still lists the dead reader: {left}"
        time.sleep(0.2)
    # what was read and committed is finished; only what the reader never handed out is back
    assert left == (total - committed, 0), f"{committed} committed of {total}"
