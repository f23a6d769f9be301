"""One asyncio connection to one nsqd (fork or vanilla).

:class:`NsqdConnection` does the I/O around a sans-IO
:class:`~nsq_ha.protocol.session.ClientSession`, which decides everything about the protocol
(states, which command an answer or error frame belongs to, message formats, in-flight ids,
fatal errors, heartbeats):

* **handshake** (:meth:`NsqdConnection.connect`, :class:`~nsq_ha.connection.handshake.Handshake`):
  magic, IDENTIFY, TLS, snappy or deflate, AUTH (§1.8, §2.1, §2.2);
* **reading** (:class:`~nsq_ha.connection.reader.FrameReader`): bytes go into the session, its
  events complete the pending futures (:class:`~nsq_ha.connection.answers.PendingAnswers`, in
  FIFO order, §1.5), go to ``on_error`` (FIN/REQ/TOUCH failures, §11), to ``on_message`` or
  :meth:`NsqdConnection.messages`; two heartbeat intervals without a frame mean a dead peer;
  messages beyond the RDY given are a protocol violation (:mod:`nsq_ha.protocol.flow`);
* **writing** (:class:`~nsq_ha.connection.writer.CommandWriter`): one write per loop turn;
  senders wait while the socket buffer is over ``write_buffer_limit`` (within their timeout).

A fatal error frame (§2.19) fails its own command with the :class:`~nsq_ha.errors.BrokerError`
and every other waiter with :class:`~nsq_ha.errors.ConnectionClosedError` chained to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any, Self

from nsq_ha.connection.answers import PendingAnswers
from nsq_ha.connection.config import ConnectionConfig, parse_address
from nsq_ha.connection.deliveries import Deliveries
from nsq_ha.connection.handshake import Handshake
from nsq_ha.connection.reader import FrameReader
from nsq_ha.connection.writer import CommandWriter
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
    StartPosition,
    encode_cls,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_sub_advanced,
    encode_sub_ordered,
    encode_touch,
)
from nsq_ha.protocol.frames import DEFAULT_MAX_FRAME_SIZE, OK, max_frame_size_for
from nsq_ha.protocol.identify import AuthResponse, Negotiated
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.protocol.publish import ExtHeader, encode_mpub, encode_pub, encode_pub_ext
from nsq_ha.protocol.publish import encode_pub_trace as _encode_pub_trace
from nsq_ha.protocol.session import ClientSession
from nsq_ha.protocol.state import ConnState
from nsq_ha.protocol.trace import TracedResponse, is_traced_response, parse_traced_response
from nsq_ha.transport import StreamTransport, loop_of

__all__ = ["ErrorHandler", "MessageHandler", "NsqdConnection"]

log = logging.getLogger(__name__)

#: Called with each delivered message (from the read loop: keep it short, never block).
MessageHandler = Callable[[DecodedMessage], object]
#: Called with error frames that answer no pending command (FIN/REQ/TOUCH failures, ...).
ErrorHandler = Callable[[BrokerError], object]


def _describe(reason: BaseException) -> str:
    """A non-empty text for a close reason (a bare CancelledError has none)."""
    if isinstance(reason, asyncio.CancelledError):
        return "cancelled"
    return str(reason) or type(reason).__name__


class NsqdConnection:
    """One TCP connection to one nsqd.

    ``await conn.connect()`` (or ``async with NsqdConnection(...) as conn``) runs the
    handshake; :meth:`command` sends a command that has a response, :meth:`send_nowait` one
    that has none (FIN, REQ, TOUCH, RDY, NOP); :meth:`publish`, :meth:`publish_many` and
    :meth:`subscribe` are the common commands; :meth:`close` ends the connection cleanly (CLS
    first when subscribed, then in-flight messages and pending answers get
    ``close_timeout`` to finish).
    """

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
        self.config = config if config is not None else ConnectionConfig()
        if not isinstance(self.config, ConnectionConfig):
            raise ConfigError("config must be a ConnectionConfig")
        self._on_error = on_error
        frame_limit = max(DEFAULT_MAX_FRAME_SIZE, max_frame_size_for(self.config.max_msg_size))
        self._session = ClientSession(max_frame_size=frame_limit)
        self._answers = PendingAnswers()
        self._writer = CommandWriter(self.config.write_buffer_limit, self.address)
        self._transport: StreamTransport | None = None
        self._auth: AuthResponse | None = None
        self._handshake_writes = 0
        self._reader_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._reader_stopping = False
        self._closed = asyncio.Event()
        self._close_reason: BaseException | None = None
        self._deliveries = Deliveries(on_message)

    def __repr__(self) -> str:
        """Show address, state, server kind, layers and queue sizes."""
        parts = [f"{self.host}:{self.port}", self.state.name]
        negotiated = self._session.negotiated
        if negotiated is not None and negotiated.version:
            kind = "fork" if negotiated.is_fork else "vanilla"
            parts.append(f"{kind}={negotiated.version}")
        if self._transport is not None:
            if self._transport.tls:
                parts.append("tls")
            if self._transport.compression:
                parts.append(self._transport.compression)
        if self._auth is not None:
            parts.append(f"identity={self._auth['identity']!r}")
        parts.append(f"pending={self._session.pending}")
        if self._session.in_flight:
            parts.append(f"in_flight={self._session.in_flight}")
        if self._close_reason is not None:
            parts.append(f"reason={_describe(self._close_reason)}")
        return f"<NsqdConnection {' '.join(parts)}>"

    # -- properties -------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` of the nsqd."""
        return f"{self.host}:{self.port}"

    @property
    def writes(self) -> int:
        """Number of socket writes issued (a coalescing statistic)."""
        return self._handshake_writes + self._writer.writes

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
        """True when nsqd's version contains ``-HA.`` (the partitioned fork)."""
        return self.negotiated.is_fork is True

    @property
    def auth(self) -> AuthResponse | None:
        """The AUTH answer (identity, identity_url, permission_count), if AUTH ran."""
        return self._auth

    @property
    def max_msg_size(self) -> int:
        """Largest message body sent (nsqd does not announce it; from the config)."""
        return self.config.max_msg_size

    @property
    def closed(self) -> bool:
        """True once the connection is closed (by either side)."""
        return self._session.closed

    @property
    def close_reason(self) -> BaseException | None:
        """Why the connection closed, when it was not closed by :meth:`close` cleanly."""
        return self._close_reason

    @property
    def in_flight(self) -> int:
        """Messages delivered and not yet answered with FIN or REQ."""
        return self._session.in_flight

    # -- context manager --------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        address: str | tuple[str, int],
        *,
        config: ConnectionConfig | None = None,
        on_message: MessageHandler | None = None,
        on_error: ErrorHandler | None = None,
    ) -> NsqdConnection:
        """Create a connection and run the handshake."""
        conn = cls(address, config=config, on_message=on_message, on_error=on_error)
        await conn.connect()
        return conn

    async def __aenter__(self) -> Self:
        """Connect (if not yet connected)."""
        if self.state is ConnState.INIT:
            await self.connect()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close cleanly."""
        await self.close()

    # -- handshake --------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the socket and run magic, IDENTIFY, TLS, compression and AUTH.

        Raises ConnectError / NsqTimeoutError / HandshakeError, or the BrokerError nsqd sent
        (e.g. AuthFailedError for a refused secret); the socket is closed on failure.
        """
        if self.state is not ConnState.INIT:
            raise LocalProtocolError(f"connect() called in state {self.state.name}")
        config = self.config
        try:
            async with asyncio.timeout(config.connect_timeout):
                transport = await self._handshake()
        except BaseException as exc:
            reason: BaseException = exc
            if isinstance(exc, TimeoutError) and not isinstance(exc, NsqError):
                reason = NsqTimeoutError(
                    f"handshake with {self.address} took over {config.connect_timeout} s "
                    f"(stuck in {self.state.name})"
                )
                reason.__cause__ = exc
            if isinstance(exc, asyncio.CancelledError):
                log.info(
                    "connection to %s cancelled during the handshake (in state %s)",
                    self.address,
                    self.state.name,
                )
            else:
                log.warning(
                    "connection to %s failed during handshake: %s", self.address, _describe(reason)
                )
            await self._shutdown(reason, ConnectionClosedError(_describe(reason)))
            if reason is exc:
                raise
            raise reason from exc
        self._session.ready(msg_timeout=config.msg_timeout)
        reader = FrameReader(
            self._session,
            transport,
            self._answers,
            self._writer,
            deliver=self._deliveries.deliver,
            on_error=self._on_error,
        )
        self._reader_task = asyncio.get_running_loop().create_task(
            self._read_loop(reader), name=f"nsqd-reader-{self.address}"
        )
        log.info("connected to %r", self)

    async def _handshake(self) -> StreamTransport:
        """Open the socket and run :class:`Handshake`; the caller handles timeouts and cleanup."""
        config = self.config
        self._transport = transport = await StreamTransport.open(
            self.host,
            self.port,
            connect_timeout=config.connect_timeout,
            write_buffer_limit=config.write_buffer_limit,
        )
        self._writer.transport = transport
        handshake = Handshake(self.host, config, transport, self._session)
        try:
            await handshake.run()
        finally:
            self._handshake_writes += handshake.writes
            self._auth = handshake.auth
        return transport

    # -- sending ----------------------------------------------------------------------------

    def _closed_error(self) -> ConnectionClosedError:
        """The error for using a closed connection, chained to why it closed."""
        error = ConnectionClosedError(f"connection to {self.address} is closed")
        error.__cause__ = self._close_reason
        return error

    def _raise_if_closed(self) -> None:
        """Raise ConnectionClosedError once closed or broken (when the session refused a send)."""
        if self._session.closed or self._session.fatal_error is not None:
            raise self._closed_error()

    def send_nowait(self, data: bytes) -> None:
        """Send a command nsqd does not answer on success: FIN, REQ, TOUCH, RDY or NOP.

        Their failures arrive later through ``on_error`` (FIN/REQ/TOUCH) or close the
        connection (fatal ones).
        """
        now = loop_of(self._transport).time()
        try:
            data = self._session.send_nowait(data, now=now)
        except LocalProtocolError:
            self._raise_if_closed()
            raise
        self._writer.enqueue(bytes(data))
        self._deliveries.answered()

    async def command(self, data: bytes, *, response_timeout: float | None = None) -> bytes:
        """Send a command that nsqd answers and return the response frame's data.

        ``response_timeout`` (default ``config.command_timeout``) bounds the drain of the socket
        buffer and the answer; then NsqTimeoutError, and the late answer is discarded. An error
        frame raises its BrokerError; a closed connection ConnectionClosedError.
        """
        try:
            data = self._session.send(data)
        except LocalProtocolError:
            self._raise_if_closed()
            raise
        self._writer.enqueue(bytes(data))
        return await self._answers.wait(
            self._answers.expect(loop_of(self._transport)),
            self.config.command_timeout if response_timeout is None else response_timeout,
            backlogged=self._writer.backlogged,
            flushed=self._writer.backpressure,
            command=data,
            address=self.address,
        )

    # -- commands ---------------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        body: bytes,
        partition: int | None = None,
        *,
        trace_id: int | None = None,
        header: ExtHeader | None = None,
    ) -> TracedResponse | None:
        """Publish one message; return the traced answer for traced publishes, else None.

        ``trace_id`` sends PUB_TRACE; ``header`` (a JSON object) sends PUB_EXT to an ext topic
        (traced when it carries ``##trace_id``). Both are fork-only, as is ``partition``.
        Oversized bodies and invalid names raise before anything is sent.
        """
        self._check_partition(partition)
        if trace_id is not None and header is not None:
            raise ConfigError("give trace_id or header, not both (put ##trace_id in the header)")
        size = self.config.max_msg_size
        if trace_id is not None:
            data = _encode_pub_trace(topic, body, trace_id, partition, max_msg_size=size)
        elif header is not None:
            data = encode_pub_ext(topic, body, header, partition, max_msg_size=size)
        else:
            data = encode_pub(topic, body, partition, max_msg_size=size)
        answer = await self.command(data)
        if is_traced_response(answer):
            return parse_traced_response(answer)
        if answer != OK:
            raise RemoteProtocolError(f"unexpected answer to a publish: {answer[:64]!r}")
        return None

    async def publish_many(
        self, topic: str, bodies: Iterable[bytes], partition: int | None = None
    ) -> None:
        """Publish several messages in one MPUB."""
        self._check_partition(partition)
        data = encode_mpub(
            topic,
            bodies,
            partition,
            max_msg_size=self.config.max_msg_size,
            max_body_size=self.config.max_body_size,
        )
        answer = await self.command(data)
        if answer != OK:
            raise RemoteProtocolError(f"unexpected answer to MPUB: {answer[:64]!r}")

    def _check_partition(self, partition: int | None) -> None:
        """Refuse an explicit partition on vanilla nsqd (it has none)."""
        if partition not in (None, -1) and not self.is_fork:
            raise LocalProtocolError(f"vanilla nsqd {self.address} has no partitions")

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
        """Subscribe (SUB, SUB_ORDERED with ``ordered``, SUB_ADVANCED with ``advanced``).

        Then call :meth:`rdy`. Ordered and advanced subscriptions deliver the offset/raw-size
        detail part; the ext part is present when the connection identified with
        ``extend_support`` (nsqd refuses that combination on non-ext topics).
        """
        if ordered and (advanced or start is not None):
            raise ConfigError("ordered and advanced/start are different subscribe commands")
        self._check_partition(partition)
        if ordered:
            data = encode_sub_ordered(topic, channel, partition)
        elif advanced or start is not None:
            data = encode_sub_advanced(topic, channel, partition, start)
        else:
            data = encode_sub(topic, channel, partition)
        await self.command(data)
        log.info("subscribed to %s/%s partition %s on %s", topic, channel, partition, self.address)

    async def stop_delivery(self) -> None:
        """Send ``CLS`` and wait for ``CLOSE_WAIT``: nsqd sends no more messages, while FIN, REQ
        and TOUCH still work. The socket stays open until :meth:`close`.

        A message already picked may still arrive (nsqd's pump races CLS): answer it, then sync.
        """
        if self.state is not ConnState.SUBSCRIBED:
            return
        await self.command(encode_cls())

    async def sync(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109 - a limit
        """Return once nsqd has processed every command sent before this call.

        nsqd answers FIN/REQ/TOUCH only when they fail, so this sends a ``TOUCH`` for an id that
        is never in flight and waits for its ``E_TOUCH_FAILED`` (non-fatal on both servers):
        nsqd handles a connection's commands in order, so everything before it is done. Needs a
        subscribed (or closing) connection.
        """
        try:
            self._writer.enqueue(self._session.sync())
        except LocalProtocolError:
            self._raise_if_closed()
            raise
        future = self._answers.expect_sync(loop_of(self._transport))
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
        negotiated = self._session.negotiated
        max_rdy = negotiated.max_rdy_count if negotiated is not None else None
        self.send_nowait(encode_rdy(count, max_rdy_count=max_rdy))

    def fin(self, message_id: bytes) -> None:
        """Finish a message."""
        try:
            data = self._session.fin(message_id)
        except LocalProtocolError:
            self._raise_if_closed()
            raise
        self._writer.answer(data, last=not self._session.in_flight)
        self._deliveries.answered()

    def req(self, message_id: bytes, delay: float = 0.0) -> None:
        """Requeue a message after ``delay`` seconds (use 0 on ordered channels)."""
        self.send_nowait(encode_req(message_id, delay))

    def touch(self, message_id: bytes) -> None:
        """Reset a message's timeout."""
        self.send_nowait(encode_touch(message_id))

    def messages(self) -> AsyncIterator[DecodedMessage]:
        """Yield delivered messages until the connection closes (when no on_message is set)."""
        return self._deliveries.messages()

    # -- reading ----------------------------------------------------------------------------

    async def _read_loop(self, reader: FrameReader) -> None:
        """Run the reader until the stream ends; then close with the reason."""
        try:
            await reader.run()
        except NsqError as exc:
            await self._connection_lost(exc)
        except Exception as exc:  # a bug in a handler: do not leave waiters hanging
            log.exception("read loop of %s failed", self.address)
            await self._connection_lost(RemoteProtocolError(f"read loop failed: {exc!r}"))

    async def _connection_lost(self, exc: NsqError) -> None:
        """The read loop ended: record the reason and close."""
        if self._session.closed:
            return
        self._reader_stopping = True
        if self.state in (ConnState.CLOSING, ConnState.CLOSE_WAIT) and self._close_task:
            log.info("nsqd %s closed while we were closing: %s", self.address, exc)
        else:
            log.warning("connection to %s lost: %s", self.address, exc)
        await self._shutdown(exc, exc)

    # -- closing ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Close cleanly: CLS and CLOSE_WAIT when subscribed, let pending answers and in-flight
        messages finish (up to ``close_timeout``), flush, close the socket. Never raises for
        a connection that is already closed."""
        if self._close_task is None:
            self._close_task = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        """The body of :meth:`close` (runs once)."""
        if self._session.closed:
            await self._await_reader(cancel=False)
            return
        try:
            async with asyncio.timeout(self.config.close_timeout):
                if self.state is ConnState.SUBSCRIBED:
                    with contextlib.suppress(NsqError):
                        await self.command(encode_cls())
                await self._wait_idle()
        except TimeoutError:
            log.warning(
                "closing %s: gave up waiting after %s s (%d pending, %d in flight)",
                self.address,
                self.config.close_timeout,
                self._session.pending,
                self._session.in_flight,
            )
        self._writer.flush()
        if self._transport is not None and not self._session.closed:
            with contextlib.suppress(NsqError, TimeoutError):
                async with asyncio.timeout(self.config.close_timeout):
                    await self._transport.drain()
        log.info("closing connection to %s", self.address)
        await self._shutdown(None, self._closed_error())
        await self._await_reader(cancel=False)

    async def _wait_idle(self) -> None:
        """Wait until nothing is pending and (when consuming) nothing is in flight."""
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            while not self._session.closed:
                futures: list[asyncio.Future[Any]] = self._answers.waiting()
                if futures:
                    await asyncio.wait([*futures, closed], return_when=asyncio.FIRST_COMPLETED)
                    continue
                if not self._session.in_flight or self._session.message_format is None:
                    return
                changed = asyncio.ensure_future(self._deliveries.changed())
                try:
                    await asyncio.wait([changed, closed], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
        finally:
            closed.cancel()

    async def _await_reader(self, *, cancel: bool) -> None:
        """Wait for the read loop to end, cancelling it first if ``cancel`` and it is reading."""
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
        self._close_reason = reason
        self._session.close()
        self._writer.clear()
        self._answers.fail_all(waiter_error)
        self._deliveries.close()
        self._closed.set()
        await self._await_reader(cancel=True)
        if self._transport is not None:
            await self._transport.close()
        log.info(
            "connection to %s closed%s",
            self.address,
            f": {_describe(reason)}" if reason is not None else "",
        )

    async def wait_closed(self) -> None:
        """Wait until the connection is closed (by either side)."""
        await self._closed.wait()
