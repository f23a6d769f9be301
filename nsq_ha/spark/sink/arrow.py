"""The Arrow record batches Spark's Arrow writers hand a write task, as the sink reads them.

Rows with nothing but a body and a key (the option ``topic``, no ext header) are read by column
(:func:`plain_columns`): two lists per batch, no Python object per row beyond its body and
key. Any other batch is read row by row (:func:`batch_rows`), valued as Spark's rows are.
pyarrow is imported when a batch is read (it comes with the ``spark`` extra); nothing here
imports pyspark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ...routing import ShardingKey

__all__ = ["ArrowBatches", "arrow_rows", "batch_rows", "plain_columns"]


@dataclass(frozen=True, slots=True)
class ArrowBatches:
    """A write task's input as Arrow record ``batches``, of which the sink reads ``columns``."""

    batches: Iterable[Any]
    columns: Sequence[str]


def batch_rows(batch: Any, columns: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The rows of one record ``batch`` as dicts of ``columns``, valued as Spark's rows are
    for the types the sink reads (a ``map`` is a dict, binary is bytes)."""
    import pyarrow as pa

    names = batch.schema.names
    values = []
    for column in columns:
        array = batch.column(names.index(column))
        items = array.to_pylist()
        if isinstance(array.type, pa.MapType):
            items = [None if v is None else dict(v) for v in items]
        values.append(items)
    for row in zip(*values, strict=True):
        yield dict(zip(columns, row, strict=True))


def arrow_rows(batches: Iterable[Any], columns: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The rows of record ``batches`` (see :func:`batch_rows`)."""
    for batch in batches:
        yield from batch_rows(batch, columns)


def plain_columns(
    batch: Any, body_column: str, key_column: str | None
) -> tuple[list[bytes], list[ShardingKey] | None] | None:
    """The bodies and keys of ``batch`` when every value is one the row path takes as it is:
    a binary or string body, none null or empty; a string, binary or integer key, none null.
    ``None`` otherwise: the batch is then read row by row, whose checks name the row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    body = batch.column(names.index(body_column))
    kind = body.type
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    binary = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    if body.null_count or not (text or binary):
        return None
    if len(body) and pc.min(pc.binary_length(body)).as_py() == 0:
        return None
    bodies = body.to_pylist()
    if text:
        bodies = [b.encode("utf-8") for b in bodies]
    if key_column is None:
        return bodies, None
    key = batch.column(names.index(key_column))
    kind = key.type
    if key.null_count or not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_integer(kind)
    ):
        return None
    keys: list[ShardingKey] = key.to_pylist()
    return bodies, keys
