"""The ``nsq`` source's replayable stream and batch read: ranges of the fork's partitions, read
by executor tasks (see :mod:`.ranges`); the driver source is in :mod:`.driver`. Created on the
driver; what reaches the executors holds only options and plain values."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from ..errors import ConfigError
from .arrow import arrow_schema, record_batch
from .channels import SWEEPER
from .compat import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from .options import ReadOptions
from .ranges import RangeTask, read_chunks, resolve_timestamp
from .source import (
    Extent,
    apply_byte_limit,
    check_retained,
    fetch_extents,
    is_fork,
    new_channel_name,
)

__all__ = ["NsqBatchReader", "NsqReplayableReader", "read_mode"]

log = logging.getLogger("nsq_ha.spark")


def read_mode(opts: ReadOptions) -> str:
    if opts.mode != "auto":
        return opts.mode
    return "replayable" if is_fork(opts.endpoint) else "driver"


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
                    row_format=self.opts.row_format,
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
    fmt = partition.task.row_format
    return (record_batch(topic, chunk, schema, fmt) for chunk in read_chunks(partition.task))


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
        if read_mode(opts) != "replayable":
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
                    row_format=opts.row_format,
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
