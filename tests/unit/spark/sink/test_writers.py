"""The batch sink's Arrow path: which writer a DataFrame gets (the rows it reads of Arrow
record batches: tests/unit/spark/sink/test_arrow.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install -e '.[spark]'")

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
