"""The ``nsq`` Spark source reading several topics (``topics``, ``topicPattern``, ``assign``),
on the embedded cluster and on the real fork cluster (the same test on both), and the driver
source reading two topics of real vanilla nsqd.

* a batch read of two topics, with Kafka's per-topic ``startingOffsets``, gives exactly the
  rows published (topic, partition, offset, body), one Spark task per (topic, partition); an
  ``assign`` of some partitions gives exactly those; an assigned partition a topic lacks is a
  clear error; a pattern matching nothing reads nothing;
* a stream on ``topicPattern`` picks up a topic created after the query started, read from
  its start;
* a replayable reader given an offset in the single-topic form older checkpoints hold
  continues from it (no Spark query needed: ``latestOffset`` / ``partitions`` directly);
* ``trigger(availableNow=True)`` over two topics with ``maxBytesPerTrigger`` reads all there
  was, in several batches, and stops;
* the driver source on vanilla nsqd reads every message of two topics.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from nsq_ha.admin import TopicSpec  # noqa: E402
from nsq_ha.spark.compat import (  # noqa: E402
    REPLAYABLE_STREAM_READ,
    ReadAllAvailable,
    ReadMaxBytes,
    pyspark_version,
    supports,
)
from nsq_ha.spark.options import OptionError, parse_read_options  # noqa: E402
from nsq_ha.spark.rows import SCHEMA  # noqa: E402
from nsq_ha.spark.source.extents import fetch_extents  # noqa: E402
from nsq_ha.spark.source.ranges import read_range  # noqa: E402
from nsq_ha.spark.source.readers import NsqBatchReader, NsqReplayableReader  # noqa: E402
from nsq_ha.sync import Producer  # noqa: E402

from .backend import Backend  # noqa: E402
from .spark_session import local_spark, run_until  # noqa: E402

pytestmark = pytest.mark.spark
needs_replayable_stream = pytest.mark.skipif(
    not supports(REPLAYABLE_STREAM_READ),
    reason=f"PySpark {pyspark_version()}: the replayable streaming source needs PySpark 4.2+",
)

#: one suffix per run: the fork cluster is shared by the session
RUN = secrets.token_hex(3)
A, B = f"tka_{RUN}", f"tkb_{RUN}"
#: the pattern's first topic exists from the start, the second is made while a query runs
P1, P2 = f"tkp_{RUN}_one", f"tkp_{RUN}_two"
PATTERN = rf"tkp_{RUN}_.*"
Row = tuple[str, int, int, str]  # topic, partition, offset, body
#: where the body is in a row tuple of read_range
BODY = [column.split()[0] for column in SCHEMA.split(", ")].index("body")


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    with local_spark("nsq_ha-topics", "local[2]", conf) as session:
        yield session


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics([TopicSpec(t, partitions=2) for t in (A, B, P1)])
    return backend


def _ends(lookupd: str, topic: str) -> dict[int, int]:
    endpoint = parse_read_options({"lookupd": lookupd, "topic": topic}).endpoint
    return {p: e.end for p, e in fetch_extents(endpoint).items()}


def _publish(lookupd: str, topic: str, count: int, tag: str) -> set[Row]:
    """``count`` keyed messages; what each became (topic, partition, offset, body)."""
    with Producer(lookupd=lookupd, trace=True) as producer:
        bodies = [f"{tag}{i:04d}" for i in range(count)]
        futures = [
            (body, producer.publish_async(topic, body.encode(), sharding_key=f"k{i % 8}"))
            for i, body in enumerate(bodies)
        ]
        rows = set()
        for body, future in futures:
            result = future.result(60)
            assert result.partition is not None
            assert result.offset is not None
            rows.add((topic, result.partition, result.offset, body))
    return rows


def _rows(df: DataFrame) -> set[Row]:
    return {
        (r["topic"], r["partition"], r["offset"], bytes(r["body"]).decode())
        for r in df.select("topic", "partition", "offset", "body").collect()
    }


def _batch(spark: SparkSession, lookupd: str, **options: str) -> DataFrame:
    reader = spark.read.format("nsq").option("lookupd", lookupd)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_of_two_topics_and_of_assigned_partitions(
    spark: SparkSession, cluster: Backend
) -> None:
    lookupd = cluster.lookupd_http
    before = {t: _ends(lookupd, t) for t in (A, B)}
    published = _publish(lookupd, A, 300, "a") | _publish(lookupd, B, 200, "b")
    starting = json.dumps({t: {str(p): o for p, o in ends.items()} for t, ends in before.items()})

    rows = _rows(_batch(spark, lookupd, topics=f"{A},{B}", startingOffsets=starting))
    assert rows == published
    assert {r[0] for r in rows} == {A, B}
    # one Spark task per (topic, partition)
    opts = parse_read_options(
        {"lookupd": lookupd, "topics": f"{A},{B}", "startingOffsets": starting}, batch=True
    )
    tasks = [p.task for p in NsqBatchReader(opts).partitions()]  # type: ignore[attr-defined]
    assert sorted((t.topic, t.partition) for t in tasks) == [(A, 0), (A, 1), (B, 0), (B, 1)]

    assign = json.dumps({A: [1], B: [0]})
    # a topic left out of startingOffsets takes the default (earliest): only A's is given
    only_a = json.dumps({A: {"1": before[A][1]}})
    subset = _rows(_batch(spark, lookupd, assign=assign, startingOffsets=only_a))
    want = {r for r in published if (r[0], r[1]) in {(A, 1), (B, 0)}}
    assert want <= subset
    assert {(r[0], r[1]) for r in subset} == {(A, 1), (B, 0)}
    assert {r for r in subset if r[0] == A} == {r for r in want if r[0] == A}

    with pytest.raises(OptionError, match=rf"topic '{A}' has no partition \[5\]"):
        NsqBatchReader(
            parse_read_options({"lookupd": lookupd, "assign": json.dumps({A: [0, 5]})}, batch=True)
        ).partitions()
    nothing = _batch(spark, lookupd, topicPattern=f"nomatch_{RUN}_.*")
    assert nothing.count() == 0
    print(f"\n{cluster.name}: {len(rows)} rows of 2 topics; assign read {len(subset)}")


def _collect_to(out: Path) -> Callable[[DataFrame, int], None]:
    def sink(batch: DataFrame, batch_id: int) -> None:
        records = sorted(_rows(batch))
        partial = out / f"batch-{batch_id:05d}.part"
        partial.write_text(json.dumps(records))
        partial.replace(out / f"batch-{batch_id:05d}.json")

    return sink


def _seen(out: Path) -> list[Row]:
    return [
        tuple(r) for path in sorted(out.glob("batch-*.json")) for r in json.loads(path.read_text())
    ]


@needs_replayable_stream
def test_a_pattern_stream_picks_up_a_topic_created_after_it_started(
    spark: SparkSession, cluster: Backend, tmp_path: Path
) -> None:
    lookupd = cluster.lookupd_http
    first = _publish(lookupd, P1, 100, "p")
    out = tmp_path / "out"
    out.mkdir()
    query = (
        spark.readStream.format("nsq")
        .option("lookupd", lookupd)
        .option("topicPattern", PATTERN)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(_collect_to(out))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 300
        while not first <= set(_seen(out)):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the first topic was not read"
            time.sleep(0.2)
        cluster.ensure_topics([TopicSpec(P2, partitions=2)])
        second = _publish(lookupd, P2, 150, "q")
    except BaseException:
        query.stop()
        raise
    run_until(query, lambda: second <= set(_seen(out)), timeout=300)
    seen = _seen(out)
    assert set(seen) == first | second
    assert len(seen) == len(first | second), "a row came twice"
    offsets = [json.loads(line) for line in _last_offsets(tmp_path / "checkpoint")]
    assert set(offsets[-1]["topics"]) == {P1, P2}
    print(f"\n{cluster.name}: pattern read {len(first)} rows, then {len(second)} of a new topic")


def _last_offsets(checkpoint: Path) -> list[str]:
    last = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    return (checkpoint / "offsets" / str(last)).read_text().splitlines()[-1:]


@needs_replayable_stream
def test_an_offset_in_the_old_single_topic_form_is_continued(cluster: Backend) -> None:
    """A checkpoint written before several topics: ``{"topic", "channel", "partitions"}``."""
    lookupd = cluster.lookupd_http
    _publish(lookupd, A, 40, "early")  # before the checkpoint's positions: not read again
    before = _ends(lookupd, A)
    published = _publish(lookupd, A, 120, "o")
    old = {
        "topic": A,
        "channel": f"spark_old{RUN}",
        "partitions": {str(p): o for p, o in sorted(before.items())},
    }
    reader = NsqReplayableReader(parse_read_options({"lookupd": lookupd, "topic": A}))
    end = reader.latestOffset(old, ReadAllAvailable())
    assert end["channel"] == old["channel"]
    assert set(end["topics"]) == {A}
    latest = reader.reportLatestOffset()
    assert latest is not None
    assert latest["topics"][A] == end["topics"][A]
    ranges = reader.partitions(old, end)
    got = {
        (row[0], row[1], row[2], bytes(row[BODY]).decode())
        for part in ranges
        for row in read_range(part.task)  # type: ignore[attr-defined]
    }
    assert got == published
    # the byte limit, from an old offset too: less than everything, nothing before the start
    limited = reader.latestOffset(old, ReadMaxBytes(100))
    moved = sum(int(o) - before[int(p)] for p, o in limited["topics"][A].items())
    assert 0 < moved <= 100
    # and the next batch starts where the new form says
    assert reader.partitions(end, reader.latestOffset(end, ReadAllAvailable())) == []


@needs_replayable_stream
def test_available_now_over_two_topics_reads_what_there_was_and_stops(
    spark: SparkSession, cluster: Backend, tmp_path: Path
) -> None:
    lookupd = cluster.lookupd_http
    before = {t: _ends(lookupd, t) for t in (A, B)}
    published = _publish(lookupd, A, 100, "x") | _publish(lookupd, B, 100, "y")
    starting = json.dumps({t: {str(p): o for p, o in ends.items()} for t, ends in before.items()})
    out = tmp_path / "out"
    out.mkdir()
    query = (
        spark.readStream.format("nsq")
        .option("lookupd", lookupd)
        .option("topics", f"{A},{B}")
        .option("startingOffsets", starting)
        .option("maxBytesPerTrigger", "4096")
        .load()
        .writeStream.foreachBatch(_collect_to(out))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300), "availableNow did not stop"
    assert query.exception() is None, query.exception()
    seen = _seen(out)
    assert set(seen) == published
    assert len(seen) == len(published)
    assert len(list(out.glob("batch-*.json"))) > 1  # the byte limit made several batches


def test_the_driver_source_reads_two_topics_of_vanilla_nsqd(
    spark: SparkSession, vanilla_cluster: Any, tmp_path: Path
) -> None:
    nsqd = vanilla_cluster.nodes[0].tcp_address
    topics = [f"tkv_{RUN}_{i}" for i in range(2)]
    total = 400
    published: set[tuple[str, str]] = set()
    with Producer(nsqd=nsqd) as producer:
        for topic in topics:
            producer.publish(topic, b"warmup")
            # the channel exists before the messages: it gets them all
            from nsq_ha.sync import Consumer

            with Consumer(topic, "spark", nsqd=nsqd, max_in_flight=1) as consumer:
                message = consumer.get(timeout=30)
                assert message is not None
                message.finish()
            bodies = [f"{topic}:{i:04d}" for i in range(total)]
            producer.publish_many(topic, [b.encode() for b in bodies])
            published.update((topic, b) for b in bodies)
    out = tmp_path / "out"
    out.mkdir()

    def sink(batch: DataFrame, batch_id: int) -> None:
        rows = [(r["topic"], bytes(r["body"]).decode()) for r in batch.collect()]
        partial = out / f"batch-{batch_id:05d}.part"  # seen() reads while the query writes
        partial.write_text(json.dumps(rows))
        partial.replace(out / f"batch-{batch_id:05d}.json")

    def seen() -> list[tuple[str, str]]:
        return [
            (t, b) for p in sorted(out.glob("batch-*.json")) for t, b in json.loads(p.read_text())
        ]

    reader = spark.readStream.format("nsq")
    for key, value in {
        "nsqd": nsqd,
        "topics": ",".join(topics),
        "channel": "spark",
        "walPath": str(tmp_path / "checkpoint" / "nsq-wal"),
        "maxMessagesPerTrigger": "150",
    }.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    run_until(query, lambda: published <= set(seen()), timeout=300)
    rows = seen()
    assert set(rows) == published, "a message is missing, or one came from the wrong topic"
    sizes = [len(json.loads(p.read_text())) for p in out.glob("batch-*.json")]
    assert max(sizes) <= 150, "maxMessagesPerTrigger is for all topics together"
    print(f"\nvanilla: {len(published)} messages of 2 topics in {len(sizes)} batches")
