"""The batch sink's Arrow path: which writer a DataFrame gets, and the rows it makes of Arrow
record batches (valued as Spark's own rows are, for the columns the sink reads)."""

from __future__ import annotations

import decimal

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install -e '.[spark]'")

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    DecimalType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from nsq_ha.spark.options import parse_write_options
from nsq_ha.spark.sink import writers
from nsq_ha.spark.sink.writers import (
    NsqArrowWriter,
    NsqStreamArrowWriter,
    NsqStreamWriter,
    NsqWriter,
    arrow_rows,
    batch_writer,
    stream_writer,
)

L = "http://127.0.0.1:1"


def _schema(**columns: object) -> StructType:
    return StructType([StructField(name, kind, True) for name, kind in columns.items()])  # type: ignore[arg-type]


def _writer(raw: dict[str, str], schema: StructType, *, stream: bool = False) -> NsqWriter:
    """(The topic comes from a ``topic`` column: no lookup when the writer is made.)"""
    schema = StructType([*schema.fields, StructField("topic", StringType(), True)])
    opts = parse_write_options({"lookupd": L, **raw}, schema.fieldNames())
    return stream_writer(opts, schema) if stream else batch_writer(opts, schema)  # type: ignore[return-value]


def test_plain_columns_get_the_arrow_writer() -> None:
    schema = _schema(body=BinaryType(), key=StringType(), n=IntegerType(), d=DecimalType(10, 2))
    writer = _writer({"keyColumn": "key", "extColumns": "n,d"}, schema)
    assert type(writer) is NsqArrowWriter


@pytest.mark.parametrize(
    "kind", [TimestampType(), BinaryType(), MapType(StringType(), StringType())]
)
def test_an_ext_column_that_reads_differently_from_arrow_keeps_the_row_writer(kind: object) -> None:
    schema = _schema(body=BinaryType(), x=kind)
    writer = _writer({"extColumns": "x"}, schema)
    assert type(writer) is NsqWriter


def test_streaming_gets_the_arrow_writer_where_pyspark_has_one() -> None:
    plain = _schema(body=BinaryType(), n=IntegerType())
    writer = _writer({"extColumns": "n"}, plain, stream=True)
    if writers._STREAM_ARROW is None:  # PySpark 4.0: no DataSourceStreamArrowWriter
        assert type(writer) is NsqStreamWriter
    else:
        assert type(writer) is NsqStreamArrowWriter
        assert isinstance(writer, writers._STREAM_ARROW)
    stamped = _writer(
        {"extColumns": "t"}, _schema(body=BinaryType(), t=TimestampType()), stream=True
    )
    assert type(stamped) is NsqStreamWriter


def test_arrow_rows_hold_the_used_columns_valued_like_spark_rows() -> None:
    headers = pa.array([[("a", "1")], None, []], type=pa.map_(pa.string(), pa.string()))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([b"x", b"y", b"z"], type=pa.binary()),
            pa.array(["k1", None, "k3"]),
            headers,
            pa.array([1, 2, 3], type=pa.int32()),
            pa.array(
                [decimal.Decimal("1.50"), None, decimal.Decimal("0.00")], pa.decimal128(10, 2)
            ),
        ],
        names=["body", "key", "headers", "unused", "d"],
    )
    rows = list(arrow_rows(iter([batch, batch.slice(0, 1)]), ["body", "key", "headers", "d"]))
    assert rows == [
        {"body": b"x", "key": "k1", "headers": {"a": "1"}, "d": decimal.Decimal("1.50")},
        {"body": b"y", "key": None, "headers": None, "d": None},
        {"body": b"z", "key": "k3", "headers": {}, "d": decimal.Decimal("0.00")},
        {"body": b"x", "key": "k1", "headers": {"a": "1"}, "d": decimal.Decimal("1.50")},
    ]
