"""Source rows as Arrow record batches: one per chunk a range read hands over, built column by
column (Spark's own conversion of Python tuples calls a converter per value of every row)."""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..compat import to_arrow_schema
from ..rows import RowFormat, ext_fields, signed64

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from ...protocol.message import DecodedMessage

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
    topic: str,
    messages: Sequence[Any],
    schema: pa.Schema,
    fmt: RowFormat | None = None,
    *,
    partition: int | None = None,
) -> pa.RecordBatch:
    """``messages`` of ``topic`` as one record batch of the source's row schema (``topic,
    partition, offset, raw_size, id, trace_id, attempts, timestamp, ext, key, body,
    headers``).

    Messages of one ``partition`` (a range read's) without ext headers, when no key is taken
    from the body, are converted column by column from their decoded frames
    (:func:`_plain_batch`); the rest message by message."""
    import pyarrow as pa

    fmt = fmt or RowFormat()
    if partition is not None and fmt.key_body_field is None and messages:
        try:
            frames = [m.decoded for m in messages]
        except AttributeError:  # not the consumer's messages: below
            pass
        else:
            plain = _plain_batch(topic, partition, frames, schema)
            if plain is not None:
                return plain
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


#: bytes in a message id (the fork's and vanilla's), 32 characters in hex
_ID_BYTES = 16


def _plain_batch(
    topic: str, partition: int, frames: Sequence[DecodedMessage], schema: pa.Schema
) -> pa.RecordBatch | None:
    """The record batch of one partition's decoded frames, each column converted at once
    (the frames transposed by ``zip``, the ids hex-encoded in one call, the trace ids and
    timestamps converted by Arrow); None if a frame has an ext header or an id that is not
    16 bytes (:func:`record_batch` converts those message by message)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    (timestamps, attempts, ids, bodies, _, trace_ids, _, ext_data, offsets, raw_sizes) = zip(
        *frames, strict=True
    )
    count = len(frames)
    joined = b"".join(ids)
    if any(ext_data) or len(joined) != _ID_BYTES * count:
        return None
    types = [field.type for field in schema]
    width = 2 * _ID_BYTES
    id_column = pa.StringArray.from_buffers(
        count,
        pa.py_buffer(array.array("i", range(0, width * count + 1, width))),
        pa.py_buffer(joined.hex().encode("ascii")),
    )
    micros = pc.divide(pa.array(timestamps, pa.int64()), 1000)  # ns -> us (positive: floor)
    columns = [
        pa.array([topic] * count, types[0]),
        pa.array([partition] * count, types[1]),
        pa.array(offsets, types[2]),
        pa.array(raw_sizes, types[3]),
        id_column,
        pa.array(trace_ids, pa.uint64()).cast(types[5], safe=False),  # u64 as Java's long
        pa.array(attempts, types[6]),
        micros.cast(types[7]),
        pa.nulls(count, types[8]),
        pa.nulls(count, types[9]),
        pa.array(bodies, types[10]),
        pa.nulls(count, types[11]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
