"""What one Spark task does to publish its rows (no pyspark import: tested on its own).

:func:`publish_rows` turns rows into messages and publishes them with the blocking
:class:`nsq_ha.sync.Producer`:

* each row goes to its topic: the option ``topic``, or the row's topic column; a row whose
  partition column is not null goes to that partition (see :mod:`.columns`);
* rows with a key go to the key's partition through the producer's per-partition lane, which
  keeps call order and has at most one unacknowledged batch out per partition (a batch that
  fails is retried, after a re-lookup, before anything behind it is sent);
* rows without a key are published in ``MPUB`` batches of ``maxBatch``;
* a chunk of ``maxBatch`` rows is one publish call per topic (:func:`.columns.split`; rows
  with partitions are cut into runs that keep each (topic, key)'s rows in order);
* Arrow record batches (:class:`.arrow.ArrowBatches`) whose rows have nothing but a body and a
  key, to the option's topic without ext headers, are read by column and published in calls
  of up to ``maxPending / 2`` rows (at least ``maxBatch``): no Python object per row but its
  body and key, and few hand-overs to the producer's loop;
* on the fork's ext topics the ext header holds, from lowest to highest precedence on a clash:
  the headers column's map, ``extColumns``, the key as ``nsq_key`` (keyed writes), and a
  stream's ``nsq_spark_*`` stamp;
* at most ``maxPending`` rows are in flight, so a task's memory does not grow with its input;
* the first publish that fails for good stops the task: what is in flight settles, then
  :class:`SparkPublishError` says how many rows were published before (Spark retries the task,
  which publishes the whole task again: at-least-once, duplicates on retry);
* a failure while reading rows (an upstream error) also lets in-flight publishes settle before
  it propagates, so nothing is left half-sent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from ...errors import ConfigError, NsqError, PublishError
from ...producer import Producer as AsyncProducer
from ...producer import PublishResult
from ...protocol.publish import ExtHeader
from ...routing import ShardingKey
from ...sync import Producer, shared_loop
from ..options import WriteOptions
from ..rows import KEY_HEADER
from .arrow import ArrowBatches, batch_rows, plain_columns
from .columns import Batch, TopicInfo, Topics, headers_of, partition_of, split, topic_info

__all__ = [
    "BatchStamp",
    "SparkPublishError",
    "TaskOutcome",
    "prepare",
    "prepare_row",
    "publish_rows",
]

log = logging.getLogger("nsq_ha.spark")

#: ext header keys of a streaming write's stamp (downstream deduplicates on all four)
STAMP_KEYS = ("nsq_spark_query", "nsq_spark_batch", "nsq_spark_task", "nsq_spark_seq")


class _RowLike(Protocol):
    def __getitem__(self, key: str) -> Any: ...


class SparkPublishError(NsqError):
    """A Spark task could not publish all its rows; ``.outcome`` has what it did publish."""

    def __init__(self, message: str, outcome: TaskOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class BatchStamp:
    """Identifies a streaming micro-batch task; stamped into ext headers with each row's
    sequence number, so a replayed batch (same query, batch, task) can be deduplicated."""

    query: str
    batch: int
    task: int

    def header(self, seq: int) -> dict[str, str]:
        values = (self.query, str(self.batch), str(self.task), str(seq))
        return dict(zip(STAMP_KEYS, values, strict=True))


@dataclass(slots=True)
class TaskOutcome:
    """What one task published: rows seen, messages acknowledged, per partition counts and,
    for traced publishes, the first and last queue offset per partition. ``partitions`` and
    ``offsets`` add up every topic written (a write to one topic: that topic's);
    ``topics`` and ``topic_offsets`` hold the same per topic (-1: vanilla, no partition)."""

    rows: int = 0
    published: int = 0
    partitions: Counter[int] = field(default_factory=Counter)
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    seconds: float = 0.0
    topics: dict[str, Counter[int]] = field(default_factory=dict)
    topic_offsets: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    #: publish calls handed to the producer's loop
    calls: int = 0

    def add_all(self, topic: str, results: Sequence[PublishResult]) -> None:
        """:meth:`add` for the results of one call to ``topic`` (counted per partition at
        once; offsets, which only traced publishes have, one by one)."""
        if results and results[0].offset is not None:
            for result in results:
                self.add(result)
            return
        parts = Counter(-1 if r.partition is None else r.partition for r in results)
        self.published += len(results)
        self.partitions.update(parts)
        counter = self.topics.get(topic)
        if counter is None:
            counter = self.topics[topic] = Counter()
        counter.update(parts)

    def add(self, result: PublishResult) -> None:
        self.published += 1
        part = -1 if result.partition is None else result.partition
        self.partitions[part] += 1
        counter = self.topics.get(result.topic)
        if counter is None:  # (setdefault would build a Counter per message)
            counter = self.topics[result.topic] = Counter()
        counter[part] += 1
        if result.offset is not None:
            for offsets in (self.offsets, self.topic_offsets.setdefault(result.topic, {})):
                first, last = offsets.get(part, (result.offset, result.offset))
                offsets[part] = (min(first, result.offset), max(last, result.offset))

    def per_topic(self) -> dict[str, dict[int, int]]:
        """Messages acknowledged per topic and partition, sorted."""
        return {t: dict(sorted(c.items())) for t, c in sorted(self.topics.items())}


@dataclass(slots=True)
class _Prepared:
    body: bytes
    key: ShardingKey | None
    trace_id: int | None
    ext: ExtHeader | None
    topic: str = ""
    #: the partition column's value (None: by key, or round-robin)
    partition: int | None = None


def _body(value: object, seq: int, column: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    elif isinstance(value, str):
        data = value.encode("utf-8")
    elif value is None:
        raise ConfigError(f"row {seq}: the body column {column!r} is null")
    else:
        raise ConfigError(
            f"row {seq}: the body column {column!r} must be binary or string, "
            f"got {type(value).__name__}"
        )
    if not data:
        raise ConfigError(f"row {seq}: the body column {column!r} is empty (nsqd refuses it)")
    return data


def _key_text(key: ShardingKey) -> str:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)


def _key(value: object, seq: int, column: str) -> ShardingKey:
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"row {seq}: the key column {column!r} is {value!r}; keys must be set")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str | bytes | int):
        return value
    raise ConfigError(
        f"row {seq}: the key column {column!r} must be string, binary or integer, "
        f"got {type(value).__name__}"
    )


def _trace(value: object, seq: int, column: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ConfigError(f"row {seq}: the trace column {column!r} must be a u64, got {value!r}")
    return value


def prepare(
    row: _RowLike,
    seq: int,
    opts: WriteOptions,
    stamp: BatchStamp | None,
    *,
    headers: Mapping[str, str] | None = None,
    key_header: bool = False,
    key_required: bool = True,
) -> _Prepared:
    """One row as a message to publish (raises ConfigError naming the row and column).

    The ext header: ``headers``, then ``extColumns``, then (``key_header``) the key as
    ``nsq_key`` unless an ext column has that name, then the ``stamp``: a later one wins a
    clash. ``key_required`` False (the row names its partition): a null key is no key."""
    body = _body(row[opts.body_column], seq, opts.body_column)
    key = None
    if opts.key_column is not None:
        value = row[opts.key_column]
        if value is not None or key_required:
            key = _key(value, seq, opts.key_column)
    trace = None
    if opts.trace_column is not None:
        trace = _trace(row[opts.trace_column], seq, opts.trace_column)
    ext: dict[str, str] | None = None
    with_key = key_header and key is not None
    if headers or opts.ext_columns or stamp is not None or with_key:
        ext = dict(headers or {})
        for column in opts.ext_columns:
            value = row[column]
            if value is not None:
                ext[column] = value if isinstance(value, str) else str(value)
        if with_key and key is not None and KEY_HEADER not in opts.ext_columns:
            ext[KEY_HEADER] = _key_text(key)
        if stamp is not None:
            ext.update(stamp.header(seq))
    return _Prepared(body, key, trace, ext)


def prepare_row(
    row: _RowLike, seq: int, opts: WriteOptions, stamp: BatchStamp | None, topics: Topics
) -> _Prepared:
    """:func:`prepare` with the row's topic and partition; on ext topics with its headers,
    its key as ``nsq_key`` and the ``stamp`` (other topics get neither)."""
    topic, info = topics.of(row, seq)
    partition = partition_of(row, seq, opts, topic, info)
    headers = headers_of(row, seq, opts, topic, info)
    message = prepare(
        row,
        seq,
        opts,
        stamp if info.ext else None,
        headers=headers,
        key_header=info.ext,
        key_required=partition is None,
    )
    message.topic = topic
    message.partition = partition
    return message


@dataclass(frozen=True, slots=True)
class _Call:
    """One publish_many: ``bodies`` to ``topic``, to ``partition`` when it is set, else by
    ``keys`` (each partition's rows in row order, through its lane) or round-robin."""

    topic: str
    bodies: list[bytes]
    keys: list[ShardingKey] | None = None
    partition: int | None = None
    trace_ids: list[int | None] | None = None
    exts: list[ExtHeader | None] | None = None


def _call_of(batch: Batch[_Prepared]) -> _Call:
    chunk = batch.messages
    by_key = batch.keyed and batch.partition is None
    traced = any(m.trace_id is not None for m in chunk)
    return _Call(
        batch.topic,
        [m.body for m in chunk],
        keys=[m.key for m in chunk if m.key is not None] if by_key else None,
        partition=batch.partition,
        trace_ids=[m.trace_id for m in chunk] if traced else None,
        exts=[m.ext for m in chunk] if any(m.ext is not None for m in chunk) else None,
    )


async def _publish_call(
    producer: AsyncProducer, call: _Call
) -> list[PublishResult | BaseException]:
    """Publish one call on the producer's loop; a result or the error per row."""
    size = len(call.bodies)
    try:
        results = await producer.publish_many(
            call.topic,
            call.bodies,
            sharding_keys=call.keys,
            partition=call.partition,
            trace_ids=call.trace_ids,
            exts=call.exts,
        )
    except PublishError as exc:
        if exc.results is None or len(exc.results) != size:
            return [exc] * size
        return [r if isinstance(r, PublishResult | BaseException) else exc for r in exc.results]
    except NsqError as exc:
        return [exc] * size
    return list(results)


def _plain_topic(opts: WriteOptions, topics: Topics) -> str | None:
    """The option's topic when the rows have nothing but a body (and a key) and it has no ext
    headers (looked up already): :func:`_chunks` then reads those two columns only, as
    :func:`prepare_row` would for such rows."""
    if (
        opts.topic is None
        or opts.topic_column is not None
        or opts.partition_column is not None
        or opts.headers_column is not None
        or opts.trace_column is not None
        or opts.ext_columns
    ):
        return None
    info = topics.seen.get(opts.topic)
    return opts.topic if info is not None and not info.ext else None


def _chunks(
    rows: Iterable[_RowLike],
    opts: WriteOptions,
    stamp: BatchStamp | None,
    outcome: TaskOutcome,
    topics: Topics,
) -> Iterator[list[_Prepared]]:
    chunk: list[_Prepared] = []
    plain: str | None = None
    body_column, key_column = opts.body_column, opts.key_column
    for row in rows:
        seq = outcome.rows
        if plain is None:
            chunk.append(prepare_row(row, seq, opts, stamp, topics))
            if seq == 0:
                plain = _plain_topic(opts, topics)
        else:  # the profile's hot path: a body and a key per row, nothing else to check
            body = _body(row[body_column], seq, body_column)
            key = None if key_column is None else _key(row[key_column], seq, key_column)
            chunk.append(_Prepared(body, key, None, None, plain))
        outcome.rows += 1
        if len(chunk) >= opts.max_batch:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _calls(
    rows: Iterable[_RowLike] | ArrowBatches,
    opts: WriteOptions,
    stamp: BatchStamp | None,
    outcome: TaskOutcome,
    topics: Topics,
) -> Iterator[_Call]:
    """The publish calls of ``rows``, in the order they are to be submitted."""
    keyed = opts.key_column is not None
    if not isinstance(rows, ArrowBatches):
        for chunk in _chunks(rows, opts, stamp, outcome, topics):
            yield from map(_call_of, split(chunk, keyed))
        return
    plain = _plain_topic(opts, topics)
    size = max(opts.max_batch, opts.max_pending // 2)
    for batch in rows.batches:
        columns = None if plain is None else plain_columns(batch, opts.body_column, opts.key_column)
        if plain is None or columns is None:  # row by row: the checks name the row
            for chunk in _chunks(batch_rows(batch, rows.columns), opts, stamp, outcome, topics):
                yield from map(_call_of, split(chunk, keyed))
            if plain is None:
                plain = _plain_topic(opts, topics)
            continue
        bodies, keys = columns
        for lo in range(0, len(bodies), size):
            piece = bodies[lo : lo + size]
            outcome.rows += len(piece)
            yield _Call(plain, piece, keys=None if keys is None else keys[lo : lo + size])


def publish_rows(
    rows: Iterable[_RowLike] | ArrowBatches,
    opts: WriteOptions,
    *,
    stamp: BatchStamp | None = None,
    where: str = "task",
    producer_args: Mapping[str, Any] | None = None,
    known_topics: Mapping[str, TopicInfo] | None = None,
) -> TaskOutcome:
    """Publish ``rows`` (or the rows of Arrow record batches) as :mod:`nsq_ha.spark.options`
    describes; return what was published.

    ``known_topics``: what the driver already looked up (the option's topic); any other topic
    is looked up here, once. Raises :class:`SparkPublishError` when a publish failed for good
    (after in-flight ones settled), and re-raises an error of the row iterator after the same
    settling.
    """
    started = time.monotonic()
    outcome = TaskOutcome()
    endpoint = opts.endpoint
    producer = Producer(
        lookupd=list(endpoint.lookupd) or None,
        nsqd=list(endpoint.nsqd) or None,
        strategy=opts.strategy,
        trace=opts.trace,
        max_batch=opts.max_batch,
        connection=endpoint.security.apply(),
        **dict(producer_args or {}),
    )
    loop = shared_loop()

    def look_up(topic: str) -> TopicInfo:
        info: TopicInfo = asyncio.run_coroutine_threadsafe(
            topic_info(endpoint, topic), loop
        ).result(opts.publish_timeout)
        log.debug("%s: topic %r: %s", where, topic, info)
        return info

    topics = Topics(opts, look_up, known_topics)
    pending: deque[
        tuple[concurrent.futures.Future[list[PublishResult | BaseException]], int, str]
    ] = deque()
    in_flight = 0
    first_error: BaseException | None = None
    failed_topic = ""

    def settle_one() -> None:
        nonlocal in_flight, first_error, failed_topic
        future, size, topic = pending.popleft()
        in_flight -= size
        try:
            results = future.result(opts.publish_timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            results = [
                NsqError(f"no acknowledgement within publishTimeout={opts.publish_timeout} s")
            ] * size
        if all(isinstance(result, PublishResult) for result in results):
            outcome.add_all(topic, cast("list[PublishResult]", results))
            return
        for result in results:
            if isinstance(result, PublishResult):
                outcome.add(result)
            elif first_error is None:
                first_error, failed_topic = result, topic

    try:
        for call in _calls(rows, opts, stamp, outcome, topics):
            coro = _publish_call(producer.aio, call)
            size = len(call.bodies)
            pending.append((asyncio.run_coroutine_threadsafe(coro, loop), size, call.topic))
            outcome.calls += 1
            in_flight += size
            while in_flight > opts.max_pending or (pending and pending[0][0].done()):
                settle_one()
            if first_error is not None:
                break
        while pending:
            settle_one()
    except BaseException:
        # the rows failed (or we were interrupted): let what is in flight settle first
        while pending:
            try:
                settle_one()
            except BaseException:  # noqa: S112 - keep settling, the first error propagates
                continue
        _close(producer, opts)
        raise
    _close(producer, opts)
    outcome.seconds = time.monotonic() - started
    if first_error is not None:
        raise SparkPublishError(
            f"{where}: publishing to {failed_topic!r} failed after {outcome.published} of "
            f"{outcome.rows} rows were acknowledged: {first_error}",
            outcome,
        ) from first_error
    log.info(
        "%s: published %d rows in %.2f s in %d calls (per topic and partition %s)",
        where,
        outcome.published,
        outcome.seconds,
        outcome.calls,
        outcome.per_topic(),
    )
    return outcome


def _close(producer: Producer, opts: WriteOptions) -> None:
    try:
        producer.close(opts.publish_timeout)
    except NsqError as exc:  # everything was settled before; a close error loses nothing
        log.warning("closing the producer: %s", exc)
