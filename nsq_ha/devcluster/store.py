"""The embedded broker's state for one topic partition: pure, no I/O, the clock passed in.

What it reproduces of the fork's nsqd (PROTOCOL.md §4, §6.7, §9 items 6-8):

* **the log**: every message gets the next internal id (the first of a new partition is **2**),
  a queue offset (0 for the first record, then each record starts where the previous ended) and
  a raw size (``4 + 26 + len(body)``; ext topics ``+1``, ``+3 + len(header)`` with a header);
* **channels** start at the partition's end when created, keep their own cursor into the log,
  a requeue queue, deferred messages (REQ with a delay) and an in-flight table keyed by internal
  id with the owning client and a deadline; ``attempts`` grows on each delivery;
* **ordered channels** have at most one message in flight across all clients; the same message
  comes back (same id and offset) after a REQ or a timeout; REQ with a delay is ignored;
* **requeued before unread**: nsqd's message pump selects between its requeued and its read
  channels at random when both are ready; the store always takes requeued messages first, one
  of the orders the real server can produce (a conformance test must not expect either);
* **seek** (``/channel/setoffset``): by byte offset (the first record at or after it), by count
  (the N-th message, from 1), by timestamp, or to the end;
* **the message read ahead** (channel.go messagePump): nsqd's channel pump takes the next message
  (requeued first, else the log's) as soon as there is one and waits with it until a consumer
  has room, whether or not one is connected. A seek resets the reader under it, and the pump
  then still delivers the message it holds: :meth:`Channel.seek` keeps that message
  (:attr:`Channel.ahead`) and hands it out first. The same reset forgets what is in flight (its
  FIN answers "not in flight" and its holder gets the RDY room back). A copy of the held
  message at the new position is not delivered again (nsqd finds it in flight or confirmed);
  on an ordered channel the message after the held one goes out twice under one id, because
  the FIN of the held one makes nsqd reset its reader once more (:meth:`Channel.replay`).
  ``depth_ts_nano`` in ``/stats`` is the timestamp of the last message the pump read from the
  log, 0 after a seek (:attr:`Channel.read_ts`).

The TCP and HTTP servers around it decide *which client* may take a message (RDY, sample rate,
tags) and call :meth:`Channel.take`; they also call :meth:`Channel.expire` on a timer.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from nsq_ha.errors import InvalidArgumentError
from nsq_ha.protocol.broker import join_fork_id

__all__ = ["Channel", "InFlight", "NotOwnedError", "Partition", "StoredMessage", "record_size"]

#: u32 record length + i64 timestamp + u16 attempts + u64 id + u64 trace id
RECORD_OVERHEAD = 4 + 26
#: internal id of the first message of a new partition (observed on the real fork)
FIRST_INTERNAL_ID = 2
#: nsqd caps the attempts counter here
MAX_ATTEMPTS = 4000
#: how long after its publish nsqd's channel pump is taken to hold a message (seconds): a
#: SUB_ORDERED sooner finds nothing held (recorded on the fork: no second copy; after 1 s: two)
HOLD_AFTER = 0.1
#: nsqd's ``--req-to-end-threshold`` (seconds): a longer REQ delay goes to the delayed queue
REQ_TO_END_THRESHOLD = 15 * 60.0


def record_size(body: bytes, *, ext_topic: bool, header: bytes | None = None) -> int:
    """Bytes the fork's disk queue uses for one message: the raw size it reports (§4.6)."""
    if not ext_topic:
        return RECORD_OVERHEAD + len(body)
    if header is None:
        return RECORD_OVERHEAD + 1 + len(body)
    return RECORD_OVERHEAD + 3 + len(header) + len(body)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One record of a partition's log."""

    internal_id: int
    trace_id: int
    offset: int
    raw_size: int
    timestamp: int
    body: bytes
    ext_version: int = 0
    ext_data: bytes = b""

    @property
    def id(self) -> bytes:
        """The 16-byte id clients see (internal id + trace id)."""
        return join_fork_id(self.internal_id, self.trace_id)

    @property
    def end(self) -> int:
        """Offset where the next record starts."""
        return self.offset + self.raw_size


class NotOwnedError(KeyError):
    """FIN/REQ/TOUCH of a message in flight for another client, or deferred by a REQ with a
    delay (``holder`` None: nsqd's deferred messages belong to nobody)."""

    def __init__(self, holder: Hashable | None) -> None:
        super().__init__("client does not own message")
        self.holder = holder


@dataclass(slots=True)
class InFlight:
    """A delivered message waiting for FIN/REQ: who has it, until when, which attempt."""

    message: StoredMessage
    client: Hashable
    attempts: int
    deadline: float


class Partition:
    """One topic partition: an append-only log and its channels."""

    def __init__(
        self,
        topic: str,
        partition: int,
        *,
        ordered: bool = False,
        ext: bool = False,
        clock: Callable[[], float],
        wall_clock_ns: Callable[[], int],
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.ordered = ordered
        self.ext = ext
        self._clock = clock
        self._wall_ns = wall_clock_ns
        self.log: list[StoredMessage] = []
        self.next_id = FIRST_INTERNAL_ID
        self.end = 0
        self.channels: dict[str, Channel] = {}
        #: nsqd's ``clientPubStats``: a TCP publisher's ``/stats`` entry by its remote address
        self.publishers: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"<Partition {self.topic}-{self.partition} messages={len(self.log)} end={self.end}>"

    def append(
        self, body: bytes, *, trace_id: int = 0, header: bytes | None = None
    ) -> StoredMessage:
        """Store one message (the caller checked names, sizes and leadership)."""
        if header is not None and not self.ext:
            raise InvalidArgumentError(f"{self.topic} is not an ext topic: no header allowed")
        size = record_size(body, ext_topic=self.ext, header=header)
        message = StoredMessage(
            internal_id=self.next_id,
            trace_id=trace_id,
            offset=self.end,
            raw_size=size,
            timestamp=self._wall_ns(),
            body=body,
            ext_version=4 if header is not None else 0,
            ext_data=header or b"",
        )
        self.log.append(message)
        self.next_id += 1
        self.end = message.end
        return message

    def now(self) -> float:
        """The clock the channels' deadlines are on."""
        return self._clock()

    def wall_ns(self) -> int:
        """The wall clock messages are stamped with (Unix ns)."""
        return self._wall_ns()

    def count_publish(self, remote: str, user_agent: str, count: int, *, failed: bool) -> None:
        """A TCP client published ``count`` messages here, or failed to: its entry is made at
        its first publish (the user agent and the time then, in Unix seconds), as nsqd's
        ``InitPubClientStats`` does."""
        entry = self.publishers.get(remote)
        if entry is None:
            entry = self.publishers[remote] = {
                "remote_address": remote,
                "user_agent": user_agent,
                "protocol": "tcp",
                "pub_count": 0,
                "err_count": 0,
                "last_pub_ts": self._wall_ns() // 1_000_000_000,
            }
        entry["err_count" if failed else "pub_count"] += count

    def channel(self, name: str) -> Channel:
        """The channel ``name``, created at the partition's current end if new."""
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(self, name, ordered=self.ordered)
            self.channels[name] = channel
        return channel

    def index_at_offset(self, offset: int) -> int:
        """Index of the first record starting at or after ``offset`` (len(log) past the end)."""
        low, high = 0, len(self.log)
        while low < high:
            middle = (low + high) // 2
            if self.log[middle].offset < offset:
                low = middle + 1
            else:
                high = middle
        return low


@dataclass(order=True, slots=True)
class _Deferred:
    due: float
    sequence: int
    message: StoredMessage = field(compare=False)
    attempts: int = field(compare=False)
    #: deferred by a REQ with a delay (nsqd keeps those in flight until they are due)
    delayed: bool = field(default=False, compare=False)
    #: in nsqd's delayed queue (a REQ delay over :data:`REQ_TO_END_THRESHOLD`)
    to_end: bool = field(default=False, compare=False)


class Channel:
    """One channel of a partition: cursor, requeued and deferred messages, in-flight table."""

    def __init__(self, partition: Partition, name: str, *, ordered: bool = False) -> None:
        self.partition = partition
        self.name = name
        self.ordered = ordered
        self.cursor = len(partition.log)  # new channels start at the end
        self.requeued: deque[tuple[StoredMessage, int]] = deque()
        self.deferred: list[_Deferred] = []
        self.in_flight: dict[int, InFlight] = {}
        self.attempts: dict[int, int] = {}
        self._sequence = 0
        self.finished = 0
        self.requeue_count = 0
        self.timeout_count = 0
        #: the message (and its attempts so far) nsqd's pump held when the channel last moved
        self.ahead: tuple[StoredMessage, int] | None = None
        #: internal id of the last message kept as :attr:`ahead`, while its log copy may come
        self._ahead_id: int | None = None
        self._ahead_finished = False
        #: ordered channels: the FIN of the held message makes the next one go out twice
        self._echo = False
        self._replay: InFlight | None = None
        self._read_ts = 0
        #: nsqd's ``requireOrder``: set by the first SUB_ORDERED (or ``setorder=true``)
        self._order_required = False
        #: the offset the last seek moved to (nsqd's confirmed position then): what is in
        #: flight from before it is not in ``/stats`` depth
        self.floor = 0

    def __repr__(self) -> str:
        return (
            f"<Channel {self.partition.topic}-{self.partition.partition}/{self.name} "
            f"depth={self.depth} in_flight={len(self.in_flight)}>"
        )

    @property
    def depth(self) -> int:
        """Messages not yet finished and not in flight (what ``/stats`` calls depth)."""
        unread = len(self.partition.log) - self.cursor
        return unread + len(self.requeued) + len(self.deferred) - self.delayed_queue_count

    @property
    def delayed_count(self) -> int:
        """Messages deferred by a REQ with a delay and not yet due back (nsqd counts them in
        flight and as ``deferred_count``)."""
        return sum(1 for item in self.deferred if item.delayed)

    @property
    def delayed_queue_count(self) -> int:
        """Messages a long REQ sent to nsqd's delayed queue, not yet due back."""
        return sum(1 for item in self.deferred if item.to_end)

    def _due(self, now: float) -> None:
        while self.deferred and self.deferred[0].due <= now:
            item = heapq.heappop(self.deferred)
            if item.delayed:  # nsqd counts the requeue when the delay is over
                self.requeue_count += 1
            self.requeued.append((item.message, item.attempts))

    def _reads_ahead(self) -> bool:
        """True when nsqd's pump has read the message at the cursor already (it holds it, or
        has it read while it holds a requeued one)."""
        return (
            self.ahead is None
            and not (self.ordered and self.in_flight)
            and self.cursor < len(self.partition.log)
        )

    @property
    def not_read(self) -> int:
        """Messages of the log the pump has not read yet (nsqd's ``GetChannelNotReadCnt``)."""
        unread = len(self.partition.log) - self.cursor
        return unread - 1 if self._reads_ahead() else unread

    @property
    def read_ts(self) -> int:
        """What the fork's ``/stats`` calls ``depth_ts_nano``: the timestamp of the message the
        channel pump read from the log last. It reads the next one as soon as nothing it holds
        is waiting (an ordered channel: nothing in flight either); 0 after a seek until then."""
        if not self.requeued and self._reads_ahead():
            return self.partition.log[self.cursor].timestamp
        return self._read_ts

    def peek(self, now: float) -> StoredMessage | None:
        """The message :meth:`take` would hand out now, left where it is."""
        if self.ordered and self.in_flight:
            return None
        if self.ahead is not None:
            return self.ahead[0]
        self._due(now)
        if self.requeued:
            return self.requeued[0][0]
        if self.cursor < len(self.partition.log):
            return self.partition.log[self.cursor]
        return None

    def _next(self, now: float) -> tuple[StoredMessage, int] | None:
        if self.ahead is not None:
            item, self.ahead = self.ahead, None
            return item
        self._due(now)
        if self.requeued:
            return self.requeued.popleft()
        log = self.partition.log
        while self.cursor < len(log):
            message = log[self.cursor]
            self.cursor += 1
            self._read_ts = message.timestamp
            if message.internal_id == self._ahead_id:
                self._ahead_id = None
                if message.internal_id in self.in_flight or self._ahead_finished:
                    continue  # the held copy went out already
            return message, 0
        return None

    def has_ready(self, now: float) -> bool:
        """True when :meth:`take` would return a message now."""
        if self.ordered and self.in_flight:
            return False
        if self.ahead is not None or self.requeued or self.cursor < len(self.partition.log):
            return True
        return bool(self.deferred) and self.deferred[0].due <= now

    def take(self, client: Hashable, msg_timeout: float, now: float) -> InFlight | None:
        """Hand the next message to ``client`` (attempts + 1), or ``None``.

        Ordered channels hand out nothing while a message is in flight.
        """
        if self.ordered and self.in_flight:
            return None
        item = self._next(now)
        if item is None:
            return None
        message, attempts = item
        attempts = min(MAX_ATTEMPTS, attempts + 1)
        flight = InFlight(message, client, attempts, now + msg_timeout)
        self.in_flight[message.internal_id] = flight
        if self._echo and attempts == 1:
            self._echo = False
            self._replay = flight
        return flight

    def require_order(self, required: bool = True) -> None:
        """``SUB_ORDERED`` or ``/channel/setorder`` (nsqd's ``SetOrdered``). Turning it on the
        first time resets nsqd's reader: the message its pump holds still goes out, then the
        reset forgets it and reads it again, so it goes out twice under one id (:meth:`replay`)
        when the pump held it: published :data:`HOLD_AFTER` s ago or more (a race on the
        fork, which sends one copy when the subscription follows the publish at once)."""
        first = required and not self._order_required
        self._order_required = self.ordered = required
        log = self.partition.log
        if first and not self.in_flight and self.ahead is None and not self.requeued:
            age = (
                (self.partition.wall_ns() - log[self.cursor].timestamp) / 1e9
                if self.cursor < len(log)
                else -1.0
            )
            self._echo = age >= HOLD_AFTER

    def replay(self) -> InFlight | None:
        """After :meth:`take` on an ordered channel whose held message was just finished: the
        message handed out, which nsqd's second reset forgets (no requeue; its holder gets the
        RDY room back) and sends again, same id and attempts. ``None`` otherwise."""
        flight, self._replay = self._replay, None
        if flight is None or self.in_flight.get(flight.message.internal_id) is not flight:
            return None
        del self.in_flight[flight.message.internal_id]
        self.requeued.appendleft((flight.message, flight.attempts - 1))
        return flight

    def _owned(self, internal_id: int, client: Hashable) -> InFlight:
        flight = self.in_flight.get(internal_id)
        if flight is None:
            if any(d.delayed and d.message.internal_id == internal_id for d in self.deferred):
                raise NotOwnedError(None)
            raise KeyError("Message ID not in flight")
        if flight.client != client:
            raise NotOwnedError(flight.client)
        return flight

    def finish(self, internal_id: int, client: Hashable) -> StoredMessage:
        """FIN; KeyError (``Message ID not in flight``) if the client does not hold it."""
        flight = self._owned(internal_id, client)
        del self.in_flight[internal_id]
        self.finished += 1
        if internal_id == self._ahead_id:
            self._ahead_finished = True
            self._echo = self.ordered
        return flight.message

    def requeue(self, internal_id: int, client: Hashable, delay: float, now: float) -> bool:
        """REQ; returns False when ignored (ordered channel with a delay, as nsqd does).

        A delay over :data:`REQ_TO_END_THRESHOLD` on a channel neither ordered nor ephemeral
        sends the message to nsqd's delayed queue (protocol_v2.go REQ, requeueToEnd): it is
        finished, and a copy is due back after the delay, counted in
        :attr:`delayed_queue_count`, neither deferred nor in flight (the fork's copy has a new
        id; this one keeps its own)."""
        flight = self._owned(internal_id, client)
        if self.ordered and delay > 0:
            return False
        del self.in_flight[internal_id]
        if delay > REQ_TO_END_THRESHOLD and not self.name.endswith("#ephemeral"):
            self.finished += 1
            self._sequence += 1
            item = _Deferred(now + delay, self._sequence, flight.message, flight.attempts)
            item.to_end = True
            heapq.heappush(self.deferred, item)
            return True
        if delay <= 0:
            self.requeue_count += 1
        self._back(flight, now + delay, delayed=delay > 0)
        return True

    def touch(self, internal_id: int, client: Hashable, msg_timeout: float, now: float) -> None:
        """TOUCH: the deadline moves to now + ``msg_timeout``."""
        self._owned(internal_id, client).deadline = now + msg_timeout

    def expire(self, now: float) -> list[InFlight]:
        """Time out every in-flight message past its deadline; they go back to the queue."""
        expired = [f for f in self.in_flight.values() if f.deadline <= now]
        for flight in expired:
            del self.in_flight[flight.message.internal_id]
            self.timeout_count += 1
            self.requeue_count += 1  # nsqd's doRequeue counts timeouts too
            self._back(flight, now)
        return expired

    def release(self, client: Hashable, now: float) -> None:
        """A client left: what it held goes back at once, counted as a requeue, and with its
        attempt taken back (nsqd's RequeueMessage with ``byClient=false``)."""
        for flight in [f for f in self.in_flight.values() if f.client == client]:
            del self.in_flight[flight.message.internal_id]
            self.requeue_count += 1
            flight.attempts = max(0, flight.attempts - 1)
            self._back(flight, now)

    def _back(self, flight: InFlight, due: float, *, delayed: bool = False) -> None:
        if self.ordered:
            # the same message is next again: nothing behind it may overtake it
            self.requeued.appendleft((flight.message, flight.attempts))
            return
        self._sequence += 1
        item = _Deferred(due, self._sequence, flight.message, flight.attempts, delayed)
        heapq.heappush(self.deferred, item)

    def seek(
        self,
        *,
        offset: int | None = None,
        count: int | None = None,
        timestamp_ns: int | None = None,
        end: bool = False,
        read_ahead: bool = True,
    ) -> list[InFlight]:
        """``/channel/setoffset``: move the cursor; requeued and deferred messages are dropped,
        what is in flight is forgotten (returned: its holders get their RDY room back) and the
        message the pump held is kept to go out first (unless ``read_ahead`` is false, or the
        pump holds nothing: ordered with a message in flight, nothing to read)."""
        log = self.partition.log
        if end:
            index = len(log)
        elif offset is not None:
            index = self.partition.index_at_offset(offset)
        elif count is not None:
            if count < 1:
                raise InvalidArgumentError(f"msgcount must be >= 1, got {count}")
            index = min(len(log), count - 1)
        elif timestamp_ns is not None:
            index = next((i for i, m in enumerate(log) if m.timestamp >= timestamp_ns), len(log))
        else:
            raise InvalidArgumentError("seek needs offset, count, timestamp_ns or end")
        if read_ahead and self.ahead is None and not (self.ordered and self.in_flight):
            self._due(self.partition.now())
            if self.requeued:
                self.ahead = self.requeued.popleft()
            elif self.cursor < len(log):
                self.ahead = (log[self.cursor], 0)
        self._ahead_id = None if self.ahead is None else self.ahead[0].internal_id
        self._ahead_finished = False
        forgotten = list(self.in_flight.values())
        self.in_flight.clear()
        self._echo = False
        self._replay = None
        self._read_ts = 0
        self.cursor = index
        self.floor = log[index].offset if index < len(log) else self.partition.end
        self.requeued.clear()
        self.deferred.clear()
        return forgotten
