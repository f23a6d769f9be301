"""A consumer's subscriptions: one :class:`Slot` per (nsqd, partition) connection.

A slot owns its connection and ``held`` (delivered, not yet answered: the one in-flight count,
changed with the planner's in :meth:`Slot._hold` and :meth:`Slot._release` only). Answers take
one path: :class:`Message` -> its slot -> the slot's connection. :class:`Flow` sends the RDY
the :class:`~nsq_ha.consumer.rdy.RdyPlanner` decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Final, NoReturn, cast

from nsq_ha.connection import NsqdConnection
from nsq_ha.consumer.backoff import Exponential
from nsq_ha.consumer.config import ConsumerConfig
from nsq_ha.consumer.message import Message, Outcome
from nsq_ha.consumer.rdy import DEFAULT_MAX_RDY, RdyPlanner
from nsq_ha.errors import (
    BrokerError,
    MessageCommandError,
    MessageConnectionGoneError,
    MessageResponseError,
    NsqError,
)
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.transport import Wakeup

log = logging.getLogger(__name__)

#: A connection's identity: nsqd address and partition (-1 for none).
ConnKey = tuple[str, int]

_COUNTER: Final = {outcome: outcome.value.replace(" ", "_") for outcome in Outcome}
_ACTION: Final = {Outcome.FINISHED: "finish", Outcome.REQUEUED: "requeue"}

#: the counters ``Consumer.stats`` sums over the partitions
TOTALS = ("received", "finished", "requeued", "timed_out", "given_up", "abandoned")
#: every counter of a partition (``Consumer.stats`` shows those above 0)
COUNTERS = (*TOTALS, "leader_changes")


class Tally:
    """The consumer's counters per partition (-1: vanilla); totals are summed when asked.

    A message counts once, in its partition's plain dict (every name of :data:`COUNTERS` at 0
    first): a second, total counter cost as much as decoding the header, and a ``Counter``
    (``__delitem__`` defined in Python) about 750 instructions per item access, four a message."""

    __slots__ = ("partitions",)

    def __init__(self) -> None:
        self.partitions: dict[int, dict[str, int]] = {}

    def total(self, name: str) -> int:
        """``name``'s count, summed over the partitions."""
        return sum(counter.get(name, 0) for counter in self.partitions.values())

    def of(self, partition: int | None) -> dict[str, int]:
        """The counters of ``partition`` (made on first use)."""
        key = -1 if partition is None else partition
        return self.partitions.setdefault(key, dict.fromkeys(COUNTERS, 0))


class Flow:
    """Send the planner's RDY changes to the subscribed connections; back off when it says so.

    Slots tell :attr:`planner` of each message in and out of flight and call :meth:`apply` only
    when the planner changed something, so a steady delivery does not enter this class."""

    __slots__ = (
        "_backoff",
        "_backoff_handle",
        "_name",
        "_redistribute_interval",
        "_redistributor",
        "_sinks",
        "_stopped",
        "planner",
    )

    def __init__(self, config: ConsumerConfig) -> None:
        self._name = f"{config.topic}/{config.channel}"
        self.planner = RdyPlanner(
            config.max_in_flight,
            idle_timeout=config.low_rdy_idle_timeout,
            hold_timeout=config.low_rdy_timeout,
            clock=time.monotonic,
        )
        self._backoff = config.backoff or Exponential()
        self._redistribute_interval = config.rdy_redistribute_interval
        self._sinks: dict[Hashable, NsqdConnection] = {}
        self._backoff_handle: asyncio.TimerHandle | None = None
        self._redistributor: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> None:
        """Start the periodic redistribution (once, before :meth:`stop`; on the running loop)."""
        self._redistributor = asyncio.get_running_loop().create_task(
            self._redistribute_loop(), name=f"nsq_ha-rdy-{self._name}"
        )

    def add(
        self, key: Hashable, sink: NsqdConnection, *, max_rdy: int | None, ordered: bool
    ) -> None:
        """A new subscription (ordered ones get RDY 1 at most)."""
        self._sinks[key] = sink
        self.apply(
            self.planner.add(key, max_rdy=max_rdy or DEFAULT_MAX_RDY, cap=1 if ordered else None)
        )

    def remove(self, key: Hashable) -> None:
        """A subscription ended (or retires): its budget goes to the others."""
        self._sinks.pop(key, None)
        self.apply(self.planner.remove(key))

    async def stop(self) -> None:
        """RDY 0 everywhere, for good: no backoff timer, no redistribution."""
        self._stopped = True
        if self._backoff_handle is not None:
            self._backoff_handle.cancel()
            self._backoff_handle = None
        task, self._redistributor = self._redistributor, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.apply(self.planner.stop())

    def apply(self, changes: Mapping[Hashable, int]) -> None:
        """Send the RDY changes; start a backoff wait when the planner blocked."""
        if not changes and not self.planner.blocked:
            return  # a message's usual answer: nothing to do
        for key, value in changes.items():
            sink = self._sinks.get(key)
            if sink is None or sink.closed:
                continue
            try:
                sink.rdy(value)
            except NsqError as exc:  # closing or closed: its watcher reports it
                log.debug("RDY %d to %s not sent: %s", value, key, exc)
        if self.planner.blocked and self._backoff_handle is None and not self._stopped:
            delay = self._backoff.delay(self.planner.level)
            log.warning(
                "%s: backing off (level %d): every connection paused for %.2f s",
                self._name,
                self.planner.level,
                delay,
            )
            self._backoff_handle = asyncio.get_running_loop().call_later(
                delay, self._backoff_elapsed
            )

    def _backoff_elapsed(self) -> None:
        self._backoff_handle = None
        if not self._stopped:
            self.apply(self.planner.backoff_elapsed())

    async def _redistribute_loop(self) -> None:
        while True:
            await asyncio.sleep(self._redistribute_interval)
            self.apply(self.planner.redistribute())


@dataclass(slots=True)
class SlotContext:
    """What every slot of one consumer shares; each part is called one way."""

    config: ConsumerConfig
    #: sends RDY; its planner (also here) is told of each message in and out of flight
    flow: Flow
    planner: RdyPlanner
    tally: Tally
    #: woken whenever a held message is answered or dropped
    held_changed: Wakeup
    #: a message arrived and is held: hand it on
    deliver: Callable[[Slot, Message], None]
    #: an ordered message was finished or requeued
    settled: Callable[[Message], None]
    #: the warning that ordered channels ignore requeue delays was logged
    warned_delay: bool = False


class Slot:
    """One subscribed connection: a (node, partition) of the topic, and what it delivered."""

    __slots__ = (
        "address",
        "channel",
        "conn",
        "counts",
        "ctx",
        "finished",
        "held",
        "key",
        "ordered",
        "partition",
        "retired",
        "topic",
    )

    def __init__(self, ctx: SlotContext, key: ConnKey, ordered: bool) -> None:
        self.ctx = ctx
        self.key = key
        self.address = key[0]
        self.partition = None if key[1] < 0 else key[1]
        self.topic = ctx.config.topic
        self.channel = ctx.config.channel
        self.ordered = ordered
        self.conn: NsqdConnection | None = None  # set once made
        #: delivered and not yet answered, by message id: the one in-flight count
        self.held: dict[bytes, Message] = {}
        #: ordered: the id of the message finished last, whose read-ahead copy may come again
        self.finished = b""
        self.retired = False
        self.counts = ctx.tally.of(self.partition)

    def __repr__(self) -> str:
        part = "-" if self.partition is None else self.partition
        return f"<slot {self.topic}/{part}@{self.address} held={len(self.held)}>"

    def on_message(self, decoded: DecodedMessage) -> None:
        """A message arrived: hold it and hand it on.

        On an ordered channel a copy of the message finished last is finished again, not handed
        out: right after a move (``setoffset``) the fork may deliver what its pump read ahead,
        then the same message from the new position once the first FIN is in (nsqd holds the
        copy in flight; the next message waits for its answer). Our own seek clears it."""
        if self.ordered and decoded.id == self.finished:
            log.info(
                "%s: nsqd delivered message %s again right after it was finished (the copy its "
                "pump read ahead before a move): finished again, not handed out",
                self,
                decoded.id.hex(),
            )
            conn = self.conn
            if conn is not None and not conn.closed:
                with contextlib.suppress(NsqError):  # a closed connection forgets it anyway
                    conn.fin(decoded.id)
            return
        message = Message(decoded, self)
        previous = self.held.get(decoded.id)
        if previous is not None:  # nsqd timed it out and delivered it again
            self._release(previous, success=None)
            self._settle(previous, Outcome.TIMED_OUT)
        self._hold(message)
        self.ctx.deliver(self, message)

    def on_error(self, error: BrokerError) -> None:
        """Non-fatal error frames: FIN/REQ/TOUCH of a message nsqd no longer has in flight."""
        if isinstance(error, MessageCommandError):
            self.counts["timed_out"] += 1
            log.warning("%s: %s (it timed out on nsqd or went to another consumer)", self, error)
        else:
            log.warning("%s: %s", self, error)

    def finish(self, message: Message) -> None:
        self._answer(message, Outcome.FINISHED, success=True, delay=0.0)

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        """REQ ``message`` (``backoff``: count it as a failure) with the config's delays."""
        ctx = self.ctx
        config = ctx.config
        if delay is None:
            delay = min(config.requeue_delay * message.attempts, config.max_requeue_delay)
        elif self.ordered and delay > 0 and not ctx.warned_delay:
            ctx.warned_delay = True
            log.warning(
                "%s: requeue delays are ignored by nsqd on ordered channels (the message would "
                "wait for msg_timeout); requeueing with delay 0",
                self,
            )
        ok = False if backoff and config.backoff is not None else None
        self._answer(message, Outcome.REQUEUED, success=ok, delay=0.0 if self.ordered else delay)

    def touch(self, message: Message) -> None:
        conn = self.conn
        if conn is None or conn.closed or self.held.get(message.id) is not message:
            self.gone(message, "touch")
        try:
            conn.touch(message.id)
        except NsqError as exc:
            raise MessageConnectionGoneError(f"cannot touch {message!r}: {exc}") from exc

    def requeue_now(self, message: Message) -> None:
        """Closing: give ``message`` back at once, without backoff (quietly if it cannot be)."""
        with contextlib.suppress(MessageResponseError):
            self._answer(message, Outcome.REQUEUED, success=None, delay=0.0)

    def _answer(
        self, message: Message, outcome: Outcome, *, success: bool | None, delay: float
    ) -> None:
        """The one answer path: check, leave flight, send, settle."""
        conn = self.conn
        message_id = message.id
        if conn is None or conn.closed or self.held.get(message_id) is not message:
            self.gone(message, _ACTION[outcome])
        # RDY first: when this starts a backoff, RDY 0 reaches nsqd before the REQ (or nsqd
        # may hand the requeued message straight back)
        self._release(message, success=success)
        try:
            if outcome is Outcome.FINISHED:
                conn.fin(message_id)
            else:
                conn.req(message_id, delay)
        except NsqError as exc:
            self._settle(message, Outcome.ABANDONED)
            raise MessageConnectionGoneError(
                f"cannot {_ACTION[outcome]} {message!r}: {exc}"
            ) from exc
        self._settle(message, outcome)
        if self.ordered:
            self.finished = message_id if outcome is Outcome.FINISHED else b""
            self.ctx.settled(message)

    def gone(self, message: Message, action: str) -> NoReturn:
        if message.outcome is None:
            message.outcome = Outcome.ABANDONED
            self.counts["abandoned"] += 1
        raise MessageConnectionGoneError(
            f"cannot {action} {message!r}: the connection to {self.address} that delivered "
            "it is gone; nsqd redelivers the message after its msg_timeout"
        )

    def _hold(self, message: Message) -> None:
        self.held[message.id] = message
        self.counts["received"] += 1
        self.ctx.flow.apply(self.ctx.planner.message(self.key))

    def _release(self, message: Message, *, success: bool | None) -> None:
        del self.held[message.id]
        self.ctx.flow.apply(self.ctx.planner.done(self.key, success=success))

    def _settle(self, message: Message, outcome: Outcome) -> None:
        message.outcome = outcome
        # the common answer without hashing the enum (Enum.__hash__ is a Python call)
        self.counts["finished" if outcome is Outcome.FINISHED else _COUNTER[outcome]] += 1
        self.ctx.held_changed.wake()

    def abandon_all(self) -> None:
        """The connection closed: nothing it delivered can be answered any more."""
        for message in self.held.values():
            if message.outcome is None:
                message.outcome = Outcome.ABANDONED
                self.counts["abandoned"] += 1
        self.held.clear()
        self.ctx.held_changed.wake()

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the drain limit
        """Stop delivery, give handlers ``timeout`` s to answer what is held, then close."""
        conn = self.conn
        if conn is None:
            return
        with contextlib.suppress(NsqError):
            await conn.stop_delivery()
        await wait_answered([self], self.ctx.held_changed, timeout)
        await conn.close()


async def wait_answered(slots: list[Slot], changed: Wakeup, timeout: float) -> None:  # noqa: ASYNC109
    """Wait up to ``timeout`` s until none of ``slots`` holds a message on a live connection
    (where an answer could still go out)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while any(s.held and s.conn is not None and not s.conn.closed for s in slots):
                await changed.wait_next()


def slot_of(message: Message) -> Slot:
    """The slot that delivered ``message``: every Message a consumer makes is a slot's."""
    return cast(Slot, message._owner)
