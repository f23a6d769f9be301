"""The client side of one nsqd connection, sans-IO (h11's ``Connection`` for NSQ).

:class:`ClientSession` decides everything about the protocol and does no I/O: typed commands go
in (:mod:`nsq_ha.protocol.commands`, :mod:`nsq_ha.protocol.publish`), their bytes come out; the
caller writes those, feeds it the bytes it reads and acts on the events it hands out::

    session = ClientSession()
    write(session.start())                        # magic
    write(session.identify(body))                 # IDENTIFY, answered by an Answer event
    ...
    write(session.send(SubOrdered("t", "c", 0)))  # answered
    write(session.send_nowait(Rdy(1)))           # never answered on success
    session.receive_data(chunk, now)
    while (event := session.next_event()) is not NEED_DATA:
        ...                                       # Answer, Failed, Delivered, Heartbeat, ...

It owns the connection state (moves checked against :data:`TRANSITIONS`, commands against
:data:`COMMANDS_BY_STATE`), the FIFO of commands awaiting an answer (nsqd answers in order,
§1.5), the message format, the ids in flight, the RDY check on receipt, heartbeat flood
detection, and whether an error frame means the connection must be dropped (after that nothing
more can be sent). The caller passes the time with the bytes.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Mapping
from typing import Final, NoReturn

from nsq_ha.errors import (
    BrokerError,
    InvalidArgumentError,
    LocalProtocolError,
    MessageCommandError,
    RemoteProtocolError,
)
from nsq_ha.protocol.commands import MAGIC_V2, Auth, Command, Fin, Identify, Rdy, Req, Touch
from nsq_ha.protocol.error_frames import must_drop, parse_error_frame
from nsq_ha.protocol.events import CLOSE_WAIT as CLOSE_WAIT_EVENT
from nsq_ha.protocol.events import HEARTBEAT as HEARTBEAT_EVENT
from nsq_ha.protocol.events import NEED_DATA, SYNCED, Answer, Delivered, Event, Failed
from nsq_ha.protocol.frames import (
    CLOSE_WAIT,
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_HEADER_SIZE,
    HEARTBEAT,
    FrameType,
)
from nsq_ha.protocol.identify import Negotiated
from nsq_ha.protocol.message import DeliveryLedger, MessageFormat, decode_message


class ConnState(enum.Enum):
    """Where one client connection to nsqd stands (§1.7, §1.8, §2.8)::

        INIT -> CONNECTED (magic sent) -> IDENTIFYING -> [TLS_UPGRADE] -> [COMPRESSION_UPGRADE]
             -> [AUTHENTICATING] -> READY -> SUBSCRIBING -> SUBSCRIBED -> CLOSING (CLS sent)
             -> CLOSE_WAIT (CLOSE_WAIT received) -> CLOSED

    Every state may go to ``CLOSED`` (the peer or we closed the socket).
    """

    INIT = "init"
    CONNECTED = "connected"
    IDENTIFYING = "identifying"
    TLS_UPGRADE = "tls_upgrade"
    COMPRESSION_UPGRADE = "compression_upgrade"
    AUTHENTICATING = "authenticating"
    READY = "ready"
    SUBSCRIBING = "subscribing"
    SUBSCRIBED = "subscribed"
    CLOSING = "closing"
    CLOSE_WAIT = "close_wait"
    CLOSED = "closed"


_S = ConnState

#: Legal moves; ``CLOSED`` is reachable from every state and leads nowhere.
TRANSITIONS: Mapping[ConnState, frozenset[ConnState]] = {
    _S.INIT: frozenset({_S.CONNECTED, _S.CLOSED}),
    _S.CONNECTED: frozenset({_S.IDENTIFYING, _S.READY, _S.CLOSED}),
    _S.IDENTIFYING: frozenset(
        {_S.TLS_UPGRADE, _S.COMPRESSION_UPGRADE, _S.AUTHENTICATING, _S.READY, _S.CLOSED}
    ),
    _S.TLS_UPGRADE: frozenset({_S.COMPRESSION_UPGRADE, _S.AUTHENTICATING, _S.READY, _S.CLOSED}),
    _S.COMPRESSION_UPGRADE: frozenset({_S.AUTHENTICATING, _S.READY, _S.CLOSED}),
    _S.AUTHENTICATING: frozenset({_S.READY, _S.CLOSED}),
    # a failed non-fatal SUB cannot happen (every SUB error is fatal), but SUBSCRIBING -> READY
    # is kept for a SUB whose caller gave up before the answer.
    _S.READY: frozenset({_S.SUBSCRIBING, _S.CLOSED}),
    _S.SUBSCRIBING: frozenset({_S.SUBSCRIBED, _S.READY, _S.CLOSED}),
    _S.SUBSCRIBED: frozenset({_S.CLOSING, _S.CLOSED}),
    _S.CLOSING: frozenset({_S.CLOSE_WAIT, _S.CLOSED}),
    _S.CLOSE_WAIT: frozenset({_S.CLOSED}),
    _S.CLOSED: frozenset(),
}

_PUBS = frozenset({b"PUB", b"PUB_TRACE", b"PUB_EXT", b"MPUB", b"MPUB_TRACE", b"MPUB_EXT", b"DPUB"})
_ACKS = frozenset({b"FIN", b"REQ", b"TOUCH"})

#: Commands the client may send in each state (nsqd's own rules, §1.7, narrowed to what a
#: well-behaved client does: IDENTIFY and AUTH only during the handshake).
COMMANDS_BY_STATE: Mapping[ConnState, frozenset[bytes]] = {
    _S.INIT: frozenset(),
    _S.CONNECTED: frozenset({b"IDENTIFY", b"NOP"}),
    _S.IDENTIFYING: frozenset({b"NOP"}),
    _S.TLS_UPGRADE: frozenset(),
    _S.COMPRESSION_UPGRADE: frozenset(),
    _S.AUTHENTICATING: frozenset({b"AUTH", b"NOP"}),
    _S.READY: _PUBS | {b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED", b"NOP"},
    _S.SUBSCRIBING: _PUBS | {b"NOP"},
    _S.SUBSCRIBED: _PUBS | _ACKS | {b"RDY", b"CLS", b"NOP"},
    _S.CLOSING: _PUBS | _ACKS | {b"RDY", b"NOP"},
    _S.CLOSE_WAIT: _PUBS | _ACKS | {b"RDY", b"NOP"},
    _S.CLOSED: frozenset(),
}


#: Commands nsqd never answers on success (their errors may still arrive).
NO_RESPONSE_COMMANDS = frozenset({b"FIN", b"REQ", b"TOUCH", b"RDY", b"NOP"})
#: The subscribe commands.
SUBSCRIBE_COMMANDS = frozenset({b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED"})
#: Commands only the fork knows.
FORK_ONLY_COMMANDS = frozenset(
    {b"SUB_ORDERED", b"SUB_ADVANCED", b"PUB_TRACE", b"PUB_EXT", b"MPUB_TRACE", b"MPUB_EXT"}
)
#: msg_timeout assumed when nsqd does not announce one (nsqd's default), seconds.
DEFAULT_MSG_TIMEOUT = 60.0
#: Heartbeats nsqd may send within one second: one per interval, 1 s at the least (§1.4), a few
#: bunched by a stall; more is a flood, a protocol violation (a compressed read may hold millions).
MAX_HEARTBEATS_PER_SECOND = 10
#: Ids a sync TOUCHes, never in flight: a fork internal id of 2**63-1, a vanilla id (16 hex
#: characters) its generator cannot reach soon.
SYNC_ID_FORK = b"\x7f" + b"\xff" * 7 + b"\x00" * 8
SYNC_ID_VANILLA = b"ffffffffffffffff"
_SYNC_IDS = (SYNC_ID_FORK, SYNC_ID_VANILLA)
#: the upgrades answer OK through the new layer: an error there belongs to IDENTIFY
_UPGRADE_ANSWERS = b"IDENTIFY"
#: builds the named-tuple events without their constructor's overhead (see events.py)
_new: Final = tuple.__new__
_MESSAGE: Final = FrameType.MESSAGE
_RESPONSE: Final = FrameType.RESPONSE
_SUBSCRIBED: Final = ConnState.SUBSCRIBED
_SUBSCRIBING: Final = ConnState.SUBSCRIBING
_CLOSED: Final = ConnState.CLOSED
_SIZE: Final = struct.Struct(">I")
_HEADER: Final = struct.Struct(">Ii")
# a dict lookup is far cheaper than FrameType(n)
_FRAME_TYPES: Final = {int(t): t for t in FrameType}
#: consumed bytes kept before the buffer is compacted
_COMPACT_AFTER: Final = 64 * 1024


class FrameDecoder:
    """Incremental decoder of nsqd's frame stream: ``receive_data`` adds bytes, ``next_parts``
    returns the frames completed. A frame sized below 4 or above ``max_frame_size``, or of an
    unknown type, raises :class:`RemoteProtocolError`, and so does every call after it."""

    __slots__ = ("_buffer", "_error", "_pos", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 4:
            raise InvalidArgumentError(f"max_frame_size must be >= 4, got {max_frame_size}")
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        #: the first unreturned byte; the prefix before it is cut off once large (stays O(n))
        self._pos = 0
        self._error: RemoteProtocolError | None = None

    def __repr__(self) -> str:
        state = "broken" if self._error is not None else "ok"
        return (
            f"<FrameDecoder {state} buffered={self.buffered} max_frame_size={self.max_frame_size}>"
        )

    @property
    def buffered(self) -> int:
        """Number of received bytes not yet returned as a frame."""
        return len(self._buffer) - self._pos

    def receive_data(self, data: bytes) -> None:
        """Append bytes received from the peer."""
        if self._error is not None:
            raise self._error
        self._buffer += data

    def next_parts(self) -> tuple[FrameType, bytes] | None:
        """Return the next whole frame as ``(type, data)``, or ``None`` if more bytes are needed."""
        if self._error is not None:
            raise self._error
        buffer, pos = self._buffer, self._pos
        available = len(buffer) - pos
        if available < FRAME_HEADER_SIZE:
            if available >= _SIZE.size:  # a bad size fails as soon as it is here
                self._check_size(_SIZE.unpack_from(buffer, pos)[0])
            return None
        size, raw_type = _HEADER.unpack_from(buffer, pos)  # one unpack for both
        if size < 4 or size > self.max_frame_size:
            self._check_size(size)
        frame_type = _FRAME_TYPES.get(raw_type)
        if frame_type is None:
            self._fail(f"unknown frame type {raw_type}")
        end = pos + _SIZE.size + size
        if len(buffer) < end:
            return None
        data = bytes(buffer[pos + FRAME_HEADER_SIZE : end])
        if end == len(buffer):
            buffer.clear()
            self._pos = 0
        elif end >= _COMPACT_AFTER:
            del buffer[:end]
            self._pos = 0
        else:
            self._pos = end
        return frame_type, data

    def _check_size(self, size: int) -> None:
        if size < 4:
            self._fail(f"frame size {size} is below 4: no room for the frame type")
        if size > self.max_frame_size:
            self._fail(f"frame size {size} exceeds the limit of {self.max_frame_size} bytes")

    def take_buffered(self) -> bytes:
        """Remove and return the bytes not returned as a frame (the stream changed layer)."""
        data = bytes(self._buffer[self._pos :])
        self._buffer.clear()
        self._pos = 0
        return data

    def feed_eof(self) -> None:
        """Tell the decoder the peer closed; raise if a frame was cut off."""
        if self._error is not None:
            raise self._error
        if self.buffered:
            self._fail(f"connection closed inside a frame ({self.buffered} bytes pending)")

    def _fail(self, reason: str) -> NoReturn:
        self._error = RemoteProtocolError(reason)
        self.take_buffered()
        raise self._error


class ClientSession:
    """The protocol state of one client connection to nsqd; see the module docstring."""

    __slots__ = (
        "_beats",
        "_beats_since",
        "_decoder",
        "_in_flight",
        "_ledger",
        "_now",
        "_pending",
        "_syncs",
        "fatal_error",
        "is_fork",
        "message_format",
        "negotiated",
        "state",
    )

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        """Start in ``INIT``; frames above ``max_frame_size`` are a protocol violation."""
        #: The connection state.
        self.state = ConnState.INIT
        #: What IDENTIFY settled (``None`` before the answer).
        self.negotiated: Negotiated | None = None
        #: True when nsqd identified as the fork (fork-only commands, fork message ids).
        self.is_fork = False
        #: The format of message frames (``None`` until a subscribe command was sent).
        self.message_format: MessageFormat | None = None
        #: The error frame after which the connection must be dropped, once one came.
        self.fatal_error: BrokerError | None = None
        self._decoder = FrameDecoder(max_frame_size)
        self._pending: deque[bytes] = deque()
        self._in_flight: set[bytes] = set()
        self._ledger = DeliveryLedger(expiry=DEFAULT_MSG_TIMEOUT)
        self._syncs = 0
        self._now = 0.0
        #: heartbeats received since ``_beats_since`` (the first of the current second)
        self._beats = 0
        self._beats_since = float("-inf")

    def __repr__(self) -> str:
        return (
            f"<ClientSession {self.state.name} pending={self.pending} in_flight={self.in_flight}>"
        )

    def _move(self, new: ConnState) -> None:
        """Enter ``new``; a move :data:`TRANSITIONS` does not allow raises LocalProtocolError."""
        if new not in TRANSITIONS[self.state]:
            raise LocalProtocolError(f"illegal state transition {self.state.name} -> {new.name}")
        self.state = new

    @property
    def closed(self) -> bool:
        """True once the connection is ``CLOSED``."""
        return self.state is _CLOSED

    @property
    def pending(self) -> int:
        """Commands sent and not answered yet."""
        return len(self._pending)

    @property
    def in_flight(self) -> int:
        """Messages delivered and not yet answered with FIN or REQ."""
        return len(self._in_flight)

    def start(self) -> bytes:
        """Return the magic, the first bytes on a new connection."""
        self._move(ConnState.CONNECTED)
        return MAGIC_V2

    def identify(self, body: Mapping[str, object], *, max_body_size: int | None = None) -> bytes:
        """Return the IDENTIFY command for ``body``; its answer is an :class:`Answer`."""
        command = Identify.of(body, max_body_size=max_body_size)
        self._allowed(command.name)
        self._move(ConnState.IDENTIFYING)
        self._pending.append(b"IDENTIFY")
        return command.encode()

    def identified(self, negotiated: Negotiated) -> None:
        """Record what the IDENTIFY answer settled."""
        self.negotiated = negotiated
        self.is_fork = negotiated.is_fork is True

    def start_tls(self) -> None:
        """Enter the TLS upgrade; nsqd's ``OK`` through TLS is the next answer. Bytes received
        and not decoded yet raise RemoteProtocolError: they must not pass for bytes from TLS."""
        if self._decoder.buffered:
            raise RemoteProtocolError(
                f"nsqd sent {self._decoder.buffered} bytes before the TLS handshake"
            )
        self._move(ConnState.TLS_UPGRADE)
        self._pending.append(_UPGRADE_ANSWERS)

    def start_compression(self) -> bytes:
        """Enter the compression upgrade; nsqd's ``OK`` through it is the next answer. Return the
        bytes received and not decoded yet: they came compressed (decompress, feed them back)."""
        self._move(ConnState.COMPRESSION_UPGRADE)
        self._pending.append(_UPGRADE_ANSWERS)
        return self._decoder.take_buffered()

    def authenticate(self, secret: str | bytes, *, max_body_size: int | None = None) -> bytes:
        """Return the AUTH command; its answer is an :class:`Answer`."""
        self._move(ConnState.AUTHENTICATING)
        command = Auth.of(secret, max_body_size=max_body_size)
        self._allowed(command.name)
        self._pending.append(b"AUTH")
        return command.encode()

    def ready(self, *, msg_timeout: float | None = None) -> None:
        """Enter ``READY``: deliveries live for nsqd's msg_timeout, ``msg_timeout`` or 60 s."""
        announced = self.negotiated.msg_timeout if self.negotiated is not None else None
        self._ledger = DeliveryLedger(expiry=announced or msg_timeout or DEFAULT_MSG_TIMEOUT)
        self._move(ConnState.READY)

    def _allowed(self, name: bytes) -> None:
        if self.fatal_error is not None:
            raise LocalProtocolError(f"cannot send after the fatal error {self.fatal_error}")
        if name not in COMMANDS_BY_STATE[self.state]:
            raise LocalProtocolError(f"cannot send {name.decode()} in state {self.state.name}")

    def send(self, command: Command) -> bytes:
        """Return the bytes of ``command``, a command nsqd answers (with an :class:`Answer` or a
        :class:`Failed`), after recording it. Raises LocalProtocolError for a command not allowed
        now, one without an answer or a fork-only command on vanilla nsqd."""
        name = command.name
        self._allowed(name)
        if name in NO_RESPONSE_COMMANDS:
            raise LocalProtocolError(f"{name.decode()} has no response: use send_nowait()")
        if name in FORK_ONLY_COMMANDS and not self.is_fork:
            raise LocalProtocolError(f"{name.decode()} exists only on the fork; nsqd is vanilla")
        data = command.encode()  # a publish checks its sizes here: refused, nothing is recorded
        if name in SUBSCRIBE_COMMANDS:
            negotiated = self.negotiated
            if self.is_fork:  # SUB_ORDERED and SUB_ADVANCED add the offset/raw-size part
                ext = negotiated is not None and negotiated.extend_support
                self.message_format = MessageFormat(ext=ext, detail=name != b"SUB")
            else:
                self.message_format = MessageFormat.vanilla()
            self._move(_SUBSCRIBING)
        elif name == b"CLS":
            self._move(ConnState.CLOSING)
        self._pending.append(name)
        return data

    def send_nowait(self, command: Command, *, now: float | None = None) -> bytes:
        """Return the bytes of ``command`` after recording it: FIN, REQ, TOUCH (at ``now``), RDY
        or NOP (no answer on success). A RDY count over the negotiated ``max_rdy_count`` raises
        InvalidArgumentError (nsqd would close the connection)."""
        name = command.name
        self._allowed(name)
        if name not in NO_RESPONSE_COMMANDS:
            raise LocalProtocolError(f"{name.decode()} has a response: use send()")
        if isinstance(command, Fin | Req):
            self._in_flight.discard(command.message_id)
            self._ledger.settled(command.message_id)
        elif isinstance(command, Touch):
            self._ledger.touched(command.message_id, self._now if now is None else now)
        elif isinstance(command, Rdy):
            count, negotiated = command.count, self.negotiated
            limit = negotiated.max_rdy_count if negotiated is not None else None
            if limit is not None and count > limit:
                raise InvalidArgumentError(f"RDY count {count} is over max_rdy_count {limit}")
            self._ledger.rdy(count)
        return command.encode()

    def fin(self, message_id: bytes) -> bytes:
        """Return the FIN for a message delivered here, settling it, without building a
        :class:`Fin` (the consumer's hot path); any other id goes through :meth:`send_nowait`."""
        in_flight = self._in_flight
        if message_id in in_flight and self.state is _SUBSCRIBED and self.fatal_error is None:
            in_flight.discard(message_id)
            self._ledger.settled(message_id)
            return b"FIN " + message_id + b"\n"
        return self.send_nowait(Fin(message_id))

    def sync(self) -> bytes:
        """Return a TOUCH for an id never in flight: nsqd answers E_TOUCH_FAILED (non-fatal on
        both) once it processed every command before, which comes as :data:`~.events.SYNCED`."""
        data = self.send_nowait(Touch(SYNC_ID_FORK if self.is_fork else SYNC_ID_VANILLA))
        self._syncs += 1
        return data

    def receive_data(self, data: bytes, now: float = 0.0) -> None:
        """Add bytes read from nsqd at time ``now`` (seconds, any monotonic clock)."""
        self._decoder.receive_data(data)
        self._now = now

    def receive_eof(self) -> None:
        """nsqd closed the stream; raise RemoteProtocolError if it cut a frame off."""
        self._decoder.feed_eof()

    def next_event(self) -> Event:
        """Return the next event, or :data:`~nsq_ha.protocol.events.NEED_DATA`; bytes nsqd must
        not send (a bad frame, an unawaited answer, a message beyond the RDY given or before a
        subscribe) raise RemoteProtocolError."""
        parts = self._decoder.next_parts()
        if parts is None:
            return NEED_DATA
        kind, data = parts
        if kind is _MESSAGE:
            fmt = self.message_format
            if fmt is None:
                raise RemoteProtocolError("message frame on a connection that did not subscribe")
            message = decode_message(data, fmt)
            self._ledger.delivered(message.id, self._now)
            self._in_flight.add(message.id)
            return _new(Delivered, (message,))
        if kind is not _RESPONSE:
            return self._failed(data)
        if data == HEARTBEAT:  # unless more than MAX_HEARTBEATS_PER_SECOND came within 1 s
            now = self._now
            if now - self._beats_since >= 1.0:
                self._beats_since = now
                self._beats = 0
            self._beats += 1
            if self._beats > MAX_HEARTBEATS_PER_SECOND:
                raise RemoteProtocolError(
                    f"nsqd sent more than {MAX_HEARTBEATS_PER_SECOND} heartbeats within 1 s, where "
                    "nsqd sends one per heartbeat interval (1 s at the least): a broken or hostile "
                    "server; check what listens at this address"
                )
            return HEARTBEAT_EVENT
        if not self._pending:  # the answer to the oldest pending command
            raise RemoteProtocolError(f"response {data[:64]!r} answers no pending command")
        name = self._pending.popleft()
        if name == b"CLS":
            if data != CLOSE_WAIT:
                raise RemoteProtocolError(f"expected CLOSE_WAIT after CLS, got {data[:64]!r}")
            self._move(ConnState.CLOSE_WAIT)
            return CLOSE_WAIT_EVENT
        if name in SUBSCRIBE_COMMANDS and self.state is ConnState.SUBSCRIBING:
            self._move(ConnState.SUBSCRIBED)
        return _new(Answer, (data, name))

    def _failed(self, data: bytes) -> Event:
        """An error frame; FIN/REQ/TOUCH failures answer no pending command (no FIFO place)."""
        error = parse_error_frame(data)
        # the fork's rules, the stricter guess, unless nsqd identified as vanilla
        fork = self.negotiated is None or self.negotiated.is_fork is not False
        head: bytes | None = None
        if isinstance(error, MessageCommandError):
            if self._syncs and error.message_id in _SYNC_IDS:
                self._syncs -= 1
                return SYNCED
        else:
            head = self._pending.popleft() if self._pending else None
            if head in SUBSCRIBE_COMMANDS and self.state is ConnState.SUBSCRIBING:
                self._move(ConnState.READY)
        fatal = error.fatal = must_drop(type(error), head, fork=fork)
        if fatal:
            self.fatal_error = error
        return _new(Failed, (error, fatal, head))

    def close(self) -> None:
        """Enter ``CLOSED``: pending commands get no answer, nothing can be sent any more."""
        if self.state is not _CLOSED:
            self._move(ConnState.CLOSED)
        self._pending.clear()
        self._syncs = 0
