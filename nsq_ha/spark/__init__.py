"""PySpark data source and sink for NSQ topics (PySpark 4.0+, Python Data Source API; the
replayable streaming source needs 4.2+, see :mod:`nsq_ha.spark.compat`).

::

    from nsq_ha.spark import register, with_nsq_partition
    register(spark)

    # write a DataFrame, each key's rows in order (see "Order" below)
    df = with_nsq_partition(df, "user", lookupd="http://127.0.0.1:4161", topic="orders")
    (df.repartition("nsq_partition").sortWithinPartitions("nsq_partition", "seq")
       .write.format("nsq").mode("append")
       .option("lookupd", "http://127.0.0.1:4161").option("topic", "orders")
       .option("keyColumn", "user").option("bodyColumn", "payload").save())

    # stream a topic into Spark
    rows = (spark.readStream.format("nsq").option("lookupd", "http://127.0.0.1:4161")
            .option("topic", "orders").option("startingOffsets", "earliest").load())

Options are listed in :mod:`nsq_ha.spark.options`.

**Writing.** Each Spark task publishes its rows with :class:`nsq_ha.sync.Producer`, each to
the option ``topic`` or, without it, its ``topic`` column's topic (``topicColumn``); a row
whose ``partition`` column is not null goes to that partition; a ``headers`` map is merged into
the ext header on ext topics (see :mod:`.sink.columns`). A row with a key goes to the key's
partition (the same mapping as the producer, selectable to match the fork's Go or Java SDK),
in row order, with at most one unacknowledged batch per partition. The driver's commit logs
the counts per topic and partition. Guarantees: *at-least-once*. NSQ has no
transactions: a failed job leaves what it published; a retried task publishes its rows again
(duplicates, and a retried task's rows come after what other tasks published meanwhile).
Streaming writes to ext topics stamp ``nsq_spark_query``, ``nsq_spark_batch``,
``nsq_spark_task`` and ``nsq_spark_seq`` into each message's ext header, so consumers can drop
a replayed batch's duplicates; keyed writes to ext topics also carry the key as ``nsq_key``.

**Order.** Per-key order across a whole job needs every key's rows in one task, in order:
:func:`with_nsq_partition` adds the partition each row will go to, computed as the producer
does; ``repartition`` by it and ``sortWithinPartitions`` by your order column. Turn
speculation off (``spark.speculation=false``, the default): a speculative copy of a task
publishes the same rows concurrently.

**Reading.** One topic (``topic``), several (``topics``), a pattern (``topicPattern``) or
chosen partitions (``assign``), see :mod:`.topic_set`. Two sources, chosen by the option ``mode``
(``auto`` picks by the first topic):

* ``replayable`` (the fork in cluster mode): offsets are per-partition queue positions; start
  at ``earliest``, ``latest`` (default), a JSON object of partition to offset, or
  ``startingTimestamp`` (ms); ``maxBytesPerTrigger`` limits a batch; ``failOnDataLoss``
  decides what happens when the next offsets are not held by nsqd (deleted by retention, or
  past a partition's end after the topic was re-created): fail naming them (default), or log
  and read from the first retained offset. Each Spark task reads one
  partition on a channel of the query's own (``spark_<random>``, kept in the checkpoint), so a
  restarted query reads exactly the ranges its checkpoint says. Exactly-once *processing* with
  an idempotent sink; rows carry ``(partition, offset)`` as their identity.
* ``driver`` (vanilla NSQ, or any shared channel): one consumer on the driver; a batch is written
  under ``walPath`` before Spark gets it and its messages are finished only when Spark commits
  it: at-least-once (a crash redelivers unfinished messages), a replayed batch is identical.
  Options ``channel`` (required), ``walPath`` (required), ``maxMessagesPerTrigger``.
  ``walPath`` is a directory beside the checkpoint, on the checkpoint's file system: a local
  path or a ``pyarrow.fs`` URI (``file:///…``, ``hdfs://namenode:8020/…``, ``s3://bucket/…``,
  ``gs://…``, ``abfs://…``; credentials from the URI or that file system's environment, never
  shown in logs). A location pyarrow cannot open fails the query when it starts. See
  :mod:`nsq_ha.spark.source.wal`. On PySpark 4.2 the consumer closes when the query stops and
  ``trigger(availableNow=True)`` reads the channel's backlog, then stops (:mod:`.source.driver`).

**Batch reads** (``spark.read.format("nsq")``) read the replayable source's ranges between
``startingOffsets`` (default ``earliest``) and ``endingOffsets`` (default ``latest``, fixed when
Spark plans the read), or ``startingTimestamp`` / ``endingTimestamp``.

Row schema: ``topic, partition, offset, raw_size, id, trace_id, attempts, timestamp, ext, key,
body, headers``. ``trace_id`` is a signed long (a u64 above 2**63 shows negative, as in the Java
SDK); ``headers`` is the ext header as a ``map<string,string>``; ``key`` is the ext header's
``keyHeader`` field, or ``keyBodyField`` of a JSON body (see :mod:`.rows`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .._sync_runtime import loop_thread
from ..routing import DEFAULT_STRATEGY, get_strategy
from .options import OptionError, ReadOptions, WriteOptions, parse_read_options, parse_write_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "STAMP_KEYS",
    "OptionError",
    "ReadOptions",
    "WriteOptions",
    "co_partition",
    "parse_read_options",
    "parse_write_options",
    "partition_count",
    "register",
    "with_nsq_partition",
]


def __getattr__(name: str) -> Any:
    """``STAMP_KEYS``, loaded from the sink on first use: Spark's Python workers import this
    package for a read too, and the sink's producer is no part of a read."""
    if name == "STAMP_KEYS":
        from .sink.publish import STAMP_KEYS

        return STAMP_KEYS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(spark: SparkSession) -> None:
    """Register the ``nsq`` format with ``spark`` (``spark.read``/``write``/``readStream``/
    ``writeStream``\\ ``.format("nsq")``)."""
    from .datasource import NsqDataSource

    spark.dataSource.register(NsqDataSource)


def partition_count(lookupd: str | list[str], topic: str) -> int:
    """The topic's partition count, from nsqlookupd (1 for a vanilla topic)."""
    from ..lookup import LookupClient

    async def count() -> int:
        async with LookupClient(lookupd) as lookup:
            pmap = await lookup.lookup(topic, "w", force=True)
        return max(1, pmap.partition_num) if pmap.fork else 1

    return asyncio.run_coroutine_threadsafe(count(), loop_thread().loop).result(60.0)


def with_nsq_partition(
    df: DataFrame,
    key_col: str,
    lookupd: str | list[str],
    topic: str,
    *,
    strategy: str = DEFAULT_STRATEGY.name,
    column: str = "nsq_partition",
    partitions: int | None = None,
) -> DataFrame:
    """``df`` with ``column``: the partition of ``topic`` each row's key goes to, computed
    exactly as :class:`nsq_ha.producer.Producer` does with ``strategy`` (keys may be string,
    binary or integer columns). ``partitions`` skips the lookup."""
    from pyspark.sql.functions import col, udf
    from pyspark.sql.types import IntegerType

    count = partitions if partitions is not None else partition_count(lookupd, topic)
    get_strategy(strategy)  # a bad name fails here, not in every task

    def place(key: Any) -> int | None:
        if key is None:
            return None
        if isinstance(key, bytearray):
            key = bytes(key)
        return get_strategy(strategy).partition(key, count)

    return df.withColumn(column, udf(place, IntegerType(), useArrow=True)(col(key_col)))


def co_partition(
    df: DataFrame,
    key_col: str,
    lookupd: str | list[str],
    topic: str,
    order_by: str | list[str],
    *,
    strategy: str = DEFAULT_STRATEGY.name,
    column: str = "nsq_partition",
) -> DataFrame:
    """:func:`with_nsq_partition`, then one Spark partition per NSQ partition, each sorted by
    ``order_by``: written with ``keyColumn=key_col``, every key's rows arrive in that order."""
    count = partition_count(lookupd, topic)
    placed = with_nsq_partition(
        df, key_col, lookupd, topic, strategy=strategy, column=column, partitions=count
    )
    orders = [order_by] if isinstance(order_by, str) else list(order_by)
    return placed.repartition(count, column).sortWithinPartitions(column, *orders)
