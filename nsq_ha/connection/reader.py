"""The receive side of one connection: bytes from the socket callback (no task between) into
the session, events out to whoever waits for them (:class:`PendingAnswers`, the message handler,
``on_error``). :meth:`FrameReader.run` ends only by raising what ended the stream: nsqd closed
it, a fatal error frame, a protocol violation, or no complete frame for two heartbeat intervals
(a dead peer; bytes that complete no frame, a trickle, do not count).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Final, NoReturn

from nsq_ha.errors import BrokerError, ConnectionClosedError, NsqError, NsqTimeoutError
from nsq_ha.protocol.commands import Nop
from nsq_ha.protocol.events import CLOSE_WAIT as CLOSE_WAIT_EVENT
from nsq_ha.protocol.events import HEARTBEAT, NEED_DATA, Answer, Delivered, Failed
from nsq_ha.protocol.frames import CLOSE_WAIT
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.protocol.session import ClientSession
from nsq_ha.transport import StreamTransport

log = logging.getLogger(__name__)

#: Heartbeat intervals without a complete frame from nsqd after which the peer counts as dead.
DEAD_PEER_INTERVALS = 2
#: Events other than messages and answers handled per event-loop turn: those two are bounded by
#: the RDY given and the commands sent, but one read (a decompressed slice above all) may hold
#: thousands of error frames nothing asked for; the rest waits, the socket unread meanwhile.
EVENTS_PER_TURN: Final = 128
_NOP: Final = Nop().encode()


class PendingAnswers:
    """The futures of one connection's commands awaiting an answer, in sending order (nsqd
    answers in order, §1.5), and of its ``sync`` calls."""

    __slots__ = ("_answers", "_syncs")

    def __init__(self) -> None:
        self._answers: deque[asyncio.Future[bytes]] = deque()
        self._syncs: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        return f"<PendingAnswers answers={len(self._answers)} syncs={len(self._syncs)}>"

    def expect_sync(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """Return the future (of ``loop``) the sync just sent completes."""
        future: asyncio.Future[None] = loop.create_future()
        self._syncs.append(future)
        return future

    async def wait(self, transport: StreamTransport, command: bytes, limit: float) -> bytes:
        """Wait ``limit`` seconds for the answer to the command just sent (named ``command``),
        first for it to leave a socket buffer over its limit. The deadline is a timer failing the
        future: an ``asyncio.timeout`` costs two ``getpid()`` calls on Python 3.11. A caller that
        gives up leaves its future done, in its place in the FIFO: the late answer is dropped."""
        loop = transport.loop
        future: asyncio.Future[bytes] = loop.create_future()
        self._answers.append(future)
        address = transport.address
        deadline = loop.time() + limit
        try:
            if transport.backlogged():  # rare: nsqd is not reading what was sent
                try:
                    async with asyncio.timeout_at(deadline):
                        await transport.backpressure()
                except TimeoutError as exc:
                    raise NsqTimeoutError(
                        f"{command.decode(errors='replace')} could not be written to {address} "
                        f"within {limit} s: nsqd is not reading (socket buffer full)"
                    ) from exc
            timer = loop.call_at(deadline, _no_answer, future, command, address, limit)
            try:
                return await future
            finally:
                timer.cancel()
        except BaseException:
            future.cancel()
            raise

    def answer(self, data: bytes) -> None:
        """The oldest command got its answer (a caller that gave up no longer waits)."""
        future = self._answers.popleft()
        if not future.done():
            future.set_result(data)

    def refuse(self, error: BaseException) -> None:
        """The oldest command got an error frame."""
        future = self._answers.popleft()
        if not future.done():
            future.set_exception(error)

    def synced(self) -> None:
        """The oldest sync is done."""
        future = self._syncs.popleft()
        if not future.done():
            future.set_result(None)

    def waiting(self) -> list[asyncio.Future[bytes]]:
        """The answer futures someone still waits for."""
        return [future for future in self._answers if not future.done()]

    def fail_all(self, error: BaseException) -> None:
        """The connection closed: every waiter gets ``error``."""
        futures: list[asyncio.Future[bytes] | asyncio.Future[None]] = [*self._answers, *self._syncs]
        self._answers.clear()
        self._syncs.clear()
        for future in futures:
            if not future.done():
                future.set_exception(error)


def _no_answer(future: asyncio.Future[bytes], command: bytes, address: str, limit: float) -> None:
    if not future.done():
        name = command.decode(errors="replace")
        error = NsqTimeoutError(f"no answer to {name} from {address} within {limit} s")
        future.set_exception(error)


class FrameReader:
    """Reads one connection's frames and hands their events to the waiting parties."""

    __slots__ = (
        "_answers",
        "_backlogged",
        "_deliver",
        "_nop_at",
        "_on_error",
        "_session",
        "_transport",
        "address",
    )

    def __init__(
        self,
        session: ClientSession,
        transport: StreamTransport,
        answers: PendingAnswers,
        *,
        deliver: Callable[[DecodedMessage], object],
        on_error: Callable[[BrokerError], object] | None,
    ) -> None:
        """Read ``transport`` into ``session``; messages go to ``deliver``, error frames that
        answer no command to ``on_error`` (logged when it is ``None``)."""
        self._session = session
        self._transport = transport
        self._answers = answers
        self._deliver = deliver
        self._on_error = on_error
        #: :meth:`dispatch` stopped at :data:`EVENTS_PER_TURN` with frames left
        self._backlogged = False
        #: the transport's write count when a NOP was queued: it waits for the next write
        self._nop_at = -1
        self.address = transport.address

    def __repr__(self) -> str:
        return f"<FrameReader {self.address} {self._session!r}>"

    async def run(self) -> NoReturn:
        """Read until the stream ends; raise the NsqError that ended it. The dead-peer watchdog
        is one timer per window, not per read: it sets itself again from the last frame."""
        session = self._session
        transport = self._transport
        negotiated = session.negotiated
        interval = None if negotiated is None else negotiated.heartbeat_interval
        window = None if interval is None else DEAD_PEER_INTERVALS * interval
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[NoReturn] = loop.create_future()
        last_frame = loop.time()  # liveness: a complete frame, not any byte
        watchdog: asyncio.TimerHandle | None = None
        backlog: asyncio.Handle | None = None  # the next turn's share of a backlog

        def end(exc: BaseException) -> None:
            transport.stop_receiving()
            if not ended.done():
                ended.set_exception(exc)

        def received(data: bytes) -> None:
            nonlocal last_frame, backlog
            now = loop.time()
            try:
                session.receive_data(data, now)
                if backlog is not None:  # bytes the transport had before it held
                    return
                if self.dispatch():
                    last_frame = now
                if self._backlogged:
                    transport.hold()
                    backlog = loop.call_soon(work_off)
            except Exception as exc:  # run() raises it
                end(exc)

        def work_off() -> None:
            nonlocal last_frame, backlog
            backlog = None
            try:
                if self.dispatch():
                    last_frame = loop.time()
                if self._backlogged:
                    backlog = loop.call_soon(work_off)
                else:
                    transport.release()
            except Exception as exc:  # run() raises it
                end(exc)

        def closed(error: NsqError | None) -> None:
            try:
                if error is not None:
                    raise error
                while self.dispatch() and self._backlogged:  # frames that came before the end
                    pass
                session.receive_eof()
                raise self.closed_error()
            except Exception as exc:  # run() raises it
                end(exc)

        def check(window: float) -> None:
            nonlocal watchdog
            due = last_frame + window
            if loop.time() < due:
                watchdog = loop.call_at(due, check, window)
            else:
                gap = f"{window} s ({DEAD_PEER_INTERVALS} heartbeat intervals)"
                dead = f"nsqd {self.address} sent no complete frame for {gap}: dead peer"
                end(NsqTimeoutError(dead))

        self.dispatch()  # frames that arrived with the handshake's last read
        if self._backlogged:
            backlog = loop.call_soon(work_off)
        if window is not None:
            watchdog = loop.call_at(last_frame + window, check, window)
        try:
            transport.receive(received, closed)
            if backlog is not None:
                transport.hold()
            await ended
        finally:
            transport.stop_receiving()
            if watchdog is not None:
                watchdog.cancel()
            if backlog is not None:
                backlog.cancel()

    def dispatch(self) -> bool:
        """Handle the events the buffered bytes make, up to :data:`EVENTS_PER_TURN` other than
        messages and answers (then frames are left: ``_backlogged``); True if there was any."""
        next_event = self._session.next_event
        deliver = self._deliver
        got = False
        budget = EVENTS_PER_TURN
        while True:
            event = next_event()
            if isinstance(event, Delivered):  # the hot path first
                try:
                    deliver(event.message)
                except Exception:
                    log.exception("on_message handler of %s failed", self.address)
            elif event is NEED_DATA:
                self._backlogged = False
                return got
            elif isinstance(event, Answer):
                self._answers.answer(event.data)
            else:  # a heartbeat, an error frame (a fatal one ends the read), CLOSE_WAIT or SYNCED
                if event is HEARTBEAT:
                    # a NOP: one per write, even for a flood; none while the socket buffer is
                    # full (nsqd is not reading what we sent: one more NOP tells it nothing)
                    log.debug("heartbeat from %s", self.address)
                    transport = self._transport
                    writes = transport.writes
                    closed = self._session.closed
                    if not closed and self._nop_at != writes and not transport.backlogged():
                        self._nop_at = writes
                        transport.send(_NOP)
                elif isinstance(event, Failed):
                    if event.command is not None:
                        self._answers.refuse(event.error)
                    elif self._on_error is None:
                        log.warning("nsqd %s: %s", self.address, event.error)
                    else:
                        try:
                            self._on_error(event.error)
                        except Exception:
                            log.exception("on_error handler of %s failed", self.address)
                    if event.fatal:
                        raise self.closed_error()
                elif event is CLOSE_WAIT_EVENT:
                    self._answers.answer(CLOSE_WAIT)
                else:
                    self._answers.synced()
                budget -= 1
                if not budget:
                    self._backlogged = True
                    return True
            got = True

    def closed_error(self) -> ConnectionClosedError:
        """The error for nsqd closing the stream: chained to the fatal error frame, if any."""
        fatal = self._session.fatal_error
        after = "" if fatal is None else f" after {fatal}"
        error = ConnectionClosedError(f"nsqd {self.address} closed the connection{after}")
        if fatal is not None:
            error.__cause__ = fatal
        return error
