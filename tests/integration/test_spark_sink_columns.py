"""The ``nsq`` sink's ``topic``, ``partition`` and ``headers`` columns (as Spark's Kafka sink
has them), on Spark ``local[2]`` against the embedded cluster and the real fork cluster (same
test, both backends), and against real vanilla nsqd:

* one write reaches two topics by the topic column, every row on its own topic, each key's
  rows on its partition in row order per (topic, key);
* the partition column puts rows on the partitions it names (a null falls back to the key),
  keeping each partition's rows in row order;
* the headers map arrives in the ext header of an ext topic (the key ``nsq_key`` wins a clash)
  while the same write's rows for a plain topic carry no header: ext topics are told apart per
  topic, inside the task;
* the errors: a null topic, a partition the topic does not have, headers for a topic without
  ext headers, a partition on vanilla nsqd, no topic at all, a headers column of a wrong type.

Rows are read back with the client's own consumer.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from nsq_ha.admin import LookupdAdmin  # noqa: E402
from nsq_ha.devcluster import DevClusterThread  # noqa: E402
from nsq_ha.routing import partition_for_key  # noqa: E402

from .spark_session import consume_stored, local_spark  # noqa: E402

pytestmark = pytest.mark.spark

ROWS = 2000
KEYS = 20
CHECK = "check"
ORDERED = {"partitions": 4, "replicas": 2, "ordered": True}
TOPICS: dict[str, dict[str, Any]] = {
    "a": ORDERED,
    "b": ORDERED,
    "placed": ORDERED,
    "ext": {"partitions": 4, "replicas": 2, "ext": True, "multi_part": True},
    "plain": {"partitions": 4, "replicas": 2, "multi_part": True},
    "errors": {"partitions": 4, "replicas": 2, "multi_part": True},
}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark("nsq_ha-sink-columns", "local[2]") as session:
        yield session


async def _create(lookupd: str, topics: list[tuple[str, dict[str, Any]]]) -> None:
    """All topics at once (a new fork topic takes seconds to become writable), each with the
    channel ``CHECK`` at its start."""
    async with LookupdAdmin(lookupd) as admin:
        await asyncio.gather(*(admin.create_topic(name, **spec) for name, spec in topics))
        for name, _ in topics:
            await admin.create_channel(name, CHECK, rewind=True)


@pytest.fixture(scope="module", params=["devcluster", "fork"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, str]]]:
    """The embedded cluster or the real fork cluster's lookupd, and this module's topics."""
    names = {kind: f"sc_{kind}_{secrets.token_hex(3)}" for kind in TOPICS}
    spec = [(names[k], TOPICS[k]) for k in TOPICS]
    if request.param == "devcluster":
        with DevClusterThread(nodes=3) as dev:
            asyncio.run(_create(dev.lookupd_http, spec))
            yield dev.lookupd_http, names
    else:
        fork = request.getfixturevalue("fork_cluster")
        asyncio.run(_create(fork.lookupd_http, spec))
        yield fork.lookupd_http, names


def _consume(topic: str, count: int, limit: float = 120, **where: Any) -> list[Any]:
    """Every stored message of ``topic`` on ``CHECK`` (see :func:`consume_stored`)."""
    return asyncio.run(consume_stored(topic, CHECK, count, limit, **where))


def _rows(spark: SparkSession, count: int = ROWS) -> DataFrame:
    """``seq``, ``user`` and ``payload`` = ``user:seq``, in one Spark partition in seq order
    (so that every key's rows are in one task, in order)."""
    df = spark.range(0, count, 1, 1).select(
        F.col("id").alias("seq"),
        F.concat(F.lit("k"), (F.col("id") % KEYS).cast("string")).alias("user"),
    )
    return df.withColumn("payload", F.concat_ws(":", "user", F.col("seq").cast("string")))


def _write(df: DataFrame, **options: str) -> None:
    writer = df.write.format("nsq").mode("append").option("bodyColumn", "payload")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def _in_key_order(messages: list[Any]) -> dict[str, set[int]]:
    """Assert each key's messages come in seq order; return each key's partitions."""
    last: dict[str, int] = {}
    partitions: dict[str, set[int]] = defaultdict(set)
    for message in messages:
        user, seq = message.body.decode().split(":")
        assert int(seq) > last.get(user, -1), f"{user}: {seq} after {last[user]}"
        last[user] = int(seq)
        partitions[user].add(message.partition)
    return partitions


# -- the topic column ---------------------------------------------------------------------------


def test_one_write_reaches_two_topics_by_the_topic_column_in_key_order(
    spark: SparkSession, backend: tuple[str, dict[str, str]]
) -> None:
    lookupd, names = backend
    a, b = names["a"], names["b"]
    # runs of 7 rows alternate between the topics: every chunk holds both
    df = _rows(spark).withColumn(
        "topic", F.when((F.col("seq") / 7).cast("int") % 2 == 0, a).otherwise(b)
    )
    _write(df, lookupd=lookupd, keyColumn="user")
    expected: dict[str, set[str]] = {a: set(), b: set()}
    for seq in range(ROWS):
        expected[a if (seq // 7) % 2 == 0 else b].add(f"k{seq % KEYS}:{seq}")
    for topic in (a, b):
        messages = _consume(topic, len(expected[topic]), lookupd=lookupd)
        bodies = [m.body.decode() for m in messages]
        assert len(bodies) == len(set(bodies))
        assert set(bodies) == expected[topic], f"{topic}: rows missing or misplaced"
        for user, parts in _in_key_order(messages).items():
            assert parts == {partition_for_key(user, 4)}, f"{topic} {user} on {parts}"


# -- the partition column -----------------------------------------------------------------------


def test_the_partition_column_places_rows_and_a_null_falls_back_to_the_key(
    spark: SparkSession, backend: tuple[str, dict[str, str]]
) -> None:
    lookupd, names = backend
    topic = names["placed"]
    # every 5th row has no partition (its key's); the others name one, the key notwithstanding
    df = _rows(spark).withColumn(
        "partition",
        F.when(F.col("seq") % 5 == 0, F.lit(None)).otherwise((F.col("seq") % 3).cast("int")),
    )
    _write(df, lookupd=lookupd, topic=topic, keyColumn="user")
    messages = _consume(topic, ROWS, lookupd=lookupd)
    assert len(messages) == ROWS
    last: dict[int, int] = {}
    for message in messages:
        user, seq = message.body.decode().split(":")
        n = int(seq)
        want = partition_for_key(user, 4) if n % 5 == 0 else n % 3
        assert message.partition == want, f"{user}:{seq} on {message.partition}, not {want}"
        assert n > last.get(want, -1), f"partition {want}: {n} after {last[want]}"
        last[want] = n


# -- the headers column -------------------------------------------------------------------------


def test_headers_arrive_in_the_ext_header_of_ext_topics_only(
    spark: SparkSession, backend: tuple[str, dict[str, str]]
) -> None:
    lookupd, names = backend
    ext, plain = names["ext"], names["plain"]
    count = 400
    to_ext = F.col("seq") % 2 == 0
    headers = F.create_map(
        F.lit("origin"),
        F.concat(F.lit("h"), F.col("seq").cast("string")),
        F.lit("nsq_key"),
        F.lit("from-the-map"),  # the sink's own key field wins this clash
    )
    df = (
        _rows(spark, count)
        .withColumn("topic", F.when(to_ext, ext).otherwise(plain))
        .withColumn(
            "headers",
            F.when(to_ext, headers)
            # the plain topic's rows: null or empty maps, which carry nothing
            .when(F.col("seq") % 4 == 1, F.lit(None).cast("map<string,string>"))
            .otherwise(F.create_map().cast("map<string,string>")),
        )
    )
    _write(df, lookupd=lookupd, keyColumn="user")
    got_ext = _consume(ext, count // 2, lookupd=lookupd)
    assert len(got_ext) == count // 2
    for message in got_ext:
        user, seq = message.body.decode().split(":")
        assert message.ext == {"origin": f"h{seq}", "nsq_key": user}
    got_plain = _consume(plain, count // 2, lookupd=lookupd)
    assert len(got_plain) == count // 2
    assert all(not m.ext_data for m in got_plain), "a plain topic's message has a header"


# -- errors -------------------------------------------------------------------------------------


def _fails(df: DataFrame, text: str, **options: str) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - Spark wraps the task's error
        _write(df, **options)
    assert text in str(caught.value), str(caught.value)[:3000]


def test_bad_topic_partition_and_headers_values_fail_the_write_naming_the_row(
    spark: SparkSession, backend: tuple[str, dict[str, str]]
) -> None:
    lookupd, names = backend
    topic = names["errors"]
    rows = _rows(spark, 10)
    at_3 = F.col("seq") == 3
    null_topic = rows.withColumn("topic", F.when(at_3, F.lit(None)).otherwise(F.lit(topic)))
    _fails(null_topic, "row 3: the topic column 'topic' is null", lookupd=lookupd)
    bad_partition = rows.withColumn("partition", F.when(at_3, 9).otherwise(F.lit(None)))
    _fails(
        bad_partition,
        f"row 3: the partition column 'partition' is 9, but topic '{topic}' has partitions 0..3",
        lookupd=lookupd,
        topic=topic,
    )
    headers = rows.withColumn(
        "headers",
        F.when(at_3, F.create_map(F.lit("a"), F.lit("b"))).otherwise(
            F.lit(None).cast("map<string,string>")
        ),
    )
    _fails(
        headers,
        f"row 3: the headers column 'headers' has 1 header(s), but topic '{topic}' "
        "is not an ext topic",
        lookupd=lookupd,
        topic=topic,
    )
    _fails(rows, "option 'topic' is required, or a column naming each row's topic", lookupd=lookupd)
    wrong_type = rows.withColumn("headers", F.lit("a=b"))
    _fails(
        wrong_type,
        "the column 'headers' (option 'headersColumn') must be map<string,string>",
        lookupd=lookupd,
        topic=topic,
    )
    # nothing of these writes was published
    assert _consume(topic, 0, limit=3, lookupd=lookupd) == []


# -- vanilla nsqd -------------------------------------------------------------------------------


def test_vanilla_takes_a_topic_column_but_refuses_a_partition(
    spark: SparkSession, vanilla_cluster: Any
) -> None:
    nsqd = vanilla_cluster.nodes[0].tcp_address
    one, two = (f"sc_vanilla_{i}_{secrets.token_hex(3)}" for i in (1, 2))
    rows = _rows(spark, 20)
    placed = rows.withColumn("partition", F.when(F.col("seq") == 4, 1).otherwise(F.lit(None)))
    _fails(
        placed,
        f"row 4: the partition column 'partition' is 1, but topic '{one}' is on vanilla nsqd, "
        "which has no partitions",
        nsqd=nsqd,
        topic=one,
    )
    # null partitions and the topic column: both topics get their rows
    routed = rows.withColumn("topic", F.when(F.col("seq") % 2 == 0, one).otherwise(two)).withColumn(
        "partition", F.lit(None).cast("int")
    )
    _write(routed, nsqd=nsqd)
    for topic, parity in ((one, 0), (two, 1)):
        bodies = {m.body.decode() for m in _consume(topic, 10, limit=60, nsqd=nsqd)}
        assert bodies == {f"k{s % KEYS}:{s}" for s in range(20) if s % 2 == parity}
