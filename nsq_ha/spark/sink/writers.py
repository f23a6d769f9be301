"""The ``nsq`` sink's Spark classes: ``df.write`` and ``df.writeStream`` over :mod:`.publish`.
Created on the driver and pickled to the executors: they hold options and plain values; each
task opens its producer inside ``write``."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyspark.sql.datasource
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from ...errors import ConfigError
from ...sync import shared_loop
from ..options import OptionError, WriteOptions, parse_write_options
from .arrow import ArrowBatches
from .columns import TopicInfo, topic_info
from .publish import BatchStamp, TaskOutcome, publish_rows

__all__ = [
    "NsqArrowWriter",
    "NsqCommitMessage",
    "NsqStreamArrowWriter",
    "NsqStreamWriter",
    "NsqWriter",
    "batch_writer",
    "stream_writer",
    "write_options",
]

log = logging.getLogger("nsq_ha.spark")


@dataclass
class NsqCommitMessage(WriterCommitMessage):
    """What one write task published (sent to the driver's ``commit``). ``partitions`` and
    ``offsets`` add up every topic written (one topic: that topic's); ``topics`` and
    ``topic_offsets`` hold the same per topic."""

    task: int
    attempt: int
    batch_id: int | None
    rows: int
    published: int
    partitions: dict[int, int] = field(default_factory=dict)
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    seconds: float = 0.0
    topics: dict[str, dict[int, int]] = field(default_factory=dict)
    topic_offsets: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    #: publish calls the task handed to its producer
    calls: int = 0


@dataclass
class _Summary:
    """The tasks' commit messages added up, for the driver's log."""

    published: int = 0
    missing: int = 0
    topics: dict[str, Counter[int]] = field(default_factory=dict)

    def where(self, topic: str | None) -> str:
        """``to 'orders', per partition {...}``, or per topic and partition for several."""
        per_topic = {t: dict(sorted(c.items())) for t, c in sorted(self.topics.items())}
        if len(per_topic) > 1 or (topic is None and per_topic):
            return f"to {len(per_topic)} topic(s), per topic and partition {per_topic}"
        name = topic if topic is not None else "the topic column's topics"
        return f"to {name!r}, per partition {next(iter(per_topic.values()), {})}"


def _summary(messages: Sequence[WriterCommitMessage | None]) -> _Summary:
    summary = _Summary()
    for message in messages:
        if isinstance(message, NsqCommitMessage):
            summary.published += message.published
            for topic, counts in message.topics.items():
                summary.topics.setdefault(topic, Counter()).update(counts)
        else:
            summary.missing += 1
    return summary


def write_options(options: Any, schema: StructType) -> WriteOptions:
    """The sink's options checked against the DataFrame's schema: every named column exists,
    and the topic, partition and headers columns in use have types the sink takes."""
    opts = parse_write_options(options, schema.fieldNames())
    names = set(schema.fieldNames())
    wanted = [opts.body_column, opts.key_column, opts.trace_column, *opts.ext_columns]
    missing = [c for c in wanted if c is not None and c not in names]
    if missing:
        raise ConfigError(
            f"the DataFrame has no column {', '.join(map(repr, missing))} (columns: "
            f"{', '.join(sorted(names))}); set bodyColumn/keyColumn/traceColumn/extColumns"
        )
    types = {f.name: f.dataType for f in schema.fields}
    _check_type(opts.topic_column, types, "topicColumn", "string", _is_string)
    _check_type(opts.partition_column, types, "partitionColumn", "an integer", _is_integer)
    _check_type(opts.headers_column, types, "headersColumn", "map<string,string>", _is_map)
    return opts


def _is_string(kind: DataType) -> bool:
    return isinstance(kind, StringType)


def _is_integer(kind: DataType) -> bool:
    return isinstance(kind, ByteType | ShortType | IntegerType | LongType)


def _is_map(kind: DataType) -> bool:
    return (
        isinstance(kind, MapType)
        and isinstance(kind.keyType, StringType)
        and isinstance(kind.valueType, StringType)
    )


def _check_type(
    column: str | None,
    types: dict[str, DataType],
    option: str,
    wanted: str,
    fits: Callable[[DataType], bool],
) -> None:
    if column is not None and not fits(types[column]):
        raise OptionError(
            f"the column {column!r} (option {option!r}) must be {wanted}, not "
            f"{types[column].simpleString()}: cast it, or set {option} to none to ignore it"
        )


class _WriterBase:
    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        if (opts.ext_columns or opts.trace_column) and not opts.endpoint.lookupd:
            raise ConfigError("trace ids and ext headers need the fork (option 'lookupd')")
        # the option's topic is looked up once, here on the driver (an ext topic gets the key
        # and, streaming, the stamp); each task looks up the topic column's topics itself
        self.known: dict[str, TopicInfo] = {}
        if opts.topic is not None:
            looked_up = asyncio.run_coroutine_threadsafe(
                topic_info(opts.endpoint, opts.topic), shared_loop()
            )
            self.known[opts.topic] = looked_up.result(30.0)

    def _write(self, rows: Iterator[Any] | ArrowBatches, batch_id: int | None) -> NsqCommitMessage:
        context = TaskContext.get()
        task = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        stamp = None  # the sink stamps the rows of ext topics only
        if batch_id is not None and self.opts.stamp_batch:
            query = (context.getLocalProperty("sql.streaming.queryId") if context else None) or ""
            stamp = BatchStamp(query=query, batch=batch_id, task=task)
        where = f"task {task} attempt {attempt}" + (
            "" if batch_id is None else f" of batch {batch_id}"
        )
        outcome: TaskOutcome = publish_rows(
            rows, self.opts, stamp=stamp, where=where, known_topics=self.known
        )
        return NsqCommitMessage(
            task=task,
            attempt=attempt,
            batch_id=batch_id,
            rows=outcome.rows,
            published=outcome.published,
            partitions=dict(outcome.partitions),
            offsets=dict(outcome.offsets),
            seconds=outcome.seconds,
            topics=outcome.per_topic(),
            topic_offsets={t: dict(o) for t, o in outcome.topic_offsets.items()},
            calls=outcome.calls,
        )


class NsqWriter(_WriterBase, DataSourceWriter):
    """``df.write.format("nsq")``: each task publishes its rows (see :mod:`.publish`)."""

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        return self._write(iterator, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = _summary(messages)
        log.info("wrote %d messages %s", summary.published, summary.where(self.opts.topic))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = _summary(messages)
        log.error(
            "the write failed (%d tasks failed); %d messages were published and stay "
            "published (NSQ has no transactions), %s",
            summary.missing,
            summary.published,
            summary.where(self.opts.topic),
        )


class NsqArrowWriter(NsqWriter, DataSourceArrowWriter):
    """:class:`NsqWriter` fed Arrow record batches: Spark then builds no ``Row`` per row (its
    per-value converters cost more than the publish). Only for DataFrames whose columns read
    the same either way (:func:`batch_writer`)."""

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        return self._write(ArrowBatches(iterator, _used_columns(self.opts)), None)


#: the types an ext column may have for :class:`NsqArrowWriter`: their Python values from
#: Arrow are those of Spark's rows (a timestamp, binary, struct or array column is not: its
#: text in the ext header would differ)
_PLAIN_TYPES = (
    StringType,
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    BooleanType,
    FloatType,
    DoubleType,
    DecimalType,
    DateType,
)


def _used_columns(opts: WriteOptions) -> list[str]:
    """The columns the sink reads, each once."""
    named = [
        opts.body_column,
        opts.key_column,
        opts.trace_column,
        opts.topic_column,
        opts.partition_column,
        opts.headers_column,
        *opts.ext_columns,
    ]
    return list(dict.fromkeys(c for c in named if c is not None))


def _arrow_fits(opts: WriteOptions, schema: StructType) -> bool:
    """Whether every ext column reads the same from Arrow as from a Spark row."""
    types = {f.name: f.dataType for f in schema.fields}
    return all(isinstance(types[c], _PLAIN_TYPES) for c in opts.ext_columns)


def batch_writer(opts: WriteOptions, schema: StructType) -> NsqWriter:
    """The batch writer for ``schema``: :class:`NsqArrowWriter` unless an ext column has a
    type whose value reads differently from Arrow than from a Spark row."""
    return NsqArrowWriter(opts) if _arrow_fits(opts, schema) else NsqWriter(opts)


def stream_writer(opts: WriteOptions, schema: StructType) -> NsqStreamWriter:
    """The streaming writer: :class:`NsqStreamArrowWriter` where PySpark has
    ``DataSourceStreamArrowWriter`` (4.1+) and the columns allow it (as :func:`batch_writer`)."""
    if _STREAM_ARROW is not None and _arrow_fits(opts, schema):
        return NsqStreamArrowWriter(opts)
    return NsqStreamWriter(opts)


class NsqStreamWriter(_WriterBase, DataSourceStreamWriter):
    """``df.writeStream.format("nsq")``: like :class:`NsqWriter` per micro-batch; on ext
    topics every message carries ``nsq_spark_query/batch/task/seq`` for deduplication."""

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        return self._write(iterator, _batch_id())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        summary = _summary(messages)
        log.info(
            "batch %d: wrote %d messages %s",
            batchId,
            summary.published,
            summary.where(self.opts.topic),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        summary = _summary(messages)
        log.error(
            "batch %d failed (%d tasks failed); %d messages stay published (%s); the batch "
            "will be written again (deduplicate on the nsq_spark_* ext headers)",
            batchId,
            summary.missing,
            summary.published,
            summary.where(self.opts.topic),
        )


def _batch_id() -> int:
    """The streaming micro-batch the running task writes (-1: not known)."""
    context = TaskContext.get()
    raw = context.getLocalProperty("streaming.sql.batchId") if context else None
    return int(raw) if raw is not None and raw.lstrip("-").isdigit() else -1


#: PySpark 4.1+ hands such a streaming writer Arrow record batches (None before 4.1)
_STREAM_ARROW: type | None = getattr(pyspark.sql.datasource, "DataSourceStreamArrowWriter", None)


class NsqStreamArrowWriter(NsqStreamWriter, _STREAM_ARROW or object):  # type: ignore[misc]
    """:class:`NsqStreamWriter` fed Arrow record batches (PySpark 4.1+; see
    :class:`NsqArrowWriter`)."""

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        return self._write(ArrowBatches(iterator, _used_columns(self.opts)), _batch_id())
