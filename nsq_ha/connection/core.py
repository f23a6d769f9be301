"""One asyncio connection to one nsqd (fork or vanilla): :class:`NsqdConnection` does the I/O
around a sans-IO :class:`~nsq_ha.protocol.session.ClientSession`, which decides everything about
the protocol. A fatal error frame (§2.19) fails its own command with its
:class:`~nsq_ha.errors.BrokerError`, every other waiter with a ConnectionClosedError chained to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Self

from nsq_ha.connection.config import ConnectionConfig, parse_address
from nsq_ha.connection.handshake import handshake
from nsq_ha.connection.reader import FrameReader, PendingAnswers
from nsq_ha.errors import (
    BrokerError,
    ConfigError,
    ConnectionClosedError,
    LocalProtocolError,
    NsqError,
    NsqTimeoutError,
    RemoteProtocolError,
)
from nsq_ha.protocol.commands import (
    Cls,
    Command,
    Rdy,
    Req,
    StartPosition,
    Sub,
    SubAdvanced,
    SubOrdered,
    Touch,
)
from nsq_ha.protocol.frames import DEFAULT_MAX_FRAME_SIZE, max_frame_size_for
from nsq_ha.protocol.identify import AuthResponse, Negotiated
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.protocol.session import ClientSession, ConnState
from nsq_ha.transport import StreamTransport, Wakeup

log = logging.getLogger(__name__)

#: Called with each delivered message (from the read loop: keep it short, never block).
MessageHandler = Callable[[DecodedMessage], object]
#: Called with error frames that answer no pending command (FIN/REQ/TOUCH failures, ...).
ErrorHandler = Callable[[BrokerError], object]


def _nowhere(message: DecodedMessage) -> None: ...  # the handler of one that cannot subscribe


def _describe(reason: BaseException) -> str:
    """A non-empty text for a close reason (a bare CancelledError has none)."""
    if isinstance(reason, asyncio.CancelledError):
        return "cancelled"
    return str(reason) or type(reason).__name__


class NsqdConnection:
    """One TCP connection to one nsqd: ``await conn.connect()`` (or ``async with``) runs the
    handshake; :meth:`command` sends a typed command that has a response, :meth:`send_nowait`
    one that has none; :meth:`close` ends the connection cleanly."""

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        config: ConnectionConfig | None = None,
        on_message: MessageHandler | None = None,
        on_error: ErrorHandler | None = None,
    ) -> None:
        """Prepare a connection to ``address`` (``"host:port"``); nothing is opened yet."""
        self.host, self.port = parse_address(address)
        #: ``host:port`` of the nsqd.
        self.address = f"{self.host}:{self.port}"
        self.config = config if config is not None else ConnectionConfig()
        if not isinstance(self.config, ConnectionConfig):
            raise ConfigError("config must be a ConnectionConfig")
        self._on_error = on_error
        frame_limit = max(DEFAULT_MAX_FRAME_SIZE, max_frame_size_for(self.config.max_msg_size))
        self._session = ClientSession(max_frame_size=frame_limit)
        self._answers = PendingAnswers()
        self._transport: StreamTransport | None = None
        #: The AUTH answer (identity, identity_url, permission_count), if AUTH ran.
        self.auth: AuthResponse | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._reader_stopping = False
        self._closed = asyncio.Event()
        #: Why the connection closed, when it was not closed by :meth:`close` cleanly.
        self.close_reason: BaseException | None = None
        self._on_message = on_message
        #: woken when a message is answered or the connection closes (what close() waits for)
        self._answered = Wakeup()

    def __repr__(self) -> str:
        parts = [self.address, self.state.name]
        negotiated = self._session.negotiated
        if negotiated is not None and negotiated.version:
            parts.append(f"{'fork' if negotiated.is_fork else 'vanilla'}={negotiated.version}")
        if self._transport is not None:
            if self._transport.tls:
                parts.append("tls")
            if self._transport.compression:
                parts.append(self._transport.compression)
        if self.auth is not None:
            parts.append(f"identity={self.auth['identity']!r}")
        parts.append(f"pending={self._session.pending}")
        if self._session.in_flight:
            parts.append(f"in_flight={self._session.in_flight}")
        if self.close_reason is not None:
            parts.append(f"reason={_describe(self.close_reason)}")
        return f"<NsqdConnection {' '.join(parts)}>"

    @property
    def writes(self) -> int:
        """Number of socket writes issued (a coalescing statistic)."""
        return 0 if self._transport is None else self._transport.writes

    @property
    def state(self) -> ConnState:
        """The current connection state."""
        return self._session.state

    @property
    def negotiated(self) -> Negotiated:
        """What IDENTIFY settled (raises LocalProtocolError before the handshake)."""
        negotiated = self._session.negotiated
        if negotiated is None:
            raise LocalProtocolError("the connection has not identified yet")
        return negotiated

    @property
    def is_fork(self) -> bool:
        """True on the fork (``-HA.`` in its version); LocalProtocolError before the handshake."""
        if self._session.negotiated is None:
            raise LocalProtocolError("the connection has not identified yet")
        return self._session.is_fork

    @property
    def closed(self) -> bool:
        """True once the connection is closed (by either side)."""
        return self._session.closed

    @property
    def in_flight(self) -> int:
        """Messages delivered and not yet answered with FIN or REQ."""
        return self._session.in_flight

    async def __aenter__(self) -> Self:
        if self.state is ConnState.INIT:
            await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the socket and run magic, IDENTIFY, TLS, compression and AUTH; on failure close
        it and raise ConnectError, NsqTimeoutError, HandshakeError or nsqd's BrokerError."""
        if self.state is not ConnState.INIT:
            raise LocalProtocolError(f"connect() called in state {self.state.name}")
        config = self.config
        try:
            async with asyncio.timeout(config.connect_timeout):
                self._transport = transport = await StreamTransport.open(
                    self.host,
                    self.port,
                    connect_timeout=config.connect_timeout,
                    write_buffer_limit=config.write_buffer_limit,
                )
                auth = await handshake(self.host, config, transport, self._session)
        except BaseException as exc:
            failed: BaseException | None = exc
        else:
            failed = None
        # Handled after the except block: compiled by mypyc, a coroutine that awaits inside an
        # except block and then re-raises frees the exception once too often (a crash).
        if failed is not None:
            reason: BaseException = failed
            if isinstance(failed, TimeoutError) and not isinstance(failed, NsqError):
                reason = NsqTimeoutError(
                    f"handshake with {self.address} took over {config.connect_timeout} s "
                    f"(stuck in {self.state.name})"
                )
                reason.__cause__ = failed
            what = _describe(reason)
            level = logging.INFO if isinstance(failed, asyncio.CancelledError) else logging.WARNING
            log.log(level, "handshake with %s failed (%s): %s", self.address, self.state.name, what)
            await self._shutdown(reason, ConnectionClosedError(what))
            raise reason
        self.auth = auth
        self._session.ready(msg_timeout=config.msg_timeout)
        reader = FrameReader(
            self._session,
            transport,
            self._answers,
            deliver=self._on_message or _nowhere,
            on_error=self._on_error,
        )
        self._reader_task = asyncio.get_running_loop().create_task(
            self._read_loop(reader), name=f"nsqd-reader-{self.address}"
        )
        log.info("connected to %r", self)

    def _closed_error(self) -> ConnectionClosedError:
        error = ConnectionClosedError(f"connection to {self.address} is closed")
        error.__cause__ = self.close_reason
        return error

    def _raise_if_closed(self) -> None:
        """Raise ConnectionClosedError once closed or broken (when the session refused a send)."""
        if self._session.closed or self._session.fatal_error is not None:
            raise self._closed_error()

    def _wire(self) -> StreamTransport:
        """The transport (only reached once the session allowed a command: connected)."""
        transport = self._transport
        if transport is None:
            raise self._closed_error()
        return transport

    def send_nowait(self, command: Command) -> None:
        """Send FIN, REQ, TOUCH, RDY or NOP, which nsqd answers only on failure (``on_error``)."""
        transport = self._transport
        try:
            data = self._session.send_nowait(
                command, now=None if transport is None else transport.loop.time()
            )
        except LocalProtocolError:
            self._raise_if_closed()
            raise
        self._wire().send(data)
        self._answered.wake()

    async def command(self, command: Command, *, response_timeout: float | None = None) -> bytes:
        """Send a command that nsqd answers and return the response frame's data; an error frame
        raises its BrokerError. ``response_timeout`` (default ``config.command_timeout``) bounds
        the drain of the socket buffer and the answer (then NsqTimeoutError)."""
        try:
            data = self._session.send(command)
        except LocalProtocolError:
            self._raise_if_closed()
            raise
        transport = self._wire()
        transport.send(data)
        limit = self.config.command_timeout if response_timeout is None else response_timeout
        return await self._answers.wait(transport, command.name, limit)

    async def subscribe(
        self,
        topic: str,
        channel: str,
        partition: int | None = None,
        *,
        ordered: bool = False,
        advanced: bool = False,
        start: StartPosition | None = None,
    ) -> None:
        """Subscribe (SUB, SUB_ORDERED with ``ordered``, SUB_ADVANCED with ``advanced`` or
        ``start``), then call :meth:`rdy`. Messages carry the ext part when the connection
        identified with ``extend_support`` (which nsqd refuses on a topic without ext)."""
        if ordered and (advanced or start is not None):
            raise ConfigError("ordered and advanced/start are different subscribe commands")
        if self._on_message is None:
            raise ConfigError(
                f"subscribing to {topic}/{channel} needs a connection made with on_message= "
                "(messages would have nowhere to go)"
            )
        if partition not in (None, -1) and not self.is_fork:
            raise LocalProtocolError(f"vanilla nsqd {self.address} has no partitions")
        if ordered:
            await self.command(SubOrdered(topic, channel, partition))
        elif advanced or start is not None:
            await self.command(SubAdvanced(topic, channel, partition, start))
        else:
            await self.command(Sub(topic, channel, partition))
        log.info("subscribed to %s/%s partition %s on %s", topic, channel, partition, self.address)

    async def stop_delivery(self) -> None:
        """Send ``CLS`` and wait for ``CLOSE_WAIT``: nsqd sends no more messages (but one it had
        picked may still arrive: answer it, then sync), FIN, REQ and TOUCH still work."""
        if self.state is ConnState.SUBSCRIBED:
            await self.command(Cls())

    async def sync(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109 - a limit
        """Return once nsqd has processed every command sent before this call (a subscribed or
        closing connection): a ``TOUCH`` for an id never in flight, answered in order by
        ``E_TOUCH_FAILED``, since nsqd answers FIN/REQ/TOUCH only when they fail."""
        try:
            data = self._session.sync()
        except LocalProtocolError:
            self._raise_if_closed()
            raise
        transport = self._wire()
        transport.send(data)
        future = self._answers.expect_sync(transport.loop)
        limit = self.config.command_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                await future
        except TimeoutError as exc:
            raise NsqTimeoutError(
                f"nsqd {self.address} did not answer a sync within {limit} s"
            ) from exc

    def rdy(self, count: int) -> None:
        """Send ``RDY count`` (checked against the negotiated ``max_rdy_count``)."""
        self.send_nowait(Rdy(count))

    def fin(self, message_id: bytes) -> None:
        """Finish a message: written at once when it leaves nothing in flight (an ordered channel
        sends the next message only after it), else at the end of the loop turn."""
        try:
            data = self._session.fin(message_id)
        except LocalProtocolError:
            self._raise_if_closed()
            raise
        transport = self._wire()
        if self._session.in_flight:
            transport.send(data)
        else:
            transport.send_now(data)
        self._answered.wake()

    def req(self, message_id: bytes, delay: float = 0.0) -> None:
        """Requeue a message after ``delay`` seconds (use 0 on ordered channels)."""
        self.send_nowait(Req(message_id, delay))

    def touch(self, message_id: bytes) -> None:
        """Reset a message's timeout."""
        self.send_nowait(Touch(message_id))

    async def _read_loop(self, reader: FrameReader) -> None:
        try:
            await reader.run()
        except NsqError as exc:
            error = exc
        except Exception as exc:  # a bug in a handler: do not leave waiters hanging
            log.exception("read loop of %s failed", self.address)
            error = RemoteProtocolError(f"read loop failed: {exc!r}")
        if self._session.closed:
            return
        self._reader_stopping = True
        if self.state in (ConnState.CLOSING, ConnState.CLOSE_WAIT) and self._close_task:
            log.info("nsqd %s closed while we were closing: %s", self.address, error)
        else:
            log.warning("connection to %s lost: %s", self.address, error)
        await self._shutdown(error, error)

    async def close(self) -> None:
        """Close cleanly (never raises): CLS when subscribed, let pending answers and in-flight
        messages finish (up to ``close_timeout``), flush, close the socket."""
        if self._close_task is None:
            self._close_task = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        if self._session.closed:
            await self._await_reader(cancel=False)
            return
        try:
            async with asyncio.timeout(self.config.close_timeout):
                with contextlib.suppress(NsqError):
                    await self.stop_delivery()
                await self._wait_idle()
        except TimeoutError:
            log.warning("closing %r: gave up waiting after %s s", self, self.config.close_timeout)
        if self._transport is not None:
            self._transport.flush()
            if not self._session.closed:
                with contextlib.suppress(NsqError, TimeoutError):
                    async with asyncio.timeout(self.config.close_timeout):
                        await self._transport.drain()
        log.info("closing connection to %s", self.address)
        await self._shutdown(None, self._closed_error())
        await self._await_reader(cancel=False)

    async def _wait_idle(self) -> None:
        """Wait until nothing is pending and (when consuming) nothing is in flight; a close
        fails every answer's future and sets ``_answered``, which ends either wait."""
        while not self._session.closed:
            futures: list[asyncio.Future[Any]] = self._answers.waiting()
            if futures:
                await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
            elif not self._session.in_flight or self._session.message_format is None:
                return
            else:
                await self._answered.wait_next()

    async def _await_reader(self, *, cancel: bool) -> None:
        task = self._reader_task
        if task is None or task is asyncio.current_task() or task.done():
            return
        if cancel and not self._reader_stopping:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _shutdown(self, reason: BaseException | None, waiter_error: BaseException) -> None:
        """Enter CLOSED, fail every waiter with ``waiter_error``, close the socket."""
        if self._session.closed:
            return
        self.close_reason = reason
        self._session.close()
        if self._transport is not None:
            self._transport.discard_queued()
        self._answers.fail_all(waiter_error)
        self._answered.wake()
        self._closed.set()
        await self._await_reader(cancel=True)
        if self._transport is not None:
            await self._transport.close()
        why = "" if reason is None else f": {_describe(reason)}"
        log.info("connection to %s closed%s", self.address, why)

    async def wait_closed(self) -> None:
        """Wait until the connection is closed (by either side)."""
        await self._closed.wait()
