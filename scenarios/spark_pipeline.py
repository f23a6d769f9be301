"""Spark pipeline: stream a sharded topic into Spark, total it per key, publish the totals in key
order to another topic.

1. create ``payments`` (4 partitions, plain) and ``totals`` (4 partitions, ordered), and a
   channel on ``totals`` at its start for the check;
2. publish N payments ``{"user", "cents", "n"}`` keyed by user with the blocking producer, and
   remember every user's expected total;
3. Spark ``local[2]`` streams ``payments`` with ``readStream.format("nsq")`` from the earliest
   offset (the replayable source on the fork: one Spark task per partition and batches of at most
   ``maxBytesPerTrigger``), ``trigger(availableNow=True)``, into Parquet with a checkpoint;
   then ``spark.read.format("nsq")`` (a batch read, earliest to latest) reads it again;
4. a batch job reads the Parquet, sums per user, places each user on the partition the producer
   would choose (``co_partition``), sorts by user and writes the totals with
   ``write.format("nsq")`` keyed by user;
5. check: every payment was read (by partition and offset, once), the batch read gave the same
   rows as the stream, every user's total arrived
   exactly once (one message per user; a redelivery of the same message is counted apart) with
   the right amount, on the user's partition, and each partition's totals came in ascending
   user order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import Report, parse_args, print_table, unique

from nsq_ha.admin import LookupdAdmin
from nsq_ha.consumer import Consumer
from nsq_ha.routing import partition_for_key
from nsq_ha.sync import Producer

PARTITIONS, USERS, CHANNEL = 4, 40, "check"


@contextlib.contextmanager
def cluster(args: argparse.Namespace) -> Iterator[str]:
    """``--lookupd``, or the embedded cluster in its own thread (Spark blocks this one)."""
    if args.lookupd:
        print(f"cluster: {args.lookupd} (given)")
        yield args.lookupd
        return
    from nsq_ha.devcluster import DevClusterThread

    with DevClusterThread(nodes=3) as dev:
        print(f"cluster: embedded, lookupd {dev.lookupd_http}, 3 nsqd")
        yield dev.lookupd_http


async def create_topics(lookupd: str, payments: str, totals: str) -> None:
    async with LookupdAdmin(lookupd) as admin:
        await asyncio.gather(
            admin.create_topic(payments, PARTITIONS, 1, multi_part=True),
            admin.create_topic(totals, PARTITIONS, 1, ordered=True),
        )
        await admin.create_channel(totals, CHANNEL, rewind=True)


async def read_totals(
    lookupd: str, topic: str, count: int
) -> tuple[list[tuple[int, str, int]], int]:
    """(partition, user, total) per message in arrival order, until ``count`` messages arrived
    (+1 s for extras), and how many deliveries were a message again (same partition and
    offset: at-least-once; the fork can deliver what a rewound channel had read ahead twice)."""
    got: list[tuple[int, str, int]] = []
    seen: set[tuple[int, int]] = set()
    again = 0
    deadline = time.monotonic() + 120
    async with Consumer(topic, CHANNEL, lookupd=lookupd) as consumer:
        while time.monotonic() < deadline:
            wait = 1.0 if len(got) >= count else 2.0
            message = await consumer.get(timeout=wait)
            if message is None:
                if len(got) >= count:
                    break
                continue
            await message.finish()
            where = (message.partition or 0, message.offset or 0)
            if where in seen:
                again += 1
                continue
            seen.add(where)
            data = json.loads(message.body)
            got.append((message.partition or 0, data["user"], data["cents"]))
    return got, again


def story(args: argparse.Namespace, report: Report) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from nsq_ha.spark import co_partition, register

    with cluster(args) as lookupd, tempfile.TemporaryDirectory() as tmp:
        payments, totals = unique("spark_payments"), unique("spark_totals")
        asyncio.run(create_topics(lookupd, payments, totals))
        rng = random.Random(7)  # noqa: S311 - test data, not secrets
        expected: dict[str, int] = defaultdict(int)
        offsets: set[tuple[int, int]] = set()
        with Producer(lookupd=lookupd, trace=True) as producer:
            futures = []
            for n in range(args.messages):
                user = f"user{rng.randrange(USERS):03d}"
                cents = rng.randrange(1, 10_000)
                expected[user] += cents
                body = json.dumps({"user": user, "cents": cents, "n": n}).encode()
                futures.append(producer.publish_async(payments, body, sharding_key=user))
            for future in futures:
                result = future.result(60)
                offsets.add((result.partition or 0, result.offset or 0))
        print(f"published {args.messages} payments of {len(expected)} users to {payments}")

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("nsq_ha spark_pipeline")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", str(PARTITIONS))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        try:
            raw = Path(tmp) / "payments"
            started = time.monotonic()
            query = (
                spark.readStream.format("nsq")
                .option("lookupd", lookupd)
                .option("topic", payments)
                .option("startingOffsets", "earliest")
                .option("maxBytesPerTrigger", str(64 * 1024))
                .load()
                .select("partition", "offset", "body")
                .writeStream.format("parquet")
                .option("path", str(raw))
                .option("checkpointLocation", str(Path(tmp) / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination(600)
            if query.exception() is not None:
                raise RuntimeError(f"the streaming read failed: {query.exception()}")
            batches = len(query.recentProgress)
            streamed = time.monotonic() - started
            rows = spark.read.parquet(str(raw))
            pairs = rows.select("partition", "offset").collect()
            read = {(r["partition"], r["offset"]) for r in pairs}
            report.check(
                "every payment read once",
                read == offsets and rows.count() == len(offsets),
                f"{rows.count()} rows, {len(read)} distinct offsets of {len(offsets)} "
                f"published, {batches} micro-batches in {streamed:.1f}s",
            )

            def keyed(frame: Any) -> list[tuple[int, int, bytes]]:
                picked = frame.select("partition", "offset", "body").collect()
                return sorted((r["partition"], r["offset"], bytes(r["body"])) for r in picked)

            batch = (
                spark.read.format("nsq").option("lookupd", lookupd).option("topic", payments).load()
            )
            batch_rows, stream_rows = keyed(batch), keyed(rows)
            report.check(
                "a batch read gives the stream's rows",
                batch_rows == stream_rows,
                f"{len(batch_rows)} rows from spark.read, {len(stream_rows)} streamed",
            )

            schema = "user string, cents long, n long"
            parsed = rows.select(F.from_json(F.col("body").cast("string"), schema).alias("p"))
            sums = parsed.groupBy("p.user").agg(F.sum("p.cents").alias("cents"))
            sums = sums.withColumn("body", F.to_json(F.struct("user", "cents")))
            placed = co_partition(sums, "user", lookupd, totals, "user")
            (
                placed.write.format("nsq")
                .mode("append")
                .option("lookupd", lookupd)
                .option("topic", totals)
                .option("keyColumn", "user")
                .save()
            )
        finally:
            spark.stop()

        got, again = asyncio.run(read_totals(lookupd, totals, len(expected)))
        by_user = {user: cents for _, user, cents in got}
        wrong = [u for u, c in expected.items() if by_user.get(u) != c]
        report.check(
            "every total once and right",
            len(got) == len(expected) and not wrong,
            f"{len(got)} totals for {len(expected)} users, {len(wrong)} wrong "
            f"({again} redelivered)",
        )
        misplaced = [u for p, u, _ in got if p != partition_for_key(u, PARTITIONS)]
        report.check("each user on its partition", not misplaced, f"{len(misplaced)} elsewhere")
        per_partition: dict[int, list[str]] = defaultdict(list)
        for partition, user, _ in got:
            per_partition[partition].append(user)
        unordered = [p for p, users in per_partition.items() if users != sorted(users)]
        report.check(
            "totals in key order per partition",
            not unordered,
            f"{len(per_partition)} partitions, out of order: {unordered or 'none'}",
        )
        print_table(
            "totals per partition",
            ["partition", "users", "first", "last"],
            [[p, len(users), users[0], users[-1]] for p, users in sorted(per_partition.items())],
        )


def main() -> None:
    args = parse_args(__doc__ or "", messages=2000)
    report = Report()
    try:
        story(args, report)
    except Exception as exc:  # any error fails the scenario, with its message
        import traceback

        traceback.print_exc(file=sys.stderr)
        report.check("ran to the end", False, f"{type(exc).__name__}: {exc}")
    sys.exit(report.finish())


if __name__ == "__main__":
    main()
