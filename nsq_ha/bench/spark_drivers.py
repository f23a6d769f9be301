"""The Spark workloads of the bench, as issue 23 measures them: Spark ``local[2]`` against the
embedded 3-node cluster (started in the driver process), a 4-partition plain topic, 100-byte
bodies.

* ``spark-read``: ``n`` messages published, then ``readStream.format("nsq")`` from the offsets
  before them with ``trigger(availableNow=True)`` into the ``noop`` sink, timed from the
  query's start to its end. The same query runs once untimed before (JVM warm-up, Python
  workers started): the figure is a warm session's.
* ``spark-read-ordered``: the same read of an ordered 4-partition topic (each read task then
  consumes its partition with ``SUB_ORDERED``, one message at a time, as the fork requires).
* ``dev-ordered``: its reference, the client's own ordered consume (``async for``, FIN each)
  of ``n`` messages on one partition of such a topic on the same kind of cluster; the
  target compares the Spark read with this rate times the partitions.
* ``spark-write``: ``df.write.format("nsq")`` of ``n`` keyed rows (500 keys), timed around
  ``save()``, after an untimed write of 2000 rows.
* ``dev-consume`` and ``dev-write``: the client itself on the same kind of cluster, without
  Spark: an ``async for`` consume (FIN each) of ``n`` messages published to the 4 partitions,
  and a keyed ``publish_many`` of ``n`` messages (500 keys, calls of 500, 4 in flight). The
  cluster runs in a child process (``nsq-ha devcluster``), as Spark's readers and writers are
  other processes than the cluster's. The issue's ratios compare Spark with the client on
  vanilla nsqd (Go); these compare them on the server Spark's workloads use, whose Python
  shares the 2 cores.

On the real fork (the spec names ``lookupd`` and ``topic``: the stage's 4-partition topic,
plain or ordered, see :mod:`nsq_ha.bench.stage`) the same entry points measure Spark and the
client on the same Go servers. Every run publishes its rows first, spread evenly over the 4
partitions (``n / 4`` each, by partition), and reads them from the offsets before them:

* ``spark-read`` (``spark_mode`` ``stream``): a warm-up read of 2000 rows, then the timed
  ``availableNow`` read of the ``n`` rows into ``noop``, from the query's start to its end;
  ``spark_mode`` ``batch``: the same rows through ``spark.read`` between ``startingOffsets`` (the
  offsets before them) and ``endingOffsets=latest``, counted; ``spark_mode`` ``fixed``: PySpark's
  fixed cost of one stream query, a read of 4 rows after a warm-up one (``count`` 1: the
  rate is queries per second);
* ``spark-read-ordered``: the stream read of an ordered topic;
* ``dev-consume``: ``async for`` over the 4 partitions (FIN each, RDY 2500) on a channel made
  at their ends before the publish (deleted afterwards), timed from the consumer's start;
* ``dev-ordered``: 4 ordered consumers at once, one per partition, each reading its ``n / 4``;
* ``spark-write`` / ``dev-write``: as on the embedded cluster, to the fork's topic.

Both give ``count`` and ``seconds`` (rows per second); no CPU figure: the work is in the JVM and
in Spark's Python workers, not in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from nsq_ha.admin import LookupdAdmin, NsqdAdmin
from nsq_ha.bench.measure import body
from nsq_ha.producer import Producer

__all__ = ["keyed_publish", "ordered_consume", "plain_consume", "spark_read", "spark_write"]

#: partitions of the topic, as in the issue
PARTITIONS = 4
#: distinct keys of the keyed write
KEYS = 500


def _topic() -> str:
    return f"bench_spark_{os.getpid()}_{int(time.time() * 1000) % 10**6}"


async def _create(lookupd: str, topic: str, *, ordered: bool = False) -> None:
    async with LookupdAdmin(lookupd) as admin:
        await admin.create_topic(
            topic, partitions=PARTITIONS, replicas=1, ordered=ordered, multi_part=not ordered
        )
        await admin.create_channel(topic, "bench", rewind=True)  # lookups need a channel


async def _publish(
    lookupd: str, topic: str, count: int, size: int, partition: int | None = None
) -> None:
    async with Producer(lookupd=lookupd) as producer:
        bodies = [body(size)] * 500
        left = count
        while left > 0:
            await producer.publish_many(topic, bodies[: min(500, left)], partition=partition)
            left -= min(500, left)


def _session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from nsq_ha.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("nsq_ha-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(PARTITIONS))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _read_once(spark: Any, lookupd: str, topic: str, start: dict[int, int]) -> tuple[int, float]:
    starting = json.dumps({str(p): o for p, o in start.items()})
    options = {"lookupd": lookupd, "topic": topic, "startingOffsets": starting}
    return _stream(spark, "nsq", options)


def _stream(spark: Any, source: str, options: dict[str, str]) -> tuple[int, float]:
    """A stream read of ``source`` with ``availableNow`` into ``noop``: its rows, its seconds
    from the query's start to its end."""
    with tempfile.TemporaryDirectory() as checkpoint:
        began = time.perf_counter()
        query = (
            spark.readStream.format(source)
            .options(**options)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds = time.perf_counter() - began
        rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
    return rows, seconds


def spark_read(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``spark-read`` and ``spark-read-ordered`` workloads (see the module)."""
    if _on_fork(spec):
        return _fork_read(spec)
    from nsq_ha.devcluster import DevClusterThread
    from nsq_ha.spark.options import parse_read_options
    from nsq_ha.spark.source.extents import fetch_extents

    n = spec["n"]
    with DevClusterThread(nodes=3) as dev:
        lookupd, topic = dev.lookupd_http, _topic()
        asyncio.run(_create(lookupd, topic, ordered=bool(spec.get("ordered"))))
        endpoint = parse_read_options({"lookupd": lookupd, "topic": topic}).endpoint
        start = {p: e.end for p, e in fetch_extents(endpoint).items()}
        asyncio.run(_publish(lookupd, topic, n, spec["size"]))
        spark = _session()
        try:
            _read_once(spark, lookupd, topic, start)  # warm-up
            rows, seconds = _read_once(spark, lookupd, topic, start)
        finally:
            spark.stop()
    if rows != n:
        raise RuntimeError(f"the stream read {rows} rows of the {n} published")
    return {"count": rows, "seconds": seconds}


def ordered_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``dev-ordered`` workload (see the module)."""
    if _on_fork(spec):
        return _fork_consume(spec, ordered=True)
    from nsq_ha.devcluster import DevClusterThread

    n = spec["n"]
    with DevClusterThread(nodes=3) as dev:
        lookupd, topic = dev.lookupd_http, _topic()
        asyncio.run(_create(lookupd, topic, ordered=True))
        asyncio.run(_publish(lookupd, topic, n, spec["size"], partition=0))
        options = {"partitions": [0], "ordered": True, "max_in_flight": 1}
        seconds = asyncio.run(asyncio.wait_for(_consume(lookupd, topic, n, options), 600))
    return {"count": n, "seconds": seconds}


async def _consume(
    lookupd: str, topic: str, n: int, options: dict[str, Any], channel: str = "bench"
) -> float:
    """Seconds to consume ``n`` messages of ``channel`` with ``async for``, each finished, the
    clock started once the consumer is up (``options``: the Consumer's)."""
    from nsq_ha.consumer import Consumer

    got = 0
    async with Consumer(topic, channel, lookupd=lookupd, **options) as consumer:
        began = time.perf_counter()
        async for message in consumer:
            await message.finish()
            got += 1
            if got == n:
                return time.perf_counter() - began
    raise RuntimeError(f"the consume of {topic!r} ended after {got} of {n} messages")


def spark_write(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``spark-write`` workload (see the module)."""
    n = spec["n"]
    with _where(spec, in_process=True) as (lookupd, topic):
        spark = _session()
        try:
            from pyspark.sql import functions as F

            def write(rows: int) -> float:
                frame = spark.range(rows, numPartitions=PARTITIONS).select(
                    F.lit(body(spec["size"])).alias("body"),
                    (F.col("id") % KEYS).cast("string").alias("key"),
                )
                began = time.perf_counter()
                (
                    frame.write.format("nsq")
                    .mode("append")
                    .option("lookupd", lookupd)
                    .option("topic", topic)
                    .option("keyColumn", "key")
                    .option("bodyColumn", "body")
                    .save()
                )
                return time.perf_counter() - began

            write(2000)  # warm-up
            seconds = write(n)
        finally:
            spark.stop()
    return {"count": n, "seconds": seconds}


def plain_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``dev-consume`` workload (see the module)."""
    if _on_fork(spec):
        return _fork_consume(spec, ordered=False)
    n = spec["n"]
    with _cluster_process() as lookupd:
        topic = _topic()
        asyncio.run(_create(lookupd, topic))
        asyncio.run(_publish(lookupd, topic, n, spec["size"]))
        options = {"max_in_flight": 2500}
        seconds = asyncio.run(asyncio.wait_for(_consume(lookupd, topic, n, options), 600))
    return {"count": n, "seconds": seconds}


def keyed_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``dev-write`` workload (see the module)."""
    n, size = spec["n"], spec["size"]

    async def publish(lookupd: str, topic: str) -> float:
        bodies = [body(size)] * 500
        keys = [str(i % KEYS) for i in range(500)]
        room = asyncio.Semaphore(4)
        async with Producer(lookupd=lookupd) as producer:
            await producer.publish_many(topic, bodies[:KEYS], sharding_keys=keys)  # warm-up

            async def call(count: int) -> None:
                async with room:
                    await producer.publish_many(topic, bodies[:count], sharding_keys=keys[:count])

            began = time.perf_counter()
            await asyncio.gather(*(call(min(500, n - i)) for i in range(0, n, 500)))
            return time.perf_counter() - began

    with _where(spec, in_process=False) as (lookupd, topic):
        seconds = asyncio.run(asyncio.wait_for(publish(lookupd, topic), 600))
    return {"count": n, "seconds": seconds}


@contextlib.contextmanager
def _cluster_process(timeout: float = 60.0) -> Iterator[str]:
    """An embedded 3-node cluster in a child process (``nsq-ha devcluster``): its lookupd
    URL; the process is stopped on exit."""
    command = [sys.executable, "-m", "nsq_ha", "devcluster", "--nodes", "3"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        if child.stdout is None:  # (never: stdout is a pipe)
            raise RuntimeError("nsq-ha devcluster has no output")
        deadline = time.monotonic() + timeout
        lookupd = ""
        while not lookupd:  # it prints its addresses, then nothing (no --events)
            line = child.stdout.readline()
            if not line or time.monotonic() > deadline:
                raise RuntimeError(f"nsq-ha devcluster did not start: {line!r}")
            if line.startswith("lookupd "):
                lookupd = line.split()[1]
        yield lookupd
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextlib.contextmanager
def _where(spec: dict[str, Any], *, in_process: bool) -> Iterator[tuple[str, str]]:
    """(lookupd, topic) of a run: the stage's fork topic, or a new topic on an embedded
    cluster, in this process or (``in_process`` False) in a child process."""
    if _on_fork(spec):
        yield spec["lookupd"], spec["topic"]
        return
    if not in_process:
        with _cluster_process() as lookupd:
            topic = _topic()
            asyncio.run(_create(lookupd, topic))
            yield lookupd, topic
        return
    from nsq_ha.devcluster import DevClusterThread

    with DevClusterThread(nodes=3) as dev:
        topic = _topic()
        asyncio.run(_create(dev.lookupd_http, topic))
        yield dev.lookupd_http, topic


# -- on the real fork --------------------------------------------------------------------------


def _on_fork(spec: dict[str, Any]) -> bool:
    """Whether the stage placed the run on the fork (its lookupd and topic in the spec)."""
    return bool(spec.get("lookupd"))


def _ends(lookupd: str, topic: str) -> dict[int, int]:
    """Each partition's write end now."""
    from nsq_ha.spark.options import parse_read_options
    from nsq_ha.spark.source.extents import fetch_extents

    endpoint = parse_read_options({"lookupd": lookupd, "topic": topic}).endpoint
    return {p: e.end for p, e in fetch_extents(endpoint).items()}


async def _publish_even(lookupd: str, topic: str, count: int, size: int) -> None:
    """``count`` messages, ``count / PARTITIONS`` to each partition (by partition number)."""
    bodies = [body(size)] * 500
    share = [count // PARTITIONS + (p < count % PARTITIONS) for p in range(PARTITIONS)]
    async with Producer(lookupd=lookupd) as producer:

        async def fill(partition: int, left: int) -> None:
            while left > 0:
                await producer.publish_many(topic, bodies[: min(500, left)], partition=partition)
                left -= min(500, left)

        await asyncio.gather(*(fill(p, share[p]) for p in range(PARTITIONS)))


def _batch_once(spark: Any, lookupd: str, topic: str, start: dict[int, int]) -> tuple[int, float]:
    """A bounded batch read from ``start`` to the write ends: the rows counted, the seconds."""
    began = time.perf_counter()
    rows = (
        spark.read.format("nsq")
        .option("lookupd", lookupd)
        .option("topic", topic)
        .option("startingOffsets", json.dumps({str(p): o for p, o in start.items()}))
        .option("endingOffsets", "latest")
        .load()
        .count()
    )
    return int(rows), time.perf_counter() - began


def _fork_read(spec: dict[str, Any]) -> dict[str, Any]:
    """A Spark read on the fork (``spark_mode``: stream, batch or fixed; see the module)."""
    lookupd, topic, n, size = spec["lookupd"], spec["topic"], spec["n"], spec["size"]
    mode = spec.get("spark_mode") or "stream"
    read: Callable[[Any, str, str, dict[int, int]], tuple[int, float]]
    read = _batch_once if mode == "batch" else _read_once

    def publish_and_read(count: int) -> float:
        start = _ends(lookupd, topic)
        asyncio.run(_publish_even(lookupd, topic, count, size))
        rows, seconds = read(spark, lookupd, topic, start)
        if rows != count:
            raise RuntimeError(f"the {mode} read gave {rows} rows of the {count} published")
        return seconds

    spark = _session()
    try:
        if mode.startswith("floor"):
            _floor_read(spark, 2000, batch=mode == "floor-batch")  # warm-up
            return {"count": n, "seconds": _floor_read(spark, n, batch=mode == "floor-batch")}
        if mode == "fixed":
            publish_and_read(PARTITIONS)  # warm-up: the JVM, Spark's Python workers
            return {"count": 1, "seconds": publish_and_read(PARTITIONS)}
        publish_and_read(2000)  # warm-up
        return {"count": n, "seconds": publish_and_read(n)}
    finally:
        spark.stop()


def _floor_read(spark: Any, count: int, *, batch: bool) -> float:
    """Seconds of a read of ``count`` rows of Spark's floor source (rows from memory, no NSQ:
    :mod:`nsq_ha.bench.spark_floor`), as a stream (``availableNow`` into ``noop``) or a batch
    read (``count()``)."""
    from nsq_ha.bench.spark_floor import NAME, FloorSource
    from nsq_ha.spark.rows import SCHEMA

    spark.dataSource.register(FloorSource)
    options = {"rows": str(count), "schema": SCHEMA}
    if batch:
        began = time.perf_counter()
        rows = spark.read.format(NAME).options(**options).load().count()
        seconds = time.perf_counter() - began
    else:
        rows, seconds = _stream(spark, NAME, options)
    if rows != count:
        raise RuntimeError(f"the floor read gave {rows} rows of {count}")
    return seconds


def _fork_consume(spec: dict[str, Any], *, ordered: bool) -> dict[str, Any]:
    """``async for`` over the 4 partitions (one consumer), or 4 ordered consumers (one per
    partition), of ``n`` messages published after their channel was made."""
    lookupd, topic, n = spec["lookupd"], spec["topic"], spec["n"]
    channel = f"bench_{os.getpid()}"
    asyncio.run(_channel(lookupd, topic, channel, create=True))
    try:
        asyncio.run(_publish_even(lookupd, topic, n, spec["size"]))
        if ordered:
            run = _ordered_four(lookupd, topic, channel, n)
        else:
            run = _consume(lookupd, topic, n, {"max_in_flight": 2500}, channel)
        seconds = asyncio.run(asyncio.wait_for(run, 600))
    finally:
        asyncio.run(_channel(lookupd, topic, channel, create=False))
    return {"count": n, "seconds": seconds}


async def _channel(lookupd: str, topic: str, channel: str, *, create: bool) -> None:
    """Create ``channel`` on every partition (at its end), or delete it."""
    async with LookupdAdmin(lookupd) as admin:
        if create:
            await admin.create_channel(topic, channel)
            return
        for partition, node in await admin.channel_targets(topic):
            async with NsqdAdmin(node.http_url) as nsqd:
                await nsqd.delete_channel(topic, channel, partition)


async def _ordered_four(lookupd: str, topic: str, channel: str, n: int) -> float:
    """Seconds for 4 ordered consumers, one per partition, to finish their ``n / 4`` each,
    the clock started once all are up."""
    from nsq_ha.consumer import Consumer

    share = [n // PARTITIONS + (p < n % PARTITIONS) for p in range(PARTITIONS)]

    async def take(consumer: Consumer, count: int) -> None:
        got = 0
        async for message in consumer:
            await message.finish()
            got += 1
            if got == count:
                return

    async with contextlib.AsyncExitStack() as stack:
        consumers = [
            await stack.enter_async_context(
                Consumer(
                    topic, channel, lookupd=lookupd, partitions=[p], ordered=True, max_in_flight=1
                )
            )
            for p in range(PARTITIONS)
        ]
        began = time.perf_counter()
        await asyncio.gather(*(take(c, share[p]) for p, c in enumerate(consumers)))
        return time.perf_counter() - began
