"""Source rows as Arrow record batches: one per chunk a range read hands over, built column by
column (Spark's own conversion of Python tuples calls a converter per value of every row)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .compat import to_arrow_schema
from .rows import RowFormat, ext_fields, signed64

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["arrow_schema", "record_batch", "row_type"]


def row_type() -> StructType:
    """The source's row schema (:data:`~nsq_ha.spark.rows.SCHEMA`) as a StructType, built
    without a JVM (executors have none to parse DDL with)."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    string, integer, long = StringType(), IntegerType(), LongType()
    columns = [
        ("topic", string),
        ("partition", integer),
        ("offset", long),
        ("raw_size", long),
        ("id", string),
        ("trace_id", long),
        ("attempts", integer),
        ("timestamp", TimestampType()),
        ("ext", string),
        ("key", string),
        ("body", BinaryType()),
        ("headers", MapType(string, string)),  # as the DDL says: values may be null
    ]
    return StructType([StructField(name, kind, True) for name, kind in columns])


def arrow_schema() -> pa.Schema:
    """The Arrow schema Spark expects for the source's rows from a Python data source (UTC
    timestamps), as PySpark itself derives it (the keyword differs between versions)."""
    return to_arrow_schema(row_type())


def record_batch(
    topic: str, messages: Sequence[Any], schema: pa.Schema, fmt: RowFormat | None = None
) -> pa.RecordBatch:
    """``messages`` of ``topic`` as one record batch of the source's row schema (``topic,
    partition, offset, raw_size, id, trace_id, attempts, timestamp, ext, key, body,
    headers``)."""
    import pyarrow as pa

    fmt = fmt or RowFormat()
    exts: list[str | None] = []
    keys: list[str | None] = []
    headers: list[list[tuple[str, str]] | None] = []
    bodies = [bytes(m.body) for m in messages]
    for message, body in zip(messages, bodies, strict=True):
        ext, key, header = ext_fields(message.ext_data, body, fmt)
        exts.append(ext)
        keys.append(key)
        headers.append(None if header is None else list(header.items()))
    columns = [
        [topic] * len(messages),
        [m.partition for m in messages],
        [m.offset for m in messages],
        [m.raw_size for m in messages],
        [bytes(m.id).hex() for m in messages],
        [signed64(m.trace_id) for m in messages],
        [m.attempts for m in messages],
        [m.timestamp // 1000 for m in messages],  # ns -> us
        exts,
        keys,
        bodies,
        headers,
    ]
    arrays = [
        pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
