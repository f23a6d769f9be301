"""Spark's floor for the ``nsq`` source's reads: a Python data source (``nsq_floor``) whose
tasks yield the rows a read of the fork's 4 partitions would, from memory, with no NSQ at all.

Same schema (the source's, given as the option ``schema``), 100-byte bodies, one Arrow record
batch per :data:`CHUNK` rows as the source's range reads hand Spark, ``rows`` rows in all,
spread over 4 partitions (one Spark task each) as the bench publishes them. A stream read
(``readStream``, ``availableNow``) plans them as one micro-batch, as the ``nsq`` source does
with all its rows there at the start; a batch read (``spark.read``) as one read.

So a Spark read of the ``nsq`` source at this rate would cost nothing beyond PySpark itself:
the JVM's planning and scheduling, the Python workers, the Arrow batches' way to the JVM and
on into the sink. PySpark 4.2 or later (``SupportsTriggerAvailableNow``). Only PySpark and
pyarrow are imported: Spark's Python processes load this module, and the floor should not pay
for the client's imports.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

__all__ = ["CHUNK", "NAME", "FloorSource", "shares"]

#: the data source's name (``format("nsq_floor")``)
NAME = "nsq_floor"
#: rows per Arrow batch (the most a range read of the ``nsq`` source hands Spark at once)
CHUNK = 4096
#: partitions read, one Spark task each
PARTITIONS = 4
#: bytes in a body
SIZE = 100


def shares(rows: int, partitions: int = PARTITIONS) -> list[int]:
    """``rows`` spread over ``partitions`` as the bench publishes them (the first ones one more)."""
    return [rows // partitions + (p < rows % partitions) for p in range(partitions)]


class FloorSource(DataSource):
    """``format("nsq_floor")``: options ``rows`` (how many in all) and ``schema`` (the DDL of
    the rows, the ``nsq`` source's)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return str(self.options["schema"])

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(int(self.options["rows"]), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(int(self.options["rows"]), schema)


class _BatchReader(DataSourceReader):
    def __init__(self, rows: int, schema: StructType) -> None:
        self.rows, self.schema = rows, schema

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition((p, n)) for p, n in enumerate(shares(self.rows)) if n]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _batches(self.schema, *partition.value)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are the rows read of each partition: all of them are there at the start."""

    def __init__(self, rows: int, schema: StructType) -> None:
        self.rows, self.schema = rows, schema

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def initialOffset(self) -> dict[str, Any]:
        return {str(p): 0 for p in range(PARTITIONS)}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        return {str(p): n for p, n in enumerate(shares(self.rows))}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        todo = ((int(p), int(end[p]) - int(start.get(p, 0))) for p in sorted(end))
        return [InputPartition((p, n)) for p, n in todo if n > 0]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _batches(self.schema, *partition.value)

    def commit(self, end: dict[str, Any]) -> None:
        return None


def _batches(schema: StructType, partition: int, rows: int) -> Iterator[Any]:
    """``rows`` rows of ``partition`` in record batches of up to :data:`CHUNK` rows: one batch
    built once, then handed out again (sliced for the last)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema, timezone="UTC")
    types = [field.type for field in arrow]
    size = min(rows, CHUNK)
    columns = [
        pa.array(["bench_floor"] * size, types[0]),
        pa.array([partition] * size, types[1]),
        pa.array(range(0, size * 130, 130), types[2]),  # offset: 130 bytes a message
        pa.array([130] * size, types[3]),
        pa.array([f"{i:032x}" for i in range(size)], types[4]),
        pa.array([0] * size, types[5]),
        pa.array([1] * size, types[6]),
        pa.array([1_700_000_000_000_000] * size, pa.int64()).cast(types[7]),
        pa.nulls(size, types[8]),
        pa.nulls(size, types[9]),
        pa.array([b"x" * SIZE] * size, types[10]),
        pa.nulls(size, types[11]),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=arrow)
    for done in range(0, rows, CHUNK):
        yield batch if rows - done >= CHUNK else batch.slice(0, rows - done)
