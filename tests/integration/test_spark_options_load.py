"""A bad option of the ``nsq`` source fails at ``load()``, in our words, for a stream as for a
batch read: a mistyped or Kafka-named option, and a bad value of one that both kinds of read
take. Spark hands option keys lower-cased and wraps our ``OptionError`` in its own exception;
the test looks for our message in its text. (Given a schema, Spark calls no Python at
``load()``: the options are then checked when the read starts.) Nothing here reaches a server:
the options are refused, or for the valid ones only parsed, before any connection. Marked
``spark``."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.errors import PySparkException  # noqa: E402
from pyspark.sql import DataFrameReader, SparkSession  # noqa: E402
from pyspark.sql.streaming.readwriter import DataStreamReader  # noqa: E402

from .spark_session import local_spark  # noqa: E402

pytestmark = pytest.mark.spark

#: never contacted: loading only parses the options
LOOKUPD = "http://127.0.0.1:4161"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark("nsq_ha-options-load", "local[1]") as session:
        yield session


def _reader(spark: SparkSession, kind: str) -> DataFrameReader | DataStreamReader:
    reader = spark.readStream if kind == "stream" else spark.read
    return reader.format("nsq").option("lookupd", LOOKUPD)


@pytest.mark.parametrize("kind", ["stream", "batch"])
@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param(
            {"topic": "t", "startingOffsets": "bogus"},
            r"option 'startingOffsets' must be latest, earliest or a JSON object",
            id="bad-value",
        ),
        pytest.param({"topc": "t"}, r"unknown option 'topc' .*did you mean 'topic'\?", id="typo"),
        pytest.param(
            {"subscribe": "t"}, r"'subscribe' is Kafka's option: use 'topics'", id="kafka-name"
        ),
        pytest.param(
            {"topic": "t", "maxOffsetsPerTrigger": "10"},
            r"'maxOffsetsPerTrigger' is Kafka's option: use 'maxBytesPerTrigger', which counts "
            "bytes",
            id="kafka-limit",
        ),
    ],
)
def test_a_bad_read_option_fails_at_load_with_our_message(
    spark: SparkSession, kind: str, options: dict[str, str], message: str
) -> None:
    reader = _reader(spark, kind).options(**options)
    with pytest.raises(PySparkException) as caught:
        reader.load()
    assert re.search(message, str(caught.value)), str(caught.value)


def test_good_options_load_for_a_stream_and_a_batch_read(spark: SparkSession) -> None:
    """What only one kind of read refuses is left for it: ``endingOffsets`` loads (a batch
    read takes it), ``mode=driver`` loads (a stream takes it)."""
    stream = (
        _reader(spark, "stream")
        .option("topic", "t")
        .option("mode", "driver")
        .option("channel", "c")
        .load()
    )
    assert stream.isStreaming
    batch = _reader(spark, "batch").option("topics", "a,b").option("endingOffsets", "latest")
    assert batch.load("ignored_path").columns[:3] == ["topic", "partition", "offset"]
