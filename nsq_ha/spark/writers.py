"""The ``nsq`` sink's Spark classes: ``df.write`` and ``df.writeStream`` over :mod:`.sink`.
Created on the driver and pickled to the executors: they hold options and plain values; each
task opens its producer inside ``write``."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..errors import ConfigError
from ..lookup import LookupClient
from .options import WriteOptions, parse_write_options
from .rows import KEY_HEADER
from .sink import BatchStamp, TaskOutcome, publish_rows
from .source import _run

__all__ = ["NsqCommitMessage", "NsqStreamWriter", "NsqWriter", "write_options"]

log = logging.getLogger("nsq_ha.spark")


@dataclass
class NsqCommitMessage(WriterCommitMessage):
    """What one write task published (sent to the driver's ``commit``)."""

    task: int
    attempt: int
    batch_id: int | None
    rows: int
    published: int
    partitions: dict[int, int] = field(default_factory=dict)
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    seconds: float = 0.0


def _summary(messages: Sequence[WriterCommitMessage | None]) -> tuple[int, dict[int, int], int]:
    totals: Counter[int] = Counter()
    published = 0
    missing = 0
    for message in messages:
        if isinstance(message, NsqCommitMessage):
            published += message.published
            totals.update(message.partitions)
        else:
            missing += 1
    return published, dict(sorted(totals.items())), missing


def write_options(options: Any, schema: StructType) -> WriteOptions:
    opts = parse_write_options(options)
    names = set(schema.fieldNames())
    wanted = [opts.body_column, opts.key_column, opts.trace_column, *opts.ext_columns]
    missing = [c for c in wanted if c is not None and c not in names]
    if missing:
        raise ConfigError(
            f"the DataFrame has no column {', '.join(map(repr, missing))} (columns: "
            f"{', '.join(sorted(names))}); set bodyColumn/keyColumn/traceColumn/extColumns"
        )
    return opts


async def _topic_is_ext(opts: WriteOptions) -> bool:
    if not opts.endpoint.lookupd:
        return False
    async with LookupClient(list(opts.endpoint.lookupd)) as lookup:
        pmap = await lookup.lookup(opts.endpoint.topic, "w", force=True)
    return pmap.fork and pmap.extend_support


class _WriterBase:
    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        # looked up once on the driver: ext topics get the key (and, streaming, the stamp)
        self.ext_topic = bool(_run(_topic_is_ext(opts), 30.0))
        if (opts.ext_columns or opts.trace_column) and not opts.endpoint.lookupd:
            raise ConfigError("trace ids and ext headers need the fork (option 'lookupd')")

    def _write(self, rows: Iterator[Any], batch_id: int | None) -> NsqCommitMessage:
        context = TaskContext.get()
        task = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        stamp = None
        if batch_id is not None and self.opts.stamp_batch and self.ext_topic:
            query = (context.getLocalProperty("sql.streaming.queryId") if context else None) or ""
            stamp = BatchStamp(query=query, batch=batch_id, task=task)
        where = f"task {task} attempt {attempt}" + (
            "" if batch_id is None else f" of batch {batch_id}"
        )
        rows_in = rows
        if self.ext_topic and self.opts.key_column is not None:
            rows_in = _with_key_header(rows, self.opts.key_column)
            opts = _add_ext_column(self.opts, KEY_HEADER)
        else:
            opts = self.opts
        outcome: TaskOutcome = publish_rows(rows_in, opts, stamp=stamp, where=where)
        return NsqCommitMessage(
            task=task,
            attempt=attempt,
            batch_id=batch_id,
            rows=outcome.rows,
            published=outcome.published,
            partitions=dict(outcome.partitions),
            offsets=dict(outcome.offsets),
            seconds=outcome.seconds,
        )


class _KeyedRow:
    """A row seen with one more column: the key again, under the ext header's key name."""

    __slots__ = ("_key_column", "_row")

    def __init__(self, row: Any, key_column: str) -> None:
        self._row = row
        self._key_column = key_column

    def __getitem__(self, name: str) -> Any:
        if name == KEY_HEADER:
            value = self._row[self._key_column]
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return self._row[name]


def _with_key_header(rows: Iterator[Any], key_column: str) -> Iterator[Any]:
    for row in rows:
        yield _KeyedRow(row, key_column)


def _add_ext_column(opts: WriteOptions, column: str) -> WriteOptions:
    if column in opts.ext_columns:
        return opts
    return dataclasses.replace(opts, ext_columns=(*opts.ext_columns, column))


class NsqWriter(_WriterBase, DataSourceWriter):
    """``df.write.format("nsq")``: each task publishes its rows (see :mod:`.sink`)."""

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        return self._write(iterator, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        published, partitions, _ = _summary(messages)
        log.info(
            "wrote %d messages to %r, per partition %s",
            published,
            self.opts.endpoint.topic,
            partitions,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        published, partitions, missing = _summary(messages)
        log.error(
            "the write to %r failed (%d tasks failed); %d messages were published and stay "
            "published (NSQ has no transactions), per partition %s",
            self.opts.endpoint.topic,
            missing,
            published,
            partitions,
        )


class NsqStreamWriter(_WriterBase, DataSourceStreamWriter):
    """``df.writeStream.format("nsq")``: like :class:`NsqWriter` per micro-batch; on ext
    topics every message carries ``nsq_spark_query/batch/task/seq`` for deduplication."""

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        context = TaskContext.get()
        raw = context.getLocalProperty("streaming.sql.batchId") if context else None
        batch_id = int(raw) if raw is not None and raw.lstrip("-").isdigit() else -1
        return self._write(iterator, batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published, partitions, _ = _summary(messages)
        log.info(
            "batch %d: wrote %d messages to %r, per partition %s",
            batchId,
            published,
            self.opts.endpoint.topic,
            partitions,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published, _, missing = _summary(messages)
        log.error(
            "batch %d to %r failed (%d tasks failed); %d messages stay published; the batch "
            "will be written again (deduplicate on the nsq_spark_* ext headers)",
            batchId,
            self.opts.endpoint.topic,
            missing,
            published,
        )
