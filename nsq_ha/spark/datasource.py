"""The ``nsq`` data source: Spark's Python Data Source API classes over :mod:`.sink` and
:mod:`.source`. Everything here is created on the driver and pickled to the executors, so it
holds only options and plain values; connections are opened inside ``write`` and ``read``."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import TaskContext
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ..errors import ConfigError
from ..lookup import LookupClient
from .arrow import arrow_schema, record_batch
from .channels import SWEEPER
from .compat import (
    REPLAYABLE_STREAM_READ,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
    require,
)
from .options import ReadOptions, WriteOptions, parse_read_options, parse_write_options
from .ranges import RangeTask, read_chunks, resolve_timestamp
from .sink import BatchStamp, TaskOutcome, publish_rows
from .source import (
    KEY_HEADER,
    SCHEMA,
    DriverReader,
    Extent,
    _run,
    apply_byte_limit,
    check_retained,
    fetch_extents,
    is_fork,
    new_channel_name,
)

__all__ = ["NsqCommitMessage", "NsqDataSource"]

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


class NsqDataSource(DataSource):
    """``format("nsq")``: batch and streaming writes, streaming reads (see :mod:`nsq_ha.spark`)."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return NsqBatchReader(parse_read_options(self.options, batch=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return NsqWriter(_write_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return NsqStreamWriter(_write_options(self.options, schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_read_options(self.options)
        if _read_mode(opts) != "replayable":
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        require(REPLAYABLE_STREAM_READ)  # PySpark 4.2+ (nsq_ha.spark.compat)
        return NsqReplayableReader(opts)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        opts = parse_read_options(self.options)
        if opts.channel is None:
            raise ConfigError(
                "mode=driver consumes as a channel of the topic: set the option 'channel' "
                "(queries sharing a channel share its messages)"
            )
        return NsqDriverReader(opts)


def _read_mode(opts: ReadOptions) -> str:
    if opts.mode != "auto":
        return opts.mode
    return "replayable" if is_fork(opts.endpoint) else "driver"


def _write_options(options: Any, schema: StructType) -> WriteOptions:
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


# -- streaming reads --------------------------------------------------------------------------


class _Range(InputPartition):
    def __init__(self, task: RangeTask) -> None:
        super().__init__(task)
        self.task = task


def _offset(topic: str, channel: str, partitions: dict[int, int]) -> dict[str, Any]:
    return {
        "topic": topic,
        "channel": channel,
        "partitions": {str(p): o for p, o in sorted(partitions.items())},
    }


def _positions(offset: dict[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in offset["partitions"].items()}


class NsqReplayableReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The replayable source (the fork in cluster mode): offsets are per-partition queue
    positions; each Spark task reads one partition's range on the query's own channel.
    With ``trigger(availableNow=True)`` it reads up to the ends it found at the start (in
    batches of ``maxBytesPerTrigger``), then the query stops."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._target: dict[int, int] | None = None
        #: the write ends the last latestOffset() found (what reportLatestOffset() reports)
        self._latest: dict[str, Any] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {p: e.end for p, e in self._extents().items()}
        log.info("%s: available now up to %s", self.opts.endpoint.topic, self._target)

    def _extents(self) -> dict[int, Extent]:
        return fetch_extents(self.opts.endpoint)

    def initialOffset(self) -> dict[str, Any]:
        opts = self.opts
        channel = opts.channel or new_channel_name()
        extents = self._extents()
        start: dict[int, int] = {}
        for p, extent in extents.items():
            if opts.starting_timestamp_ms is not None:
                seconds = opts.starting_timestamp_ms // 1000
                start[p] = resolve_timestamp(
                    opts.endpoint, channel, p, seconds, extent, wait=min(opts.read_timeout, 5.0)
                )
            elif isinstance(opts.starting, dict):
                wanted = opts.starting.get(p, -1)
                start[p] = {-2: extent.start, -1: extent.end}.get(wanted, wanted)
            else:
                start[p] = extent.start if opts.starting == "earliest" else extent.end
        log.info("%s: starting at %s on channel %s", opts.endpoint.topic, start, channel)
        return _offset(opts.endpoint.topic, channel, start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_bytes_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxBytes(self.opts.max_bytes_per_trigger)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        extents = self._extents()
        self._latest = _offset(
            start["topic"], start["channel"], {p: e.end for p, e in extents.items()}
        )
        begin = _positions(start)
        for p, extent in extents.items():
            begin.setdefault(p, extent.start)  # a new partition is read from its start
        begin = check_retained(
            begin, extents, fail=self.opts.fail_on_data_loss, topic=self.opts.endpoint.topic
        )
        ends = {p: max(begin.get(p, 0), e.end) for p, e in extents.items()}
        if self._target is not None:  # availableNow: nothing past what was there at the start
            target = self._target
            ends = {p: max(begin.get(p, 0), min(e, target.get(p, 0))) for p, e in ends.items()}
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        return _offset(start["topic"], start["channel"], apply_byte_limit(begin, ends, max_bytes))

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Each partition's write end as the last :meth:`latestOffset` found it (no request of
        its own): with the batch's end offset, query progress shows how far behind it is."""
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = _positions(start)
        stop = _positions(end)
        extents = self._extents()
        for p in stop:
            begin.setdefault(p, extents[p].start if p in extents else stop[p])
        begin = check_retained(
            begin, extents, fail=self.opts.fail_on_data_loss, topic=self.opts.endpoint.topic
        )
        return [
            _Range(
                RangeTask(
                    lookupd=self.opts.endpoint.lookupd,
                    topic=end["topic"],
                    channel=end["channel"],
                    partition=p,
                    start=begin[p],
                    end=stop[p],
                    read_timeout=self.opts.read_timeout,
                    security=self.opts.endpoint.security,
                )
            )
            for p in sorted(stop)
            if begin[p] < stop[p]
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_range_batches(partition)

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("committed %s", end)
        opts = self.opts
        SWEEPER.maybe_sweep(opts.endpoint.lookupd, opts.endpoint.topic, opts.stale_channel_timeout)


def _read_range_batches(partition: InputPartition) -> Iterator[Any]:
    """A task's range as Arrow record batches, one per chunk the event loop hands over.

    Nothing for ``InputPartition(None)``: what Spark plans in place of an empty list of
    partitions (a batch read of an empty range); PySpark 4.0/4.1 plan ``None`` there."""
    if not isinstance(partition, _Range):
        if partition is None or (type(partition) is InputPartition and partition.value is None):
            return iter(())
        raise TypeError(f"not a partition of the nsq source: {partition!r}")
    schema = arrow_schema()
    topic = partition.task.topic
    return (record_batch(topic, chunk, schema) for chunk in read_chunks(partition.task))


class NsqBatchReader(DataSourceReader):
    """``spark.read.format("nsq")``: the fork's partitions between two positions, one Spark
    task per partition. The ranges are fixed when Spark plans the read (``latest`` is the write
    end then), so reading the same explicit offsets again gives the same rows while nsqd
    retains them."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def _positions(
        self,
        wanted: str | dict[int, int],
        timestamp_ms: int | None,
        extents: dict[int, Extent],
        channel: str,
        *,
        default: int,
    ) -> dict[int, int]:
        """Each partition's offset for an option's value: a timestamp, ``earliest`` (-2),
        ``latest`` (-1) or a JSON object (a partition it leaves out takes ``default``)."""
        opts = self.opts
        result: dict[int, int] = {}
        for p, extent in sorted(extents.items()):
            if timestamp_ms is not None:
                seconds = timestamp_ms // 1000
                wait = min(opts.read_timeout, 5.0)
                result[p] = resolve_timestamp(opts.endpoint, channel, p, seconds, extent, wait)
                continue
            if isinstance(wanted, dict):
                value = wanted.get(p, default)
            else:
                value = -2 if wanted == "earliest" else -1
            result[p] = {-2: extent.start, -1: extent.end}.get(value, value)
        return result

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        if _read_mode(opts) != "replayable":
            raise ConfigError(
                f"{opts.endpoint.topic!r}: a batch read needs partition offsets (the fork in "
                "cluster mode, through 'lookupd')"
            )
        SWEEPER.maybe_sweep(opts.endpoint.lookupd, opts.endpoint.topic, opts.stale_channel_timeout)
        channel = opts.channel or new_channel_name()
        extents = fetch_extents(opts.endpoint)
        begin = self._positions(
            opts.starting, opts.starting_timestamp_ms, extents, channel, default=-2
        )
        stop = self._positions(opts.ending, opts.ending_timestamp_ms, extents, channel, default=-1)
        begin = check_retained(
            begin, extents, fail=opts.fail_on_data_loss, topic=opts.endpoint.topic
        )
        ranges = [
            _Range(
                RangeTask(
                    lookupd=opts.endpoint.lookupd,
                    topic=opts.endpoint.topic,
                    channel=channel,
                    partition=p,
                    start=begin[p],
                    end=min(stop[p], extents[p].end),
                    read_timeout=opts.read_timeout,
                    security=opts.endpoint.security,
                )
            )
            for p in sorted(extents)
            if begin[p] < min(stop[p], extents[p].end)
        ]
        log.info(
            "%s: batch read of %s",
            opts.endpoint.topic,
            {r.task.partition: (r.task.start, r.task.end) for r in ranges},
        )
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_range_batches(partition)


class NsqDriverReader(SimpleDataSourceStreamReader):
    """The at-least-once source (vanilla, or ``mode=driver``): see :class:`.source.DriverReader`.

    Offsets are batch numbers ``{"seq": n}``; the state lives in the driver's source process.
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._state: DriverReader | None = None

    def _reader(self) -> DriverReader:
        if self._state is None:
            if self.opts.channel is None:
                raise ConfigError("mode=driver needs the option 'channel'")
            self._state = DriverReader(self.opts, self.opts.channel)
        return self._state

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_state": None}

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0}

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        seq = int(start["seq"]) + 1
        rows = self._reader().read(seq)
        if not rows:
            return iter(()), start
        return iter(rows), {"seq": seq}

    def readBetweenOffsets(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[tuple[Any, ...]]:
        return self._reader().replay(int(start["seq"]) + 1, int(end["seq"]))

    def commit(self, end: dict[str, Any]) -> None:
        self._reader().commit(int(end["seq"]))
