"""The driver source (``mode=driver``) under Spark, on vanilla nsqd, the embedded cluster and
the real fork (same test, every backend):

* ``Trigger.AvailableNow`` reads what the channel held when the query started, in several
  micro-batches, and the query stops by itself with every message finished (the last batch
  too); a second run from the same checkpoint reads exactly what was published since;
* stopping a query closes the source's consumer: the channel has no client left while the
  Spark session goes on.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from nsq_ha.admin import LookupdAdmin  # noqa: E402
from nsq_ha.devcluster import DevClusterThread  # noqa: E402
from nsq_ha.errors import TopicNotFoundError  # noqa: E402
from nsq_ha.lookup import LookupClient  # noqa: E402
from nsq_ha.spark.compat import DRIVER_STREAM_CONTROL, pyspark_version, supports  # noqa: E402
from nsq_ha.sync import Producer  # noqa: E402

from .helpers import unfinished_and_clients  # noqa: E402
from .spark_session import local_spark  # noqa: E402

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        not supports(DRIVER_STREAM_CONTROL),
        reason=f"PySpark {pyspark_version()}: stop() and AvailableNow in mode=driver need 4.2+",
    ),
]

CHANNEL = "spark"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark("nsq_ha-driver-stream", "local[2]") as session:
        yield session


@dataclass
class Where:
    lookupd: str
    #: the producer's address: lookupd on the fork, an nsqd on vanilla (which makes topics)
    publish: dict[str, str]
    fork: bool


@pytest.fixture(scope="module", params=["vanilla", "devcluster", "fork"])
def where(request: pytest.FixtureRequest) -> Iterator[Where]:
    if request.param == "vanilla":
        vanilla = request.getfixturevalue("vanilla_cluster")
        nsqd = {"nsqd": vanilla.nodes[0].tcp_address}
        yield Where(vanilla.lookupd_http, nsqd, fork=False)
    elif request.param == "devcluster":
        with DevClusterThread(nodes=2) as dev:
            yield Where(dev.lookupd_http, {"lookupd": dev.lookupd_http}, fork=True)
    else:
        fork = request.getfixturevalue("fork_cluster").lookupd_http
        yield Where(fork, {"lookupd": fork}, fork=True)


def _topic(where: Where, prefix: str, first: list[bytes]) -> str:
    """A new topic holding ``first``, whose channel ``spark`` sees all of it and everything
    published later."""
    topic = f"{prefix}_{secrets.token_hex(3)}"
    if where.fork:

        async def create() -> None:
            async with LookupdAdmin(where.lookupd) as admin:
                await admin.create_topic(topic, partitions=2, replicas=1)
                await admin.create_channel(topic, CHANNEL, rewind=True)

        asyncio.run(create())
    # on vanilla the first publish makes the topic, which keeps its messages for its first
    # channel: the query's
    _publish(where, topic, first)

    async def known() -> None:  # vanilla nsqd registers a new topic with lookupd shortly
        async with LookupClient([where.lookupd]) as lookup:
            deadline = time.monotonic() + 30
            while True:
                try:
                    await lookup.lookup(topic, "r", force=True)
                    return
                except TopicNotFoundError:
                    assert time.monotonic() < deadline, f"lookupd never listed {topic}"
                    await asyncio.sleep(0.2)

    asyncio.run(known())
    return topic


def _publish(where: Where, topic: str, bodies: list[bytes]) -> None:
    with Producer(**where.publish) as producer:  # type: ignore[arg-type]
        for start in range(0, len(bodies), 100):
            producer.publish_many(topic, bodies[start : start + 100])


def _options(lookupd: str, topic: str, tmp_path: Path) -> dict[str, str]:
    return {
        "lookupd": lookupd,
        "topic": topic,
        "mode": "driver",
        "channel": CHANNEL,
        "walPath": str(tmp_path / "checkpoint" / "nsq-wal"),
        "maxMessagesPerTrigger": "100",
        "pollTimeout": "3",
    }


def _available_now(
    spark: SparkSession, options: dict[str, str], tmp_path: Path, run: str
) -> tuple[list[bytes], int]:
    """Run the source with ``trigger(availableNow=True)`` until the query stops by itself;
    the bodies it handed to its batches (collected per batch into files), and how many
    batches had rows."""
    out = tmp_path / f"out-{run}"
    out.mkdir()

    def collect(batch: DataFrame, batch_id: int) -> None:
        bodies = [bytes(r["body"]).hex() for r in batch.select("body").collect()]
        (out / f"{batch_id}.json").write_text(json.dumps(bodies))

    reader = spark.readStream.format("nsq")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        stopped = query.awaitTermination(180)
    finally:
        query.stop()
    assert stopped, "the availableNow query did not stop by itself"
    assert query.exception() is None, query.exception()
    batches = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    rows = [bytes.fromhex(body) for batch in batches for body in batch]
    return rows, sum(1 for batch in batches if batch)


def test_available_now_reads_the_backlog_in_batches_finishes_it_and_stops(
    spark: SparkSession, where: Where, tmp_path: Path
) -> None:
    address = where.lookupd
    first = [b"a%04d" % i for i in range(350)]
    topic = _topic(where, "sd_now", first)
    options = _options(address, topic, tmp_path)
    rows, batches = _available_now(spark, options, tmp_path, "a")
    assert sorted(rows) == first
    assert batches >= 4  # 350 messages, 100 a batch
    # every message finished, the last batch's too, and the consumer gone
    assert asyncio.run(unfinished_and_clients(address, topic, CHANNEL)) == (0, 0)
    later = [b"b%04d" % i for i in range(120)]
    _publish(where, topic, later)
    again, _ = _available_now(spark, options, tmp_path, "b")
    assert sorted(again) == later
    assert asyncio.run(unfinished_and_clients(address, topic, CHANNEL)) == (0, 0)


def test_stopping_the_query_closes_the_sources_consumer(
    spark: SparkSession, where: Where, tmp_path: Path
) -> None:
    address = where.lookupd
    topic = _topic(where, "sd_stop", [b"s%04d" % i for i in range(50)])
    reader = spark.readStream.format("nsq")
    for key, value in _options(address, topic, tmp_path).items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p["numInputRows"] for p in query.recentProgress):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the query read nothing"
            time.sleep(0.2)
        # the consumer is there
        assert asyncio.run(unfinished_and_clients(address, topic, CHANNEL))[1] >= 1
    finally:
        query.stop()
    deadline = time.monotonic() + 15
    clients = -1
    while time.monotonic() < deadline:
        clients = asyncio.run(unfinished_and_clients(address, topic, CHANNEL))[1]
        if clients == 0:
            break
        time.sleep(0.5)
    assert clients == 0, f"{clients} client(s) still on the channel after the query stopped"
