"""The driver source's state (vanilla NSQ, or ``mode=driver``), without pyspark.

One consumer per topic on the driver (the same channel name on each) pulls up to
``maxMessagesPerTrigger`` messages per micro-batch in all, writes them to a write-ahead file
under ``walPath`` (a local path or a URI of HDFS or an object store, see :mod:`.wal`) before
handing them to Spark (a replayed batch is read from there, identical), keeps them in flight
(touching them) and finishes them only when Spark commits the batch. If the driver dies, nsqd
redelivers what was not finished: at-least-once. The Spark classes are in :mod:`.driver`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from ...errors import ConfigError, NsqError
from ...sync import Consumer, Message, shared_loop
from ..locations import redact_location
from ..options import OptionError, ReadOptions
from ..rows import message_row
from .extents import DataLossError, resolve_topics
from .wal import WriteAheadLog

__all__ = ["DriverReader"]

log = logging.getLogger("nsq_ha.spark")


class DriverReader:
    """The at-least-once source's state on the driver (one per query run).

    ``read(seq)`` pulls the next batch, writes it to ``<walPath>/<seq>.jsonl`` (atomically, see
    :mod:`.wal`) before returning it, and holds the messages; ``commit(seq)`` finishes every
    held message of batches up to ``seq``, returns once nsqd has processed the FINs, and
    deletes the files before ``seq``; ``replay(a,
    b)`` reads batches ``a..b`` back from the files. A ``walPath`` that cannot be opened raises
    :class:`~nsq_ha.spark.options.OptionError` here, before any message is consumed.

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
