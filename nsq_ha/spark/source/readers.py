"""The ``nsq`` source's replayable stream and batch read: ranges of the fork's partitions (of
one topic or several, see :mod:`..topic_set`), read by executor tasks (see :mod:`.ranges`); the
driver source is in :mod:`.driver`. Created on the driver; what reaches the executors holds
only options and plain values."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from ...errors import ConfigError
from ..compat import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from ..options import OptionError, ReadOptions
from ..topic_set import TopicOffsets, TopicSet, wanted_offsets
from .arrow import arrow_schema, record_batch
from .channels import SWEEPER
from .extents import (
    Extent,
    apply_byte_limit,
    check_ending,
    check_planned_end,
    check_retained,
    fetch_topic_extents,
    is_fork,
    new_channel_name,
    resolve_topics,
)
from .ranges import RangeTask, read_chunks, resolve_timestamp
from .topics import TopicPartition, decode_offset, encode_offset, nest

__all__ = ["NsqBatchReader", "NsqReplayableReader", "read_mode"]

log = logging.getLogger("nsq_ha.spark")


def read_mode(opts: ReadOptions) -> str:
    """``replayable`` or ``driver``: as asked, or (``auto``) by the first topic read: on the
    fork in cluster mode or not (a pattern that matches nothing yet: ``replayable``)."""
    if opts.mode != "auto":
        return opts.mode
    if not opts.endpoint.lookupd:
        return "driver"
    topics = opts.topic_set.or_topic(opts.endpoint.topic)
    names = resolve_topics(opts.endpoint, topics)
    if not names:
        log.warning(
            "%s: no topic matches now; reading as the fork's replayable source (give "
            "mode=driver for vanilla nsqd)",
            topics.describe(),
        )
        return "replayable"
    return "replayable" if is_fork(opts.endpoint, names[0]) else "driver"


class _Range(InputPartition):
    def __init__(self, task: RangeTask) -> None:
        super().__init__(task)
        self.task = task


def _read_extents(opts: ReadOptions, topics: TopicSet) -> dict[TopicPartition, Extent]:
    """Each partition read now, of each topic read now (a pattern is listed again), and what
    it retains; with ``assign``, the assigned partitions only (one the topic lacks is an
    :class:`OptionError`)."""
    names = resolve_topics(opts.endpoint, topics)
    found = fetch_topic_extents(opts.endpoint, names, skip_missing=not topics.fixed)
    result: dict[TopicPartition, Extent] = {}
    for topic, extents in found.items():
        wanted = topics.partitions(topic)
        if wanted is not None:
            missing = sorted(set(wanted) - set(extents))
            if missing:
                raise OptionError(
                    f"option 'assign': topic {topic!r} has no partition {missing} (it has "
                    f"{sorted(extents)})"
                )
        for p, extent in extents.items():
            if wanted is None or p in wanted:
                result[(topic, p)] = extent
    return result


#: a check of one topic's offsets: (partition -> offset, partition -> extent, topic) -> offsets
_Check = Callable[[Mapping[int, int], Mapping[int, Extent], str], dict[int, int]]


def _by_topic(
    offsets: dict[TopicPartition, int], extents: dict[TopicPartition, Extent], check: _Check
) -> dict[TopicPartition, int]:
    """``offsets`` after ``check``, topic by topic."""
    result = dict(offsets)
    parts = nest({tp: e.start for tp, e in extents.items()})
    for topic, mine in nest(offsets).items():
        held = {p: extents[(topic, p)] for p in parts.get(topic, {})}
        result.update({(topic, p): o for p, o in check(mine, held, topic).items()})
    return result


def _retained(
    begin: dict[TopicPartition, int],
    extents: dict[TopicPartition, Extent],
    *,
    fail: bool,
    what: str = "offset",
) -> dict[TopicPartition, int]:
    """:func:`~.extents.check_retained`, topic by topic."""
    return _by_topic(
        begin, extents, lambda o, e, t: check_retained(o, e, fail=fail, topic=t, what=what)
    )


def _positions(
    opts: ReadOptions,
    wanted: str | dict[int, int] | TopicOffsets,
    timestamp_ms: int | None,
    extents: dict[TopicPartition, Extent],
    channel: str,
    *,
    default: int,
) -> dict[TopicPartition, int]:
    """Each partition's offset for an option's value: a timestamp, ``earliest`` (-2),
    ``latest`` (-1) or a JSON object (a topic or partition it leaves out takes ``default``)."""
    result: dict[TopicPartition, int] = {}
    for (topic, p), extent in sorted(extents.items()):
        if timestamp_ms is not None:
            seconds = timestamp_ms // 1000
            wait = min(opts.read_timeout, 5.0)
            result[(topic, p)] = resolve_timestamp(
                opts.endpoint, channel, p, seconds, extent, wait, topic=topic
            )
            continue
        asked = wanted_offsets(wanted, topic)
        if isinstance(asked, dict):
            value = asked.get(p, default)
        else:
            value = -2 if asked == "earliest" else -1
        result[(topic, p)] = {-2: extent.start, -1: extent.end}.get(value, value)
    return result


def _task(opts: ReadOptions, channel: str, tp: TopicPartition, start: int, end: int) -> _Range:
    return _Range(
        RangeTask(
            lookupd=opts.endpoint.lookupd,
            topic=tp[0],
            channel=channel,
            partition=tp[1],
            start=start,
            end=end,
            read_timeout=opts.read_timeout,
            security=opts.endpoint.security,
            row_format=opts.row_format,
            fail_on_data_loss=opts.fail_on_data_loss,
        )
    )


class NsqReplayableReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The replayable source (the fork in cluster mode): offsets are per-partition queue
    positions of each topic (see :mod:`.topics`); each Spark task reads one partition's range
    on the query's own channel. A ``topicPattern`` is listed again at each
    :meth:`latestOffset`: a topic made later is read from its start. With
    ``trigger(availableNow=True)`` it reads up to the ends it found at the start (in batches
    of ``maxBytesPerTrigger``), then the query stops."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.topics = opts.topic_set.or_topic(opts.endpoint.topic)
        self._target: dict[TopicPartition, int] | None = None
        #: the write ends the last latestOffset() found (what reportLatestOffset() reports)
        self._latest: dict[str, Any] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: e.end for tp, e in self._extents().items()}
        log.info("%s: available now up to %s", self.topics.describe(), nest(self._target))

    def _extents(self) -> dict[TopicPartition, Extent]:
        return _read_extents(self.opts, self.topics)

    def initialOffset(self) -> dict[str, Any]:
        opts = self.opts
        channel = opts.channel or new_channel_name()
        extents = self._extents()
        start = _positions(
            opts, opts.starting, opts.starting_timestamp_ms, extents, channel, default=-1
        )
        if not start:
            log.info("%s: nothing to read yet (waiting for a topic)", self.topics.describe())
        log.info("%s: starting at %s on channel %s", self.topics.describe(), nest(start), channel)
        return encode_offset(channel, start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_bytes_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxBytes(self.opts.max_bytes_per_trigger)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        channel, known = decode_offset(start)
        extents = self._extents()
        self._latest = encode_offset(channel, {tp: e.end for tp, e in extents.items()})
        begin = dict(known)
        for tp, extent in extents.items():
            begin.setdefault(tp, extent.start)  # a new partition or topic is read from its start
        begin = _retained(begin, extents, fail=self.opts.fail_on_data_loss)
        ends = {tp: max(begin[tp], e.end) for tp, e in extents.items()}
        if self._target is not None:  # availableNow: nothing past what was there at the start
            target = self._target
            ends = {tp: max(begin[tp], min(e, target.get(tp, 0))) for tp, e in ends.items()}
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        ends = apply_byte_limit(begin, ends, max_bytes)
        for tp, offset in known.items():  # a partition not read now (its topic deleted) stays
            ends.setdefault(tp, offset)
        return encode_offset(channel, ends)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Each partition's write end as the last :meth:`latestOffset` found it (no request of
        its own): with the batch's end offset, query progress shows how far behind it is."""
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        _, begin = decode_offset(start)
        channel, stop = decode_offset(end)
        # a start past its end is a checkpoint of a re-created topic (checked below)
        todo = sorted(tp for tp, offset in stop.items() if begin.get(tp, -1) != offset)
        topics = sorted({t for t, _ in todo})
        found = fetch_topic_extents(self.opts.endpoint, topics, skip_missing=not self.topics.fixed)
        extents = {(t, p): e for t, parts in found.items() for p, e in parts.items()}
        gone = [tp for tp in todo if tp[0] not in found]
        if gone:
            log.warning(
                "%s are no longer listed: their ranges are not read",
                nest({tp: stop[tp] for tp in gone}),
            )
        todo = [tp for tp in todo if tp[0] in found]
        for tp in todo:
            begin.setdefault(tp, extents[tp].start if tp in extents else stop[tp])
        fail = self.opts.fail_on_data_loss
        # a start past the partition's end: the checkpoint's error names it (when failing)
        begin = _retained({tp: begin[tp] for tp in todo}, extents, fail=fail)
        # an end past it: a batch planned before the topic was re-created, run again
        for topic, ends in nest({tp: stop[tp] for tp in todo}).items():
            held = {p: extents[(topic, p)] for p in ends if (topic, p) in extents}
            for p in check_planned_end(ends, held, fail=fail, topic=topic):
                begin[(topic, p)] = stop[(topic, p)]  # skipped
        return [
            _task(self.opts, channel, tp, begin[tp], stop[tp])
            for tp in todo
            if begin[tp] < stop[tp]
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_range_batches(partition)

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("committed %s", end)
        opts = self.opts
        _, positions = decode_offset(self._latest or end)
        topics = sorted({t for t, _ in positions})
        SWEEPER.maybe_sweep_topics(opts.endpoint.lookupd, topics, opts.stale_channel_timeout)


def _read_range_batches(partition: InputPartition) -> Iterator[Any]:
    """A task's range as Arrow record batches, one per chunk the event loop hands over.

    Nothing for ``InputPartition(None)``: what Spark plans in place of an empty list of
    partitions (a batch read of an empty range); PySpark 4.0/4.1 plan ``None`` there."""
    if not isinstance(partition, _Range):
        if partition is None or (type(partition) is InputPartition and partition.value is None):
            return iter(())
        raise TypeError(f"not a partition of the nsq source: {partition!r}")
    schema = arrow_schema()
    task = partition.task
    return (
        record_batch(task.topic, chunk, schema, task.row_format, partition=task.partition)
        for chunk in read_chunks(task)
    )


class NsqBatchReader(DataSourceReader):
    """``spark.read.format("nsq")``: the fork's partitions between two positions, one Spark
    task per partition of each topic. The topics (a ``topicPattern`` is listed once) and the
    ranges are fixed when Spark plans the read (``latest`` is the write end then), so reading
    the same explicit offsets again gives the same rows while nsqd retains them."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.topics = opts.topic_set.or_topic(opts.endpoint.topic)

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        what = self.topics.describe()
        if read_mode(opts) != "replayable":
            raise ConfigError(
                f"{what}: a batch read needs partition offsets (the fork in cluster mode, "
                "through 'lookupd')"
            )
        channel = opts.channel or new_channel_name()
        extents = _read_extents(opts, self.topics)
        if not extents:
            log.info("%s: nothing to read (no topic matches)", what)
            return []
        topics = sorted({t for t, _ in extents})
        SWEEPER.maybe_sweep_topics(opts.endpoint.lookupd, topics, opts.stale_channel_timeout)
        begin, stop = _batch_range(opts, extents, channel)
        ranges = [
            _task(opts, channel, tp, begin[tp], stop[tp])
            for tp in sorted(extents)
            if begin[tp] < stop[tp]
        ]
        log.info(
            "%s: batch read of %s",
            what,
            {f"{r.task.topic}/{r.task.partition}": (r.task.start, r.task.end) for r in ranges},
        )
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_range_batches(partition)


def _batch_range(
    opts: ReadOptions, extents: dict[TopicPartition, Extent], channel: str
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """Each partition's ``[start, end)`` of a batch read. Positions given in
    ``startingOffsets`` / ``endingOffsets`` that nsqd does not hold follow ``failOnDataLoss``
    (:func:`~.extents.check_retained`, :func:`~.extents.check_ending`); then a start after its
    end is an :class:`OptionError` (Kafka refuses it too). A timestamp's offset may lie past
    the end these extents saw (written since): it is the end."""
    fail = opts.fail_on_data_loss
    begin = _positions(
        opts, opts.starting, opts.starting_timestamp_ms, extents, channel, default=-2
    )
    stop = _positions(opts, opts.ending, opts.ending_timestamp_ms, extents, channel, default=-1)
    if opts.starting_timestamp_ms is not None:
        begin = {tp: min(o, extents[tp].end) for tp, o in begin.items()}
    if opts.ending_timestamp_ms is not None:
        stop = {tp: min(o, extents[tp].end) for tp, o in stop.items()}
    begin = _retained(begin, extents, fail=fail, what="startingOffsets")
    stop = _by_topic(stop, extents, lambda o, e, t: check_ending(o, e, fail=fail, topic=t))
    if opts.starting_timestamp_ms is None and opts.ending_timestamp_ms is None:
        for (topic, p), offset in sorted(begin.items()):
            if offset > stop[(topic, p)]:
                raise OptionError(
                    f"{topic}/{p}: startingOffsets {offset} is after endingOffsets "
                    f"{stop[(topic, p)]}: give a start at or before the end"
                )
    return begin, stop
