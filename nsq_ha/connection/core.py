"""One asyncio connection to one nsqd (fork or vanilla).

:class:`NsqdConnection` drives the sans-IO core in :mod:`nsq_ha.protocol`:

* **handshake** (in :meth:`NsqdConnection.connect`): magic, IDENTIFY with feature negotiation,
  then TLS, then snappy or deflate, each confirmed by an ``OK`` read through the new layer, then
  AUTH when nsqd says ``auth_required`` (§1.8, §2.1, §2.2);
* **read loop**: frames are decoded incrementally; ``_heartbeat_`` is answered with ``NOP`` at
  once; other responses and error frames complete pending commands in FIFO order (§1.5), except
  ``E_FIN_FAILED``/``E_REQ_FAILED``/``E_TOUCH_FAILED``, which belong to commands without a
  success answer and go to ``on_error`` (§11); message frames are decoded with the format the
  subscribe command chose and go to ``on_message`` or :meth:`NsqdConnection.messages`;
* **liveness**: no complete frame from nsqd for two heartbeat intervals means a dead peer
  (:class:`~nsq_ha.errors.NsqTimeoutError` to every waiter); bytes that complete no frame
  (a trickle) do not count;
* **flow control on receipt**: messages beyond the RDY given close the connection with
  :class:`~nsq_ha.errors.RemoteProtocolError` (:mod:`nsq_ha.protocol.flow`), so a server
  ignoring RDY cannot make the client buffer without limit;
* **writes** queued in one event-loop turn go out as one write; senders wait while the socket
  buffer is above ``write_buffer_limit``, and that wait counts in the command's timeout;
* **states** live in :mod:`nsq_ha.protocol.state`: an illegal command or move raises
  :class:`~nsq_ha.errors.LocalProtocolError` before anything is sent.

A fatal error frame (§2.19) fails its own command with the :class:`~nsq_ha.errors.BrokerError`
and every other waiter with :class:`~nsq_ha.errors.ConnectionClosedError` chained to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from nsq_ha.connection.config import ConnectionConfig
from nsq_ha.connection.handshake import Handshake
from nsq_ha.connection.writer import CommandWriter
from nsq_ha.errors import (
    BrokerError,
    ConfigError,
    ConnectionClosedError,
    LocalProtocolError,
    MessageCommandError,
    NsqError,
    NsqTimeoutError,
    RemoteProtocolError,
)
from nsq_ha.protocol.commands import (
    StartPosition,
    encode_cls,
    encode_fin,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_sub_advanced,
    encode_sub_ordered,
    encode_touch,
)
from nsq_ha.protocol.flow import DeliveryLedger
from nsq_ha.protocol.frames import (
    CLOSE_WAIT,
    DEFAULT_MAX_FRAME_SIZE,
    OK,
    Frame,
    FrameDecoder,
    FrameType,
    max_frame_size_for,
)
from nsq_ha.protocol.identify import AuthResponse, Negotiated
from nsq_ha.protocol.message import DecodedMessage, MessageFormat, decode_message
from nsq_ha.protocol.publish import ExtHeader, encode_mpub, encode_pub, encode_pub_ext
from nsq_ha.protocol.publish import encode_pub_trace as _encode_pub_trace
from nsq_ha.protocol.state import ConnectionStateMachine, ConnState
from nsq_ha.protocol.trace import TracedResponse, is_traced_response, parse_traced_response
from nsq_ha.transport import StreamTransport

__all__ = ["ErrorHandler", "MessageHandler", "NsqdConnection"]

log = logging.getLogger(__name__)

#: Called with each delivered message (from the read loop: keep it short, never block).
MessageHandler = Callable[[DecodedMessage], object]
#: Called with error frames that answer no pending command (FIN/REQ/TOUCH failures, ...).
ErrorHandler = Callable[[BrokerError], object]

#: Commands nsqd never answers on success (their errors may still arrive).
_NO_RESPONSE = frozenset({b"FIN", b"REQ", b"TOUCH", b"RDY", b"NOP"})
_SUBSCRIBE = frozenset({b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED"})
_FORK_ONLY = frozenset({b"SUB_ORDERED", b"SUB_ADVANCED", b"PUB_TRACE", b"PUB_EXT", b"MPUB_TRACE"})
#: Heartbeat intervals without a complete frame from nsqd after which the peer counts as dead.
DEAD_PEER_INTERVALS = 2
#: msg_timeout assumed when nsqd does not announce one (nsqd's default), seconds.
DEFAULT_MSG_TIMEOUT = 60.0
#: Ids that :meth:`NsqdConnection.sync` TOUCHes: never in flight (a fork internal id of 2**63-1;
#: on vanilla, where ids are 16 hex characters, a value its id generator cannot reach soon).
SYNC_ID_FORK = b"\x7f" + b"\xff" * 7 + b"\x00" * 8
SYNC_ID_VANILLA = b"ffffffffffffffff"


@dataclass(slots=True)
class _Pending:
    """A sent command waiting for its response frame."""

    name: bytes
    future: asyncio.Future[bytes]


def _describe(reason: BaseException) -> str:
    """A non-empty text for a close reason (a bare CancelledError has none)."""
    if isinstance(reason, asyncio.CancelledError):
        return "cancelled"
    return str(reason) or type(reason).__name__


def _split_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """Accept ``"host:port"`` or ``(host, port)``."""
    if isinstance(address, tuple):
        host, port = address
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ConfigError(f"address {address!r} is not host:port")
        port = int(port_text)
    if not host or not 0 < port < 65536:
        raise ConfigError(f"address {address!r} is not host:port")
    return host.strip("[]"), port


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
        self.host, self.port = _split_address(address)
        self.config = config if config is not None else ConnectionConfig()
        if not isinstance(self.config, ConnectionConfig):
            raise ConfigError("config must be a ConnectionConfig")
        self._on_message = on_message
        self._on_error = on_error
        self._machine = ConnectionStateMachine()
        frame_limit = max(DEFAULT_MAX_FRAME_SIZE, max_frame_size_for(self.config.max_msg_size))
        self._decoder = FrameDecoder(frame_limit)
        self._transport: StreamTransport | None = None
        self._negotiated: Negotiated | None = None
        self._auth: AuthResponse | None = None
        self._format: MessageFormat | None = None
        #: SUB_ORDERED: nsqd sends the next message only after this one's FIN, so a FIN is
        #: written at once rather than gathered with others at the end of the loop turn
        self._ordered = False
        self._pending: deque[_Pending] = deque()
        self._writer = CommandWriter(self.config.write_buffer_limit, self.address)
        self._handshake_writes = 0
        self._reader_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._reader_stopping = False
        self._closed = asyncio.Event()
        self._close_reason: BaseException | None = None
        self._fatal_error: BrokerError | None = None
        self._messages: asyncio.Queue[DecodedMessage | None] = asyncio.Queue()
        self._in_flight: set[bytes] = set()
        self._in_flight_changed = asyncio.Event()
        self._ledger = DeliveryLedger(expiry=DEFAULT_MSG_TIMEOUT)
        self._syncs: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        """Show address, state, server kind, layers and queue sizes."""
        parts = [f"{self.host}:{self.port}", self._machine.state.name]
        if self._negotiated is not None and self._negotiated.version:
            kind = "fork" if self._negotiated.is_fork else "vanilla"
            parts.append(f"{kind}={self._negotiated.version}")
        if self._transport is not None:
            if self._transport.tls:
                parts.append("tls")
            if self._transport.compression:
                parts.append(self._transport.compression)
        if self._auth is not None:
            parts.append(f"identity={self._auth['identity']!r}")
        parts.append(f"pending={len(self._pending)}")
        if self._in_flight:
            parts.append(f"in_flight={len(self._in_flight)}")
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
        return self._machine.state

    @property
    def negotiated(self) -> Negotiated:
        """What IDENTIFY settled (raises LocalProtocolError before the handshake)."""
        if self._negotiated is None:
            raise LocalProtocolError("the connection has not identified yet")
        return self._negotiated

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
        return self._machine.closed

    @property
    def close_reason(self) -> BaseException | None:
        """Why the connection closed, when it was not closed by :meth:`close` cleanly."""
        return self._close_reason

    @property
    def in_flight(self) -> int:
        """Messages delivered and not yet answered with FIN or REQ."""
        return len(self._in_flight)

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
                await self._handshake()
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
        negotiated = self.negotiated
        expiry = negotiated.msg_timeout or self.config.msg_timeout or DEFAULT_MSG_TIMEOUT
        self._ledger = DeliveryLedger(expiry=expiry)
        self._machine.move(ConnState.READY)
        self._reader_task = asyncio.get_running_loop().create_task(
            self._read_loop(), name=f"nsqd-reader-{self.address}"
        )
        log.info("connected to %r", self)

    async def _handshake(self) -> None:
        """Open the socket and run :class:`Handshake`; the caller handles timeouts and cleanup."""
        config = self.config
        self._transport = await StreamTransport.open(
            self.host,
            self.port,
            connect_timeout=config.connect_timeout,
            write_buffer_limit=config.write_buffer_limit,
        )
        self._writer.transport = self._transport
        handshake = Handshake(self.host, config, self._transport, self._decoder, self._machine)
        try:
            await handshake.run()
        finally:
            self._handshake_writes += handshake.writes
            self._negotiated = handshake.negotiated
            self._auth = handshake.auth

    def _require_transport(self) -> StreamTransport:
        """The open transport, or ConnectionClosedError."""
        if self._transport is None or self._machine.closed:
            raise self._closed_error()
        return self._transport

    # -- sending ----------------------------------------------------------------------------

    def _closed_error(self) -> ConnectionClosedError:
        """The error for using a closed connection, chained to why it closed."""
        error = ConnectionClosedError(f"connection to {self.address} is closed")
        error.__cause__ = self._close_reason
        return error

    def _check_send(self, data: bytes) -> bytes:
        """Return the command name if it may be sent now."""
        if self._machine.closed or self._fatal_error is not None:
            raise self._closed_error()
        return self._machine.check_command(data)

    def _enqueue(self, data: bytes) -> None:
        """Queue bytes; everything queued in one loop turn leaves in one write."""
        self._writer.enqueue(data)

    def _flush(self) -> None:
        """Hand the queued bytes to the socket layer now."""
        self._writer.flush()

    def send_nowait(self, data: bytes) -> None:
        """Send a command nsqd does not answer on success: FIN, REQ, TOUCH, RDY or NOP.

        Their failures arrive later through ``on_error`` (FIN/REQ/TOUCH) or close the
        connection (fatal ones).
        """
        name = self._check_send(data)
        if name not in _NO_RESPONSE:
            raise LocalProtocolError(f"{name.decode()} has a response: use command()")
        if name in (b"FIN", b"REQ") and len(data) >= 20:
            self._settle(bytes(data[4:20]))
        elif name == b"TOUCH" and len(data) >= 22:
            self._ledger.touched(bytes(data[6:22]), asyncio.get_running_loop().time())
        elif name == b"RDY":
            self._ledger.rdy(int(bytes(data[4:])))
        self._enqueue(bytes(data))

    async def command(self, data: bytes, *, response_timeout: float | None = None) -> bytes:
        """Send a command that nsqd answers and return the response frame's data.

        ``response_timeout`` defaults to ``config.command_timeout``; when it expires
        NsqTimeoutError is raised and the late answer is discarded (the FIFO stays in step). An
        error frame raises its BrokerError; a closed connection ConnectionClosedError.
        """
        name = self._check_send(data)
        if name in _NO_RESPONSE:
            raise LocalProtocolError(f"{name.decode()} has no response: use send_nowait()")
        if name in _FORK_ONLY and not self.is_fork:
            raise LocalProtocolError(f"{name.decode()} exists only on the fork; nsqd is vanilla")
        return await self._await_answer(name, self._submit(name, data), response_timeout)

    def _submit(self, name: bytes, data: bytes) -> asyncio.Future[bytes]:
        """Queue a command with a response and return the future its answer completes."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(name, future))
        self._enqueue(bytes(data))
        return future

    async def _await_answer(
        self, name: bytes, future: asyncio.Future[bytes], limit: float | None
    ) -> bytes:
        """Wait for the socket buffer to drain, then for the answer: both within ``limit`` s
        (NsqTimeoutError after that; a late answer is then discarded)."""
        if limit is None:
            limit = self.config.command_timeout
        sent = False
        try:
            async with asyncio.timeout(limit):
                await self._writer.backpressure()
                sent = True
                return await future
        except asyncio.CancelledError:
            future.cancel()  # the caller gave up: nobody waits for the answer any more
            raise
        except TimeoutError as exc:
            if not future.done() or future.cancelled():
                future.cancel()  # the FIFO keeps its place; the late answer is discarded
                if not sent:
                    raise NsqTimeoutError(
                        f"{name.decode()} could not be written to {self.address} within "
                        f"{limit} s: nsqd is not reading (socket buffer full)"
                    ) from exc
                raise NsqTimeoutError(
                    f"no answer to {name.decode()} from {self.address} within {limit} s"
                ) from exc
        # the answer (or its error, possibly a TimeoutError itself) came as the time ran out
        return future.result()

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
        name = self._check_send(data)
        if name in _FORK_ONLY and not self.is_fork:
            raise LocalProtocolError(f"{name.decode()} exists only on the fork; nsqd is vanilla")
        negotiated = self.negotiated
        self._format = MessageFormat.for_subscription(
            data,
            fork=self.is_fork,
            extend_support=negotiated.extend_support,
            ext_topic=negotiated.extend_support,
        )
        self._ordered = ordered
        self._machine.move(ConnState.SUBSCRIBING)
        await self._await_answer(name, self._submit(name, data), None)
        log.info("subscribed to %s/%s partition %s on %s", topic, channel, partition, self.address)

    async def stop_delivery(self) -> None:
        """Send ``CLS`` and wait for ``CLOSE_WAIT``: nsqd sends no more messages, while FIN, REQ
        and TOUCH still work. The socket stays open until :meth:`close`.

        A message nsqd had already picked may still arrive after ``CLOSE_WAIT`` (nsqd's message
        pump races the CLS); answer it, then :meth:`sync` to be sure nothing else is coming.
        """
        if self.state is not ConnState.SUBSCRIBED:
            return
        data = encode_cls()
        future = self._submit(self._check_send(data), data)
        self._machine.move(ConnState.CLOSING)
        await self._await_answer(b"CLS", future, None)

    async def sync(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109 - a limit
        """Return once nsqd has processed every command sent before this call.

        nsqd answers FIN/REQ/TOUCH only when they fail, so this sends a ``TOUCH`` for an id that
        is never in flight and waits for its ``E_TOUCH_FAILED`` (non-fatal on both servers):
        nsqd handles a connection's commands in order, so everything before it is done. Needs a
        subscribed (or closing) connection.
        """
        sentinel = SYNC_ID_FORK if self.is_fork else SYNC_ID_VANILLA
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.send_nowait(encode_touch(sentinel))
        self._syncs.append(future)
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
        max_rdy = self._negotiated.max_rdy_count if self._negotiated is not None else None
        self.send_nowait(encode_rdy(count, max_rdy_count=max_rdy))

    def fin(self, message_id: bytes) -> None:
        """Finish a message."""
        if (
            message_id in self._in_flight
            and self._machine.state is ConnState.SUBSCRIBED
            and self._fatal_error is None
        ):  # an id nsqd delivered here, so valid: send_nowait's checks, cut to what can fail
            self._in_flight.discard(message_id)
            self._in_flight_changed.set()
            self._ledger.settled(message_id)
            self._enqueue(b"FIN " + message_id + b"\n")
            if self._ordered:
                self._flush()
            return
        self.send_nowait(encode_fin(message_id))

    def req(self, message_id: bytes, delay: float = 0.0) -> None:
        """Requeue a message after ``delay`` seconds (use 0 on ordered channels)."""
        self.send_nowait(encode_req(message_id, delay))

    def touch(self, message_id: bytes) -> None:
        """Reset a message's timeout."""
        self.send_nowait(encode_touch(message_id))

    async def messages(self) -> AsyncIterator[DecodedMessage]:
        """Yield delivered messages until the connection closes (when no on_message is set)."""
        if self._on_message is not None:
            raise LocalProtocolError("messages go to on_message on this connection")
        while True:
            message = await self._messages.get()
            if message is None:
                self._messages.put_nowait(None)  # wake other iterators too
                return
            yield message

    def _settle(self, message_id: bytes) -> None:
        """Forget an in-flight message once it was finished or requeued."""
        self._ledger.settled(message_id)
        if message_id in self._in_flight:
            self._in_flight.discard(message_id)
            self._in_flight_changed.set()

    # -- reading ----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        """Read frames until the connection ends; then fail every waiter with the reason."""
        transport = self._require_transport()
        interval = self.negotiated.heartbeat_interval
        window = None if interval is None else DEAD_PEER_INTERVALS * interval
        loop = asyncio.get_running_loop()
        last_frame = loop.time()  # liveness: a complete frame, not any byte
        try:
            self._handle_frames(self._decoder.feed(b""))
            while True:
                try:
                    async with asyncio.timeout_at(None if window is None else last_frame + window):
                        data = await transport.read()
                except TimeoutError as exc:
                    raise NsqTimeoutError(
                        f"nsqd {self.address} sent no complete frame for {window} s "
                        f"({DEAD_PEER_INTERVALS} heartbeat intervals): dead peer"
                    ) from exc
                if not data:
                    self._decoder.feed_eof()
                    raise self._eof_error()
                frames = self._decoder.feed(data)
                if frames:
                    last_frame = loop.time()
                    self._handle_frames(frames)
        except NsqError as exc:
            await self._connection_lost(exc)
        except Exception as exc:  # a bug in a handler: do not leave waiters hanging
            log.exception("read loop of %s failed", self.address)
            await self._connection_lost(RemoteProtocolError(f"read loop failed: {exc!r}"))

    def _eof_error(self) -> ConnectionClosedError:
        """The error for the peer closing: chained to the fatal error frame, if any."""
        if self._fatal_error is not None:
            error = ConnectionClosedError(
                f"nsqd {self.address} closed the connection after {self._fatal_error}"
            )
            error.__cause__ = self._fatal_error
            return error
        return ConnectionClosedError(f"nsqd {self.address} closed the connection")

    async def _connection_lost(self, exc: NsqError) -> None:
        """The read loop ended: record the reason and close."""
        if self._machine.closed:
            return
        self._reader_stopping = True
        if self.state in (ConnState.CLOSING, ConnState.CLOSE_WAIT) and self._close_task:
            log.info("nsqd %s closed while we were closing: %s", self.address, exc)
        else:
            log.warning("connection to %s lost: %s", self.address, exc)
        await self._shutdown(exc, exc)

    def _handle_frames(self, frames: list[Frame]) -> None:
        """Dispatch decoded frames in order."""
        for frame in frames:
            if frame.frame_type is FrameType.RESPONSE:
                self._handle_response(frame.data)
            elif frame.frame_type is FrameType.ERROR:
                self._handle_error(frame.data)
            else:
                self._handle_message(frame.data)

    def _handle_response(self, data: bytes) -> None:
        """Answer heartbeats; complete the oldest pending command."""
        if data == b"_heartbeat_":
            log.debug("heartbeat from %s", self.address)
            if not self._machine.closed:
                self._writer.answer_heartbeat()  # one NOP per write, even for a flood
            return
        if not self._pending:
            raise RemoteProtocolError(f"response {data[:64]!r} answers no pending command")
        pending = self._pending.popleft()
        if pending.name in _SUBSCRIBE and self.state is ConnState.SUBSCRIBING:
            self._machine.move(ConnState.SUBSCRIBED)
        elif pending.name == b"CLS":
            if data != CLOSE_WAIT:
                raise RemoteProtocolError(f"expected CLOSE_WAIT after CLS, got {data[:64]!r}")
            self._machine.move(ConnState.CLOSE_WAIT)
        if not pending.future.done():
            pending.future.set_result(data)

    def _handle_error(self, data: bytes) -> None:
        """Route an error frame: FIN/REQ/TOUCH failures aside, else the oldest pending command."""
        fork = self.negotiated.is_fork is not False
        head = self._pending[0] if self._pending else None
        after = None if head is None else head.name
        error = BrokerError.from_frame(data, after_command=after, fork=fork)
        if isinstance(error, MessageCommandError):
            # FIN/REQ/TOUCH have no success answer: never match their errors by position
            if self._syncs and error.message_id in (SYNC_ID_FORK, SYNC_ID_VANILLA):
                future = self._syncs.popleft()
                if not future.done():
                    future.set_result(None)
                return
            self._report(error)
            return
        fatal = error.needs_reconnect(after, fork=fork)
        error.fatal = fatal
        if head is None:
            self._report(error)
        else:
            self._pending.popleft()
            if head.name in _SUBSCRIBE and self.state is ConnState.SUBSCRIBING:
                self._machine.move(ConnState.READY)
            if not head.future.done():
                head.future.set_exception(error)
        if fatal:
            self._fatal_error = error
            raise self._eof_error()

    def _report(self, error: BrokerError) -> None:
        """Hand an error frame that answers no pending command to ``on_error``."""
        if self._on_error is None:
            log.warning("nsqd %s: %s", self.address, error)
            return
        try:
            self._on_error(error)
        except Exception:
            log.exception("on_error handler of %s failed", self.address)

    def _handle_message(self, data: bytes) -> None:
        """Decode a message frame and deliver it."""
        if self._format is None:
            raise RemoteProtocolError("message frame on a connection that did not subscribe")
        message = decode_message(data, self._format)
        self._ledger.delivered(message.id, asyncio.get_running_loop().time())
        self._in_flight.add(message.id)
        if self._on_message is None:
            self._messages.put_nowait(message)
            return
        try:
            self._on_message(message)
        except Exception:
            log.exception("on_message handler of %s failed", self.address)

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
        if self._machine.closed:
            await self._await_reader(cancel=False)
            return
        try:
            async with asyncio.timeout(self.config.close_timeout):
                if self.state is ConnState.SUBSCRIBED:
                    future = self._submit(self._check_send(encode_cls()), encode_cls())
                    self._machine.move(ConnState.CLOSING)
                    with contextlib.suppress(NsqError):
                        await self._await_answer(b"CLS", future, None)
                await self._wait_idle()
        except TimeoutError:
            log.warning(
                "closing %s: gave up waiting after %s s (%d pending, %d in flight)",
                self.address,
                self.config.close_timeout,
                len(self._pending),
                len(self._in_flight),
            )
        self._flush()
        if self._transport is not None and not self._machine.closed:
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
            while not self._machine.closed:
                futures: list[asyncio.Future[Any]] = [
                    p.future for p in self._pending if not p.future.done()
                ]
                if futures:
                    await asyncio.wait([*futures, closed], return_when=asyncio.FIRST_COMPLETED)
                    continue
                if not self._in_flight or self._format is None:
                    return
                self._in_flight_changed.clear()
                changed = asyncio.ensure_future(self._in_flight_changed.wait())
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
        if self._machine.closed:
            return
        self._close_reason = reason
        self._machine.move(ConnState.CLOSED)
        self._writer.clear()
        while self._pending:
            pending = self._pending.popleft()
            if not pending.future.done():
                pending.future.set_exception(waiter_error)
        while self._syncs:
            future = self._syncs.popleft()
            if not future.done():
                future.set_exception(waiter_error)
        self._messages.put_nowait(None)
        self._in_flight_changed.set()
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
