"""The source's ``headers`` and ``key`` columns on real servers: the embedded cluster and the
real fork (same test, both backends).

* on an ext topic, ``headers`` is the ext header as a map of strings and ``key`` the field
  ``keyHeader`` names (``nsq_key`` by default), through a Spark batch read and through the
  driver source's reader;
* on a topic without ext headers, ``headers`` is null and ``key`` comes from the JSON body's
  field ``keyBodyField`` names (null without the option);
* a driver-mode stream hands Spark the same map (through Spark's own row conversion).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from nsq_ha.admin import LookupdAdmin  # noqa: E402
from nsq_ha.devcluster import DevClusterThread  # noqa: E402
from nsq_ha.spark.compat import DRIVER_STREAM_CONTROL, pyspark_version, supports  # noqa: E402
from nsq_ha.spark.options import parse_read_options  # noqa: E402
from nsq_ha.spark.source.driver_reader import DriverReader  # noqa: E402
from nsq_ha.sync import Producer  # noqa: E402

from .spark_session import local_spark  # noqa: E402

pytestmark = pytest.mark.spark

COUNT = 60
USERS = ("ann", "bob", "cy")


def _ext(i: int) -> dict[str, Any]:
    """The ext header of message ``i``: strings, a number, a nested object (not every message
    has the key field)."""
    header: dict[str, Any] = {"user": USERS[i % 3], "n": i, "tags": {"a": [i]}}
    if i % 2 == 0:
        header["nsq_key"] = f"k{i % 5}"
    return header


def _plain_body(i: int) -> bytes:
    if i % 4 == 3:
        return f"not json {i}".encode()  # no key to find
    return json.dumps({"user": USERS[i % 3] if i % 4 else i, "i": i}).encode()


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark("nsq_ha-rows", "local[2]") as session:
        yield session


@pytest.fixture(scope="module", params=["devcluster", "fork"])
def topics(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, str]]:
    """lookupd, an ext topic and a plain topic (2 partitions each), filled."""
    ext, plain = f"sr_ext_{secrets.token_hex(3)}", f"sr_plain_{secrets.token_hex(3)}"

    def fill(lookupd: str) -> None:
        async def create() -> None:
            async with LookupdAdmin(lookupd) as admin:
                await asyncio.gather(
                    admin.create_topic(ext, partitions=2, replicas=1, ext=True),
                    admin.create_topic(plain, partitions=2, replicas=1),
                )
                for topic in (ext, plain):
                    await admin.create_channel(topic, "spark", rewind=True)

        asyncio.run(create())
        with Producer(lookupd=lookupd) as producer:
            for i in range(COUNT):
                producer.publish(ext, f"e{i}".encode(), ext=_ext(i), partition=i % 2)
            producer.publish_many(plain, [_plain_body(i) for i in range(COUNT)])

    if request.param == "devcluster":
        with DevClusterThread(nodes=2) as dev:
            fill(dev.lookupd_http)
            yield dev.lookupd_http, ext, plain
    else:
        fork = request.getfixturevalue("fork_cluster")
        fill(fork.lookupd_http)
        yield fork.lookupd_http, ext, plain


def _want_ext(i: int, key_header: str) -> tuple[str | None, dict[str, str]]:
    header = _ext(i)
    key = header.get(key_header)
    strings = {k: v if isinstance(v, str) else json.dumps(v) for k, v in header.items()}
    return (key if isinstance(key, str) else None), strings


def _want_plain_key(i: int) -> str | None:
    if i % 4 == 3:
        return None
    return USERS[i % 3] if i % 4 else str(i)


def _read(spark: SparkSession, lookupd: str, topic: str, **options: str) -> list[Any]:
    reader = spark.read.format("nsq").option("lookupd", lookupd).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load().select("body", "key", "headers").collect()


@pytest.mark.parametrize("key_header", [None, "user"])
def test_a_batch_read_of_an_ext_topic_has_its_headers_and_key(
    spark: SparkSession, topics: tuple[str, str, str], key_header: str | None
) -> None:
    lookupd, ext, _ = topics
    options = {} if key_header is None else {"keyHeader": key_header}
    rows = _read(spark, lookupd, ext, **options)
    assert len(rows) == COUNT
    for row in rows:
        i = int(bytes(row["body"])[1:])
        key, headers = _want_ext(i, key_header or "nsq_key")
        assert row["key"] == key, i
        assert row["headers"] == headers, i


def test_a_batch_read_of_a_plain_topic_takes_the_key_from_the_body_when_asked(
    spark: SparkSession, topics: tuple[str, str, str]
) -> None:
    lookupd, _, plain = topics
    without = _read(spark, lookupd, plain)
    assert len(without) == COUNT
    assert {(r["key"], r["headers"]) for r in without} == {(None, None)}
    rows = _read(spark, lookupd, plain, keyBodyField="user")
    got = {}
    for row in rows:
        body = bytes(row["body"])
        i = int(body.split()[-1]) if body.startswith(b"not") else json.loads(body)["i"]
        got[i] = row["key"]
        assert row["headers"] is None
    assert got == {i: _want_plain_key(i) for i in range(COUNT)}


def test_the_driver_sources_rows_have_the_same_headers_and_key(
    topics: tuple[str, str, str], tmp_path: Path
) -> None:
    lookupd, ext, plain = topics
    for topic, more in ((ext, {"keyHeader": "user"}), (plain, {"keyBodyField": "user"})):
        opts = parse_read_options(
            {
                "lookupd": lookupd,
                "topic": topic,
                "mode": "driver",
                "channel": "spark",
                "walPath": str(tmp_path / topic),
                "pollTimeout": "5",
                **more,
            }
        )
        reader = DriverReader(opts, "spark")
        rows: list[tuple[Any, ...]] = []
        try:
            for seq in range(1, 20):
                rows += reader.read(seq)
                if len(rows) >= COUNT:
                    break
            reader.commit(seq)
            replayed = list(reader.replay(seq, seq))
        finally:
            reader.close()
        assert len(rows) == COUNT
        assert replayed == rows[-len(replayed) :]  # the WAL gives the same rows back
        for row in rows:
            body = bytes(row[10])
            if topic == ext:
                key, headers = _want_ext(int(body[1:]), "user")
                assert (row[9], row[11]) == (key, headers)
            else:
                i = int(body.split()[-1]) if body.startswith(b"not") else json.loads(body)["i"]
                assert (row[9], row[11]) == (_want_plain_key(i), None)


@pytest.mark.skipif(
    not supports(DRIVER_STREAM_CONTROL),
    reason=f"PySpark {pyspark_version()}: availableNow in mode=driver needs 4.2+",
)
def test_a_driver_mode_stream_hands_spark_the_headers_map(
    spark: SparkSession, topics: tuple[str, str, str], tmp_path: Path
) -> None:
    """The driver source's rows go through Spark's own conversion (a dict for the map)."""
    lookupd, ext, _ = topics
    out = tmp_path / "out"
    out.mkdir()

    def collect(batch: DataFrame, batch_id: int) -> None:
        rows = [(bytes(r["body"]).decode(), r["key"], r["headers"]) for r in batch.collect()]
        (out / f"{batch_id}.json").write_text(json.dumps(rows))

    reader = spark.readStream.format("nsq")
    options = {
        "lookupd": lookupd,
        "topic": ext,
        "mode": "driver",
        "channel": "spark_stream",  # a channel of its own, started at the beginning below
        "walPath": str(tmp_path / "checkpoint" / "wal"),
        "keyHeader": "user",
        "pollTimeout": "3",
    }
    asyncio.run(_rewound_channel(lookupd, ext, "spark_stream"))
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .select("body", "key", "headers")
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "the availableNow query did not stop by itself"
    finally:
        query.stop()
    rows = [row for path in out.glob("*.json") for row in json.loads(path.read_text())]
    assert len(rows) == COUNT
    for body, key, headers in rows:
        want_key, want_headers = _want_ext(int(body[1:]), "user")
        assert (key, headers) == (want_key, want_headers), body


async def _rewound_channel(lookupd: str, topic: str, channel: str) -> None:
    async with LookupdAdmin(lookupd) as admin:
        await admin.create_channel(topic, channel, rewind=True)
