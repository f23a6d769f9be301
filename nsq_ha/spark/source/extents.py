"""The streaming source's work, without pyspark: offsets, reading a range, the driver WAL.

Two kinds of source (see :mod:`nsq_ha.spark`):

**Replayable** (the fork in cluster mode). An offset is the byte position in each partition's
queue of each topic, ``{"channel": C, "topics": {"a": {"0": 1234, ...}, ...}}`` (see
:mod:`.topics`, which also reads the single-topic form of older checkpoints); the channel is
the query's own, so its cursor is nobody else's. A Spark task reads ``[start, end)`` of one
partition: it creates the channel on the partition's leader, moves it to ``start`` with
``POST /channel/setoffset virtual_queue:<start>``, subscribes ordered (every message then
carries its offset and raw size), keeps the messages whose offset is in the range, and stops at
the first one that ends at or past ``end``. Reading the same range again gives the same rows
while the data is retained.

**Driver** (vanilla NSQ, or ``mode=driver``). One consumer per topic on the driver (the same
channel name on each) pulls up to ``maxMessagesPerTrigger`` messages per micro-batch in all,
writes them to a write-ahead file under ``walPath`` (a local path or a URI of HDFS or an
object store, see :mod:`.wal`) before handing them to Spark (a replayed batch is read from
there, identical), keeps them in flight (touching them) and finishes them only when Spark
commits the batch. If the driver dies, nsqd redelivers what was not finished: at-least-once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from ..admin import NsqdAdmin
from ..errors import (
    ConfigError,
    DiscoveryError,
    LookupdUnavailableError,
    NsqError,
    UnsupportedByServerError,
)
from ..lookup import LookupClient
from ..lookup.http import tls_context
from ..lookup.wire import NodeInfo
from ..sync import Consumer, Message, shared_loop
from .options import Endpoint, OptionError, ReadOptions
from .rows import message_row
from .topics import TopicSet, list_topics
from .wal import WriteAheadLog, redact_location

__all__ = [
    "DataLossError",
    "DriverReader",
    "Extent",
    "apply_byte_limit",
    "check_ending",
    "check_retained",
    "fetch_extents",
    "fetch_topic_extents",
    "resolve_topics",
]

log = logging.getLogger("nsq_ha.spark")


class DataLossError(NsqError):
    """The offsets a query must read next are no longer retained by nsqd."""


def _run(coro: Any, timeout: float | None = None) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, shared_loop()).result(timeout)


# -- replayable source: extents, limits, ranges ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Extent:
    """What a partition retains: ``[start, end)`` in queue bytes (``backend_start``,
    ``backend_depth`` of its leader's ``/stats``)."""

    start: int
    end: int


async def _leaders(lookupd: Sequence[str], topic: str) -> tuple[bool, dict[int, NodeInfo]]:
    async with LookupClient(list(lookupd)) as lookup:
        pmap = await lookup.lookup(topic, "w", force=True)
    return pmap.fork, dict(pmap.partitions)


def is_fork(endpoint: Endpoint, topic: str | None = None) -> bool:
    """Whether ``topic`` (default: the endpoint's) is on the fork in cluster mode (found
    through lookupd)."""
    if not endpoint.lookupd:
        return False
    fork, _ = _run(_leaders(endpoint.lookupd, endpoint.topic if topic is None else topic), 30.0)
    return bool(fork)


def resolve_topics(endpoint: Endpoint, topics: TopicSet, timeout: float = 30.0) -> list[str]:
    """The topics ``topics`` names now: its names, or those nsqlookupd lists that match its
    pattern (one ``GET /topics`` per nsqlookupd)."""
    if topics.fixed:
        return list(topics.names)
    listed = _run(list_topics(endpoint.lookupd, timeout), timeout + 5.0)
    return [t for t in listed if topics.matches(t)]


async def _extents(lookupd: Sequence[str], topic: str) -> dict[int, Extent]:
    return (await _leaders_and_extents(lookupd, topic))[1]


async def _leaders_and_extents(
    lookupd: Sequence[str], topic: str, only: int | None = None
) -> tuple[dict[int, NodeInfo], dict[int, Extent]]:
    """Each partition's leader (one lookup) and retained range (its leader's ``/stats``, one
    request per partition); with ``only``, that partition's range alone (one request)."""
    fork, leaders = await _leaders(lookupd, topic)
    if not fork:
        raise UnsupportedByServerError(
            f"{topic!r} is not on the fork in cluster mode: the replayable source needs "
            "partition offsets (use mode=driver)"
        )
    result: dict[int, Extent] = {}
    wanted = (
        sorted(leaders.items())
        if only is None
        else [(only, leaders[only])]
        if only in leaders
        else []
    )
    async with httpx.AsyncClient(timeout=10.0, verify=tls_context()) as http:
        for partition, node in wanted:
            entries = await NsqdAdmin(node.http_url, http=http).topic_stats(topic, partition)
            for entry in entries:
                if entry.get("topic_name") == topic and entry.get("topic_partition") == str(
                    partition
                ):
                    start = int(entry["backend_start"])
                    end = int(entry["backend_depth"])
                    result[partition] = Extent(start, max(start, end))
                    break
            else:
                raise DiscoveryError(
                    f"the leader {node.address} of {topic}/{partition} does not list it in /stats"
                )
    return leaders, result


def fetch_extents(endpoint: Endpoint) -> dict[int, Extent]:
    """Each partition's retained range, from its leader (raises if the topic is not on the
    fork in cluster mode)."""
    return dict(_run(_extents(endpoint.lookupd, endpoint.topic), 60.0))


def fetch_topic_extents(
    endpoint: Endpoint, topics: Sequence[str], *, skip_missing: bool = False
) -> dict[str, dict[int, Extent]]:
    """Each partition's retained range of each topic (the topics asked at once). A topic
    that is not there, not yet writable, or not on the fork raises, or with ``skip_missing``
    (topics a pattern found: one may be deleted or still being made) is left out and logged;
    nsqlookupd not answering raises either way."""

    async def one(topic: str) -> dict[int, Extent] | None:
        try:
            return await _extents(endpoint.lookupd, topic)
        except LookupdUnavailableError:
            raise
        except (DiscoveryError, UnsupportedByServerError) as exc:
            if not skip_missing:
                raise
            log.info("%s: left out for now: %s", topic, exc)
            return None

    async def every() -> list[dict[int, Extent] | None]:
        gate = asyncio.Semaphore(16)  # a pattern may match many topics: 16 at a time

        async def gated(topic: str) -> dict[int, Extent] | None:
            async with gate:
                return await one(topic)

        return await asyncio.gather(*(gated(t) for t in topics))

    if not topics:
        return {}
    found = _run(every(), 60.0 + 10.0 * (len(topics) // 16))
    return {t: e for t, e in zip(topics, found, strict=True) if e is not None}


#: a partition of the byte limit: a partition number, or a (topic, partition)
K = TypeVar("K", int, tuple[str, int])


def apply_byte_limit(
    start: Mapping[K, int], ends: Mapping[K, int], max_bytes: int | None
) -> dict[K, int]:
    """The end offsets of the next batch: all of ``ends``, or, with ``max_bytes``, at most that
    many bytes shared fairly between the partitions that have data (water-filling: a partition
    with little data leaves its share to the others). An end may fall inside a message: the
    message that starts before it belongs to this batch."""
    wanted = {p: max(0, end - start.get(p, end)) for p, end in ends.items()}
    if max_bytes is None or sum(wanted.values()) <= max_bytes:
        return dict(ends)
    grant = dict.fromkeys(wanted, 0)
    left = max_bytes
    open_parts = sorted(p for p, w in wanted.items() if w > 0)
    while left > 0 and open_parts:
        share = max(1, left // len(open_parts))
        for p in list(open_parts):
            take = min(share, wanted[p] - grant[p], left)
            grant[p] += take
            left -= take
            if grant[p] >= wanted[p]:
                open_parts.remove(p)
            if left <= 0:
                break
    return {p: start.get(p, ends[p]) + grant[p] for p in ends}


def check_retained(
    start: Mapping[int, int],
    extents: Mapping[int, Extent],
    *,
    fail: bool,
    topic: str,
    what: str = "offset",
) -> dict[int, int]:
    """``start`` with every offset nsqd does not hold moved to the partition's first retained
    one, or :class:`DataLossError` when ``fail`` (``failOnDataLoss``, as in Kafka's connector).

    Two cases: an offset before the first retained one (retention deleted those messages),
    and one past the partition's end (the topic was deleted and re-created: the offset counts
    bytes of a queue that is gone, and what the new one holds would never be read). ``what``
    names the offset in the messages (``startingOffsets`` for a batch read)."""
    result = dict(start)
    for p, offset in start.items():
        extent = extents.get(p)
        if extent is None or extent.start <= offset <= extent.end:
            continue
        if offset < extent.start:
            gone = extent.start - offset
            text = (
                f"{topic}/{p}: offsets {offset}..{extent.start} ({gone} bytes) are no longer "
                f"retained by nsqd"
            )
            if fail:
                raise DataLossError(
                    f"{text}; set failOnDataLoss=false to skip to the first retained message"
                )
            log.warning("%s; skipping them (failOnDataLoss=false)", text)
        else:
            text = (
                f"{topic}/{p}: {what} {offset} is past the partition's end {extent.end}: the "
                "topic was deleted and re-created (or the offset is not of this cluster), so "
                f"what it holds now ({extent.start}..{extent.end}) would never be read"
            )
            if fail:
                raise DataLossError(
                    f"{text}; set failOnDataLoss=false to read the partition from its first "
                    f"retained offset {extent.start}"
                )
            log.warning(
                "%s; reading it from its first retained offset %d (failOnDataLoss=false)",
                text,
                extent.start,
            )
        result[p] = extent.start
    return result


def check_ending(
    stop: Mapping[int, int], extents: Mapping[int, Extent], *, fail: bool, topic: str
) -> dict[int, int]:
    """A batch read's ``endingOffsets`` given as positions, checked as :func:`check_retained`
    checks a start: an end past the partition's end (never written there: the topic was
    re-created, or the offset is not of this cluster) or before its first retained offset
    (the range is no longer retained) raises :class:`DataLossError` when ``fail``; otherwise
    it is logged and the range ends at the partition's end (or is empty)."""
    result = dict(stop)
    for p, offset in stop.items():
        extent = extents.get(p)
        if extent is None or extent.start <= offset <= extent.end:
            continue
        if offset > extent.end:
            text = (
                f"{topic}/{p}: endingOffsets {offset} is past the partition's end "
                f"{extent.end} (the topic was deleted and re-created, or those messages were "
                "never written)"
            )
            result[p] = extent.end
            advice, doing = "read up to it", f"reading up to {extent.end}"
        else:
            text = (
                f"{topic}/{p}: endingOffsets {offset} is before the first retained offset "
                f"{extent.start}: the messages up to it are no longer retained by nsqd"
            )
            result[p] = extent.start
            advice, doing = "read nothing of the partition", "nothing of it is read"
        if fail:
            raise DataLossError(f"{text}; set failOnDataLoss=false to {advice}")
        log.warning("%s; %s (failOnDataLoss=false)", text, doing)
    return result


def new_channel_name() -> str:
    """A channel for one query (kept in its offsets, so a restart reuses it)."""
    return f"spark_{uuid.uuid4().hex[:16]}"


# -- driver source: pull, persist, hand out, finish on commit --------------------------------


class DriverReader:
    """The at-least-once source's state on the driver (one per query run).

    ``read(seq)`` pulls the next batch, writes it to ``<walPath>/<seq>.jsonl`` (atomically, see
    :mod:`.wal`) before returning it, and holds the messages; ``commit(seq)`` finishes every
    held message of batches up to ``seq``, returns once nsqd has processed the FINs, and
    deletes the files before ``seq``; ``replay(a,
    b)`` reads batches ``a..b`` back from the files. A ``walPath`` that cannot be opened raises
    :class:`~.options.OptionError` here, before any message is consumed.

    Several topics (``topics``, ``topicPattern``): one consumer per topic, each on
    ``channel``; a batch takes from them in turn, so ``maxMessagesPerTrigger`` is shared
    between the topics that have messages. ``topicPattern`` is matched once, against the
    topics nsqlookupd lists when the first batch is read: a topic made later is not read
    until the query restarts. ``assign`` is refused (vanilla topics have no partitions).
    """

    def __init__(self, opts: ReadOptions, channel: str) -> None:
        if opts.wal_path is None:
            raise ConfigError(
                "mode=driver keeps each batch until Spark commits it: set the option 'walPath' "
                "to a directory under the query's checkpointLocation"
            )
        self.topic_set = opts.topic_set.or_topic(opts.endpoint.topic)
        if self.topic_set.assign is not None:
            raise OptionError(
                "option 'assign' names partitions: the driver source (vanilla nsqd, or "
                "mode=driver) reads whole topics, give 'topics' instead"
            )
        self.opts = opts
        self.channel = channel
        try:
            self.wal = WriteAheadLog(opts.wal_path)
        except ConfigError as exc:
            raise OptionError(f"option 'walPath': {exc}") from None
        #: (topic, its consumer), once the first batch is read
        self._consumers: list[tuple[str, Consumer]] | None = None
        self._held: dict[int, list[Message]] = {}
        self._lock = threading.Lock()
        self._toucher: threading.Thread | None = None
        self._stop = threading.Event()

    def _ensure(self) -> list[tuple[str, Consumer]]:
        if self._consumers is None:
            endpoint = self.opts.endpoint
            where: dict[str, Any] = (
                {"lookupd": list(endpoint.lookupd)}
                if endpoint.lookupd
                else {"nsqd": list(endpoint.nsqd)}
            )
            topics = resolve_topics(endpoint, self.topic_set)
            if not topics:
                log.warning(
                    "%s: no topic matches; nothing is read until the query restarts",
                    self.topic_set.describe(),
                )
            self.wal.create()
            consumers: list[tuple[str, Consumer]] = []
            try:
                for topic in topics:
                    consumer = Consumer(
                        topic,
                        self.channel,
                        **where,
                        max_in_flight=2 * self.opts.max_messages_per_trigger,
                        msg_timeout=self.opts.msg_timeout,
                        max_attempts=0,
                        backoff=None,
                        drain_timeout=1.0,
                        connection=endpoint.security.apply(),
                    )
                    consumers.append((topic, consumer))
            except BaseException:
                for _, consumer in consumers:
                    consumer.close(drain_timeout=0)
                raise
            self._consumers = consumers
            log.info("driver source: reading %s on channel %s", topics, self.channel)
            self._toucher = threading.Thread(
                target=self._touch_loop, name="nsq_ha-spark-touch", daemon=True
            )
            self._toucher.start()
        return self._consumers

    def start(self) -> list[str]:
        """Subscribe now (the first :meth:`read` otherwise does); return the topics read."""
        return [topic for topic, _ in self._ensure()]

    def _touch_loop(self) -> None:
        """Keep held messages from timing out on nsqd while Spark processes their batch."""
        interval = max(0.5, self.opts.msg_timeout / 3)
        while not self._stop.wait(interval):
            with self._lock:
                held = [m for batch in self._held.values() for m in batch]
            for message in held:
                if not message.responded:
                    with contextlib.suppress(NsqError):
                        message.touch()

    def _size_budget(self, consumer: Consumer) -> None:
        """Give every connection room for two batches: the one Spark holds uncommitted (it
        commits a batch only when it plans the next, and plans one only when a read returns
        rows) and the next. nsqd's RDY budget is shared among the connections, so with a
        fixed budget a partition holding all the messages could stop the query for good."""
        batch = self.opts.max_messages_per_trigger
        wanted = 2 * batch * max(1, len(consumer.aio.connections))
        if consumer.aio.max_in_flight != wanted:
            shared_loop().call_soon_threadsafe(consumer.aio.set_max_in_flight, wanted)

    def read(self, seq: int) -> list[tuple[Any, ...]]:
        """Pull batch ``seq`` (may be empty: nothing arrived within ``pollTimeout``): up to
        ``maxMessagesPerTrigger`` messages, one topic after the other in turn."""
        consumers = self._ensure()
        for _, consumer in consumers:
            self._size_budget(consumer)
        limit = self.opts.max_messages_per_trigger
        rows: list[tuple[Any, ...]] = []
        messages: list[Message] = []
        # wait up to pollTimeout for a first message, then only 50 ms for each next one
        deadline = time.monotonic() + self.opts.poll_timeout
        while consumers and len(rows) < limit:
            took = False
            for topic, consumer in consumers:
                if len(rows) >= limit:
                    break
                wait = deadline - time.monotonic()
                if len(consumers) > 1:  # poll each in turn without stalling the others
                    wait = min(wait, 0.0 if took else 0.05 / len(consumers))
                message = consumer.get(timeout=max(0.0, wait))
                if message is None:
                    continue
                took = True
                messages.append(message)
                rows.append(message_row(topic, message, self.opts.row_format))
            if took:
                deadline = time.monotonic() + 0.05
            elif time.monotonic() >= deadline:
                break
        if not rows:
            return rows
        self.wal.write(seq, rows)
        with self._lock:
            self._held[seq] = messages
        return rows

    def replay(self, first: int, last: int) -> Iterator[tuple[Any, ...]]:
        """Batches ``first..last`` from the write-ahead files, exactly as handed out."""
        for seq in range(first, last + 1):
            rows = self.wal.read(seq)
            if rows is None:
                if self.opts.fail_on_data_loss:
                    raise DataLossError(
                        f"batch {seq} of {self.topic_set.describe()} is not in {self.wal}: it "
                        "cannot be replayed (set failOnDataLoss=false to go on without it)"
                    )
                log.warning("batch %d is not in %s; skipped", seq, self.wal)
                continue
            yield from rows

    def commit(self, seq: int) -> None:
        """Finish the messages of every batch up to ``seq`` (on nsqd when this returns); drop
        the files before it."""
        with self._lock:
            done = sorted(s for s in self._held if s <= seq)
            batches = [self._held.pop(s) for s in done]
        finished = 0
        for batch in batches:
            for message in batch:
                if not message.responded:
                    try:
                        message.finish()
                        finished += 1
                    except NsqError as exc:  # nsqd requeued it: it comes again (at-least-once)
                        log.warning("could not finish %r: %s", message, exc)
        if finished:
            self._confirm(seq)
        # the newest committed batch stays on disk: if the checkpoint lost its commit (a
        # crash while Spark wrote it), Spark asks for that batch again
        try:
            self.wal.drop_before(seq)
        except OSError as exc:  # kept for now: the next commit drops them
            log.warning("could not list the batches in %s: %s", self.wal, redact_location(str(exc)))
        if finished:
            log.info("committed batches up to %d: finished %d messages", seq, finished)

    def _confirm(self, seq: int) -> None:
        """Wait until nsqd has processed the FINs: Spark may end this process right after the
        commit (it does after an ``availableNow`` run's last one, without ``stop()``), and a
        FIN still unsent then is lost: nsqd would hand the batch out again."""
        for topic, consumer in self._consumers or ():
            try:
                consumer.sync()
            except NsqError as exc:  # what nsqd did not get comes again (at-least-once)
                log.warning("%s: batch %d: nsqd did not confirm the FINs: %s", topic, seq, exc)

    def close(self) -> None:
        self._stop.set()
        consumers, self._consumers = self._consumers or [], None
        for _, consumer in consumers:
            consumer.close(drain_timeout=1.0)
