"""A streaming read of a topic that grows: the partitions an expansion adds join the next
micro-batch and are read from their start, as Spark's Kafka source does with new Kafka
partitions; nothing is read twice or missed. On the embedded cluster (Spark ``local[2]``)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from nsq_ha.admin import LookupdAdmin  # noqa: E402
from nsq_ha.devcluster import DevClusterThread  # noqa: E402
from nsq_ha.spark.compat import REPLAYABLE_STREAM_READ, pyspark_version, supports  # noqa: E402
from nsq_ha.sync import Producer  # noqa: E402

from .spark_session import local_spark  # noqa: E402

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        not supports(REPLAYABLE_STREAM_READ),
        reason=f"PySpark {pyspark_version()}: the replayable streaming source needs PySpark 4.2+",
    ),
]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark("nsq_ha-expansion", "local[2]") as session:
        yield session


def _collect_to(out: Path) -> Callable[[DataFrame, int], None]:
    def sink(batch: DataFrame, batch_id: int) -> None:
        rows = [
            {"partition": r["partition"], "offset": r["offset"], "body": bytes(r["body"]).decode()}
            for r in batch.select("partition", "offset", "body").collect()
        ]
        partial = out / f"batch-{batch_id:05d}.part"
        partial.write_text(json.dumps(rows))
        partial.replace(partial.with_suffix(".json"))

    return sink


def _rows(out: Path) -> list[dict[str, object]]:
    return [r for p in sorted(out.glob("batch-*.json")) for r in json.loads(p.read_text())]


def _wait(query: object, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        failed = query.exception()  # type: ignore[attr-defined]
        assert failed is None, f"the query failed: {failed}"
        assert time.monotonic() < deadline, "the query did not get there in time"
        time.sleep(0.2)


def test_a_stream_reads_the_partitions_an_expansion_adds_from_their_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    topic = f"sp_grow_{secrets.token_hex(3)}"
    with DevClusterThread(nodes=3) as dev:

        async def admin(partitions: int) -> None:
            async with LookupdAdmin(dev.lookupd_http, timeout=60) as lookupd:
                if partitions == 2:
                    await lookupd.create_topic(topic, 2, multi_part=True)
                else:
                    await lookupd.expand_topic(topic, partitions)

        asyncio.run(admin(2))
        with Producer(lookupd=dev.lookupd_http) as producer:
            for i in range(100):
                producer.publish(topic, f"before-{i}".encode(), sharding_key=f"k{i}")
        out = tmp_path / "out"
        out.mkdir()
        query = (
            spark.readStream.format("nsq")
            .option("lookupd", dev.lookupd_http)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(_collect_to(out))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="1 second")
            .start()
        )
        try:
            _wait(query, lambda: len(_rows(out)) >= 100, timeout=240)
            asyncio.run(admin(3))
            with Producer(lookupd=dev.lookupd_http, trace=True) as producer:  # offsets back
                placed = [
                    producer.publish(topic, f"after-{i}".encode(), sharding_key=f"k{i}")
                    for i in range(100)
                ]
            on_new = sorted(r.offset for r in placed if r.partition == 2)
            assert on_new, "no key went to the new partition"
            _wait(query, lambda: len(_rows(out)) >= 200, timeout=240)
        finally:
            query.stop()

    rows = _rows(out)
    bodies = sorted(str(r["body"]) for r in rows)
    assert bodies == sorted(
        [f"before-{i}" for i in range(100)] + [f"after-{i}" for i in range(100)]
    )
    new = sorted(int(r["offset"]) for r in rows if r["partition"] == 2)  # type: ignore[call-overload]
    assert new == on_new  # from the partition's first message, every one once
    assert new[0] == 0
