"""The sink's Arrow writer without Spark (the record batches Spark hands a task), on the
embedded broker and on the real fork: rows with nothing but a body and a key are read by column
and published in a few large calls, each key's rows on the key's partition in row order; a
batch with a value the row path refuses still fails naming the row."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow", reason="the spark extra is not installed")
pytest.importorskip("pyspark", reason="the spark extra is not installed")

from pyspark.sql.types import BinaryType, StringType, StructField, StructType  # noqa: E402

from nsq_ha.admin import TopicSpec  # noqa: E402
from nsq_ha.errors import ConfigError  # noqa: E402
from nsq_ha.routing import get_strategy  # noqa: E402
from nsq_ha.spark.sink.writers import NsqArrowWriter, batch_writer, write_options  # noqa: E402
from nsq_ha.sync import Consumer  # noqa: E402

from .backend import Backend  # noqa: E402

TOPIC = "sa_keyed"  # 4 partitions
PARTITIONS = 4
KEYS = 40
SCHEMA = StructType([StructField("body", BinaryType()), StructField("key", StringType())])


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics([TopicSpec(TOPIC, partitions=PARTITIONS)])
    return backend


def _batches(rows: int, per: int, *, tag: str) -> list[Any]:
    """Record batches as Spark's Arrow writer sends them: ``body`` binary, ``key`` string."""
    batches = []
    for lo in range(0, rows, per):
        numbers = range(lo, min(lo + per, rows))
        bodies = pa.array([f"{tag}-{i:06d}".encode() for i in numbers])
        batches.append(pa.record_batch({"body": bodies, "key": [f"k{i % KEYS}" for i in numbers]}))
    return batches


def _writer(cluster: Backend, **extra: str) -> NsqArrowWriter:
    options = {"lookupd": cluster.lookupd_http, "topic": TOPIC, "keyColumn": "key", **extra}
    writer = batch_writer(write_options(options, SCHEMA), SCHEMA)
    assert isinstance(writer, NsqArrowWriter)
    return writer


def test_plain_keyed_batches_go_in_few_calls_each_key_in_order_on_its_partition(
    cluster: Backend,
) -> None:
    rows, per = 6000, 2500
    with Consumer(TOPIC, "sa_check", lookupd=cluster.lookupd_http, max_in_flight=500) as consumer:
        message = _writer(cluster).write(iter(_batches(rows, per, tag="a")))
        assert message.published == message.rows == rows
        # one call per record batch (each under maxPending / 2 rows), not one per maxBatch rows
        assert message.calls == -(-rows // per)
        strategy = get_strategy("murmur3")
        seen: dict[str, list[str]] = defaultdict(list)
        partitions: dict[str, set[int]] = defaultdict(set)
        for _ in range(rows):
            got = consumer.get(timeout=30)
            assert got is not None, f"{sum(map(len, seen.values()))} of {rows} arrived"
            body = bytes(got.body).decode()
            index = int(body.split("-")[1])
            key = f"k{index % KEYS}"
            seen[key].append(body)
            assert got.partition is not None
            partitions[key].add(got.partition)
            got.finish()
    for key, bodies in seen.items():
        assert bodies == sorted(bodies), f"{key}'s rows out of order"
        assert partitions[key] == {strategy.partition(key, PARTITIONS)}


@pytest.mark.parametrize(
    ("body", "key", "message"),
    [
        (b"", "k", r"row 3: the body column 'body' is empty"),
        (None, "k", r"row 3: the body column 'body' is null"),
        (b"x", None, r"row 3: the key column 'key' is None; keys must be set"),
    ],
)
def test_a_batch_the_row_path_refuses_fails_naming_the_row(
    cluster: Backend, body: bytes | None, key: str | None, message: str
) -> None:
    bodies: list[bytes | None] = [b"ok"] * 5
    keys: list[str | None] = ["k"] * 5
    bodies[3], keys[3] = body, key
    batch = pa.record_batch(
        {"body": pa.array(bodies, pa.binary()), "key": pa.array(keys, pa.string())}
    )
    with pytest.raises(ConfigError, match=message):
        _writer(cluster).write(iter([batch]))
