"""What one Spark task does to publish its rows (no pyspark import: tested on its own).

:func:`publish_rows` turns rows into messages and publishes them with the blocking
:class:`nsq_ha.sync.Producer`:

* rows with a key go to the key's partition through the producer's per-partition lane, which
  keeps call order and has at most one unacknowledged batch out per partition (a batch that
  fails is retried, after a re-lookup, before anything behind it is sent);
* rows without a key are published in ``MPUB`` batches of ``maxBatch``;
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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import ConfigError, NsqError, PublishError
from ..producer import Producer as AsyncProducer
from ..producer import PublishResult
from ..protocol.publish import ExtHeader
from ..routing import ShardingKey
from ..sync import Producer, shared_loop
from .options import WriteOptions

__all__ = ["BatchStamp", "SparkPublishError", "TaskOutcome", "publish_rows"]

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
    for traced publishes, the first and last queue offset per partition."""

    rows: int = 0
    published: int = 0
    partitions: Counter[int] = field(default_factory=Counter)
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, result: PublishResult) -> None:
        self.published += 1
        part = -1 if result.partition is None else result.partition
        self.partitions[part] += 1
        if result.offset is not None:
            first, last = self.offsets.get(part, (result.offset, result.offset))
            self.offsets[part] = (min(first, result.offset), max(last, result.offset))


@dataclass(slots=True)
class _Prepared:
    body: bytes
    key: ShardingKey | None
    trace_id: int | None
    ext: ExtHeader | None


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


def prepare(row: _RowLike, seq: int, opts: WriteOptions, stamp: BatchStamp | None) -> _Prepared:
    """One row as a message to publish (raises ConfigError naming the row and column)."""
    body = _body(row[opts.body_column], seq, opts.body_column)
    key = None if opts.key_column is None else _key(row[opts.key_column], seq, opts.key_column)
    trace = None
    if opts.trace_column is not None:
        trace = _trace(row[opts.trace_column], seq, opts.trace_column)
    ext: dict[str, str] | None = None
    if opts.ext_columns or stamp is not None:
        ext = {}
        for column in opts.ext_columns:
            value = row[column]
            if value is not None:
                ext[column] = value if isinstance(value, str) else str(value)
        if stamp is not None:
            ext.update(stamp.header(seq))
    return _Prepared(body, key, trace, ext)


async def _publish_chunk(
    producer: AsyncProducer, topic: str, chunk: list[_Prepared], keyed: bool
) -> list[PublishResult | BaseException]:
    """Publish one chunk on the producer's loop as one publish_many: keyed rows by their keys
    (each partition's rows in row order, through its lane), unkeyed ones round-robin."""
    try:
        results = await producer.publish_many(
            topic,
            [m.body for m in chunk],
            sharding_keys=[m.key for m in chunk if m.key is not None] if keyed else None,
            trace_ids=[m.trace_id for m in chunk],
            exts=[m.ext for m in chunk] if any(m.ext is not None for m in chunk) else None,
        )
    except PublishError as exc:
        if exc.results is None or len(exc.results) != len(chunk):
            return [exc] * len(chunk)
        return [r if isinstance(r, PublishResult | BaseException) else exc for r in exc.results]
    except NsqError as exc:
        return [exc] * len(chunk)
    return list(results)


def _chunks(
    rows: Iterable[_RowLike], opts: WriteOptions, stamp: BatchStamp | None, outcome: TaskOutcome
) -> Iterator[list[_Prepared]]:
    chunk: list[_Prepared] = []
    for row in rows:
        chunk.append(prepare(row, outcome.rows, opts, stamp))
        outcome.rows += 1
        if len(chunk) >= opts.max_batch:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def publish_rows(
    rows: Iterable[_RowLike],
    opts: WriteOptions,
    *,
    stamp: BatchStamp | None = None,
    where: str = "task",
    producer_args: Mapping[str, Any] | None = None,
) -> TaskOutcome:
    """Publish ``rows`` as :mod:`nsq_ha.spark.options` describes; return what was published.

    Raises :class:`SparkPublishError` when a publish failed for good (after in-flight ones
    settled), and re-raises an error of the row iterator after the same settling.
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
        config=endpoint.security.apply(),
        **dict(producer_args or {}),
    )
    loop = shared_loop()
    keyed = opts.key_column is not None
    pending: deque[tuple[concurrent.futures.Future[list[PublishResult | BaseException]], int]]
    pending = deque()
    in_flight = 0
    first_error: BaseException | None = None

    def settle_one() -> None:
        nonlocal in_flight, first_error
        future, size = pending.popleft()
        in_flight -= size
        try:
            results = future.result(opts.publish_timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            results = [
                NsqError(f"no acknowledgement within publishTimeout={opts.publish_timeout} s")
            ] * size
        for result in results:
            if isinstance(result, PublishResult):
                outcome.add(result)
            elif first_error is None:
                first_error = result

    try:
        for chunk in _chunks(rows, opts, stamp, outcome):
            coro = _publish_chunk(producer.aio, endpoint.topic, chunk, keyed)
            pending.append((asyncio.run_coroutine_threadsafe(coro, loop), len(chunk)))
            in_flight += len(chunk)
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
            f"{where}: publishing to {endpoint.topic!r} failed after {outcome.published} of "
            f"{outcome.rows} rows were acknowledged: {first_error}",
            outcome,
        ) from first_error
    log.info(
        "%s: published %d rows to %r in %.2f s (per partition %s)",
        where,
        outcome.published,
        endpoint.topic,
        outcome.seconds,
        dict(sorted(outcome.partitions.items())),
    )
    return outcome


def _close(producer: Producer, opts: WriteOptions) -> None:
    try:
        producer.close(opts.publish_timeout)
    except NsqError as exc:  # everything was settled before; a close error loses nothing
        log.warning("closing the producer: %s", exc)
