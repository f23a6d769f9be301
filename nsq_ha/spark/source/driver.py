"""The driver source's Spark classes (vanilla NSQ, or ``mode=driver``): one consumer on the
driver, its state in :class:`.driver_reader.DriverReader`.

On PySpark 4.2+ it is a full ``DataSourceStreamReader`` (:class:`NsqDriverStreamReader`):

* Spark calls ``stop()`` when the query stops, and the consumer is closed then (what it held
  and Spark had not committed goes back to nsqd at once, instead of when the driver's Python
  process goes away);
* ``Trigger.AvailableNow`` reads what the channel held when the query started (its depth, in
  flight and deferred messages on every nsqd lookupd lists) and then lets the query stop; it
  also stops at the first micro-batch that finds nothing within ``pollTimeout`` (with only
  ``nsqd`` addresses the depth is unknown: that is then the only end);
* a batch's messages are finished as soon as Spark asks for the batch after it (Spark asks
  only once the batch is in its commit log), not only when it plans a batch with rows, so
  the last batch of a run is finished too.

A micro-batch's rows travel to the executor inside its input partition (at most
``maxMessagesPerTrigger`` rows), as PySpark's own wrapper of a simple reader sends them.

Before 4.2 the source is the ``SimpleDataSourceStreamReader`` :class:`NsqDriverReader` (the
admission-control signature ``latestOffset(start, limit)`` that keeps a restart's offsets right
is 4.2's): its consumer closes with the driver's Python source process, and AvailableNow is not
offered.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
from pyspark.sql.datasource import (
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)

from ...admin import NsqdAdmin
from ...errors import ConfigError, NsqError
from ...lookup import LookupClient
from ...lookup.http import ADMIN_TIMEOUT, tls_context
from ..compat import ReadAllAvailable, ReadLimit, SupportsTriggerAvailableNow
from ..options import ReadOptions
from .driver_reader import DriverReader
from .extents import _run

__all__ = ["NsqDriverReader", "NsqDriverStreamReader", "channel_backlog"]

log = logging.getLogger("nsq_ha.spark")

#: a channel's messages not yet finished, in nsqd's ``/stats`` (per channel)
_BACKLOG_FIELDS = ("depth", "in_flight_count", "deferred_count")


class NsqDriverReader(SimpleDataSourceStreamReader):
    """The at-least-once source before PySpark 4.2: see :class:`.driver_reader.DriverReader`.

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


class _Batch(InputPartition):
    """One micro-batch's rows, carried to the executor that hands them to Spark."""

    def __init__(self, seq: int, rows: list[tuple[Any, ...]]) -> None:
        super().__init__(seq)  # the batch number, as ``value``
        self.rows = rows


class NsqDriverStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The at-least-once source on PySpark 4.2+ (see the module's docstring).

    Offsets are batch numbers ``{"seq": n}``, as :class:`NsqDriverReader`'s (a checkpoint of
    either continues with the other)."""

    def __init__(self, opts: ReadOptions) -> None:
        if opts.channel is None:
            raise ConfigError("mode=driver needs the option 'channel'")
        self.opts = opts
        self.channel: str = opts.channel
        self._state: DriverReader | None = None
        #: batches read but not committed yet, by number (the WAL has them too)
        self._batches: dict[int, list[tuple[Any, ...]]] = {}
        #: AvailableNow: how many messages are still to be read (None: not known)
        self._left: int | None = None
        self._available_now = False
        #: AvailableNow: nothing more to read in this run
        self._ended = False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_state": None, "_batches": {}}

    def _reader(self) -> DriverReader:
        if self._state is None:
            self._state = DriverReader(self.opts, self.channel)
        return self._state

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()  # a batch is at most maxMessagesPerTrigger messages

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        if not self.opts.endpoint.lookupd:
            log.info(
                "%s/%s: available now: until a batch finds nothing within pollTimeout (%s s; "
                "with 'nsqd' addresses the channel's depth is not known)",
                self.opts.endpoint.topic,
                self.channel,
                self.opts.poll_timeout,
            )
            return
        topics = self._reader().start()  # subscribe first: a new channel holds the backlog
        self._left = channel_backlog(self.opts, self.channel, topics)
        log.info(
            "%s/%s: available now: %d messages", self.opts.endpoint.topic, self.channel, self._left
        )

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        seq = int(start["seq"])
        reader = self._reader()
        # Spark asks for the batch after ``seq`` only once ``seq`` is in its commit log
        self._commit(reader, seq)
        if self._ended:
            return start
        rows = reader.read(seq + 1)
        if not rows:
            if self._available_now:
                self._end(f"nothing arrived within pollTimeout ({self.opts.poll_timeout} s)")
            return start
        self._batches[seq + 1] = rows
        if self._left is not None:
            self._left -= len(rows)
            if self._left <= 0:
                self._end("read what the channel held when the query started")
        return {"seq": seq + 1}

    def _end(self, why: str) -> None:
        self._ended = True
        log.info("%s/%s: available now: done: %s", self.opts.endpoint.topic, self.channel, why)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        reader = self._reader()
        batches: list[InputPartition] = []
        for seq in range(int(start["seq"]) + 1, int(end["seq"]) + 1):
            rows = self._batches.get(seq)
            if rows is None:  # a batch of an earlier run, planned again after a restart
                rows = list(reader.replay(seq, seq))
            if rows:
                batches.append(_Batch(seq, rows))
        return batches

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, _Batch):
            if partition is None or (type(partition) is InputPartition and partition.value is None):
                return iter(())  # what Spark plans in place of an empty list of partitions
            raise TypeError(f"not a partition of the nsq driver source: {partition!r}")
        return iter(partition.rows)

    def commit(self, end: dict[str, Any]) -> None:
        self._commit(self._reader(), int(end["seq"]))

    def _commit(self, reader: DriverReader, seq: int) -> None:
        if seq <= 0:
            return
        reader.commit(seq)
        for done in [s for s in self._batches if s <= seq]:
            del self._batches[done]

    def stop(self) -> None:
        """The query stopped: close the consumer (what Spark did not commit goes back)."""
        if self._state is not None:
            log.info("%s/%s: the query stopped; closing", self.opts.endpoint.topic, self.channel)
            self._state.close()
            self._state = None


def channel_backlog(opts: ReadOptions, channel: str, topics: Sequence[str]) -> int:
    """The messages ``channel`` has not finished on every nsqd lookupd lists for ``topics``:
    its depth, in flight and deferred counts in ``/stats`` (a topic with no channel at all
    counts its own depth: vanilla nsqd hands that to its first channel)."""
    return sum(int(_run(_backlog(opts, channel, topic), 60.0)) for topic in topics)


async def _backlog(opts: ReadOptions, channel: str, topic: str) -> int:
    total = 0
    async with (
        LookupClient(list(opts.endpoint.lookupd)) as lookup,
        httpx.AsyncClient(timeout=ADMIN_TIMEOUT, verify=tls_context()) as http,
    ):
        pmap = await lookup.lookup(topic, "r", force=True)
        targets = (
            [(node, p) for p, node in sorted(pmap.partitions.items())]
            if pmap.fork
            else [(node, None) for node in pmap.producers]
        )
        for node, partition in targets:
            try:
                entries = await NsqdAdmin(node.http_url, http=http).topic_stats(topic, partition)
            except NsqError as exc:
                log.warning("%s: no backlog from %s: %s", topic, node.address, exc)
                continue
            for entry in entries:
                channels = [c for c in entry.get("channels") or () if isinstance(c, dict)]
                mine = [c for c in channels if c.get("channel_name") == channel]
                if mine:
                    total += sum(int(c.get(f) or 0) for c in mine for f in _BACKLOG_FIELDS)
                elif not channels:
                    total += int(entry.get("depth") or 0)
    return total
