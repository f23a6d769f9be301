"""Message frame payloads (§4), decoded for consumers (the broker side: :mod:`.broker`).

Layout of a message frame's data::

    i64 timestamp ns | u16 attempts | 16-byte id
    [u8 ext version [u16 len + len bytes, when version != 0]]   only with MessageFormat.ext
    [u64 offset | u32 raw size]                                 only with MessageFormat.detail
    body

The bytes cannot tell which optional parts are present: the connection knows from what it
negotiated and which subscribe command it sent (:class:`MessageFormat`). Also the RDY check on
receipt (:class:`DeliveryLedger`, §1.6).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, NamedTuple

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError
from nsq_ha.protocol.commands import json_object

#: timestamp (8) + attempts (2) + id (16).
MESSAGE_HEADER_SIZE: Final = 26
#: Ext version of a message without ext data.
EXT_VERSION_NONE: Final = 0
#: Legacy ext version: the ext bytes are a tag string.
EXT_VERSION_TAG: Final = 2
#: Ext version of a JSON header (what every current publisher writes).
EXT_VERSION_JSON: Final = 4

_HEADER: Final = struct.Struct(">qH16s")
_FORK_ID: Final = struct.Struct(">QQ")
_HEADER_FORK: Final = struct.Struct(">qHQQ")  # _HEADER with the id as _FORK_ID
_EXT_LEN: Final = struct.Struct(">H")
_DETAIL: Final = struct.Struct(">QI")
_new_tuple: Final = tuple.__new__


@dataclass(frozen=True, slots=True)
class MessageFormat:
    """Which optional parts the message frames of one connection carry: ``fork_ids`` (the
    fork's binary ``u64 internal id + u64 trace id``; vanilla's are 16 opaque ASCII hex
    characters), ``ext`` (IDENTIFY ``extend_support`` on an ext topic), ``detail`` (the 12-byte
    offset/raw-size part of SUB_ORDERED / SUB_ADVANCED)."""

    fork_ids: bool = True
    ext: bool = False
    detail: bool = False

    def __post_init__(self) -> None:
        if not self.fork_ids and (self.ext or self.detail):
            raise InvalidArgumentError("vanilla message frames have no ext or detail part")

    @classmethod
    def vanilla(cls) -> MessageFormat:
        """The format of every vanilla nsqd message frame."""
        return cls(fork_ids=False)


class DecodedMessage(NamedTuple):
    """One delivered message (build it with keywords): ``internal_id``/``trace_id`` are set for
    fork ids, ``offset``/``raw_size`` with the detail part, ``ext_version``/``ext_data`` with the
    ext part (data ``b""`` for version 0). A named tuple: one is made per message, and a frozen
    dataclass costs 2.5x as much."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes
    internal_id: int | None = None
    trace_id: int | None = None
    ext_version: int | None = None
    ext_data: bytes | None = None
    offset: int | None = None
    raw_size: int | None = None

    def json_header(self) -> dict[str, object]:
        """The ext JSON header as a dict (``{}`` for none); not an object: RemoteProtocolError."""
        if self.ext_version != EXT_VERSION_JSON or not self.ext_data:
            return {}
        return json_object(self.ext_data, "ext JSON header", RemoteProtocolError)


def decode_message(data: bytes, fmt: MessageFormat) -> DecodedMessage:
    """Decode a message frame's data; truncated or inconsistent data raises RemoteProtocolError."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise RemoteProtocolError(
            f"message frame has {len(data)} bytes, fewer than the {MESSAGE_HEADER_SIZE}-byte header"
        )
    internal: int | None = None
    trace: int | None = None
    ext_ver: int | None = None
    ext_data: bytes | None = None
    offset: int | None = None
    raw_size: int | None = None
    if fmt.fork_ids:  # the id's two numbers in the same unpack: one call fewer per message
        timestamp, attempts, internal, trace = _HEADER_FORK.unpack_from(data)
        msg_id = data[10:MESSAGE_HEADER_SIZE]
        if type(msg_id) is not bytes:  # a bytes-like frame (pure Python): no call otherwise
            msg_id = bytes(msg_id)
    else:
        timestamp, attempts, msg_id = _HEADER.unpack_from(data)
    position = MESSAGE_HEADER_SIZE
    if fmt.ext:
        if len(data) < position + 1:
            raise RemoteProtocolError("message frame ends before its ext version byte")
        ext_ver = data[position]
        position += 1
        ext_data = b""
        if ext_ver != EXT_VERSION_NONE:
            if len(data) < position + _EXT_LEN.size:
                raise RemoteProtocolError("message frame ends inside its ext length")
            (ext_len,) = _EXT_LEN.unpack_from(data, position)
            position += _EXT_LEN.size
            if len(data) < position + ext_len:
                raise RemoteProtocolError(f"message frame ends inside its {ext_len}-byte ext data")
            ext_data = bytes(data[position : position + ext_len])
            position += ext_len
    if fmt.detail:
        if len(data) < position + _DETAIL.size:
            raise RemoteProtocolError("message frame ends inside its offset/raw-size part")
        offset, raw_size = _DETAIL.unpack_from(data, position)
        position += _DETAIL.size
    body = bytes(data[position:])
    # the tuple built directly, in field order: a third of what the keyword constructor costs
    return _new_tuple(
        DecodedMessage,
        (timestamp, attempts, msg_id, body, internal, trace, ext_ver, ext_data, offset, raw_size),
    )


#: Live deliveries allowed per unit of the largest RDY sent.
SLACK = 2
#: Shortest expiry used, in seconds, whatever msg_timeout nsqd announced (a lying 1 ms would
#: expire every delivery at once).
MIN_EXPIRY = 1.0


class DeliveryLedger:
    """The receipt-side RDY check of one connection: is nsqd sending more messages than the
    client allowed (which would make the client buffer without limit)?

    nsqd frees an in-flight slot on FIN or REQ, but also unseen: a message times out
    ``msg_timeout`` after nsqd sent it, and the fork requeues a channel it resets. So the ledger
    counts only what an honest nsqd must still hold: the **largest RDY sent** (a smaller one can
    arrive after messages sent under the larger), and the **live deliveries** (received less
    than ``expiry`` seconds ago and not answered with FIN or REQ; a TOUCH renews one, a
    redelivery replaces it). More than :data:`SLACK` x that RDY live deliveries is a protocol
    violation (:class:`~nsq_ha.errors.RemoteProtocolError`): the slack leaves one RDY window
    for slots nsqd freed without telling. Without any RDY sent, no message is allowed.
    """

    __slots__ = ("_live", "_max_rdy", "expiry")

    def __init__(self, *, expiry: float) -> None:
        """Count a delivery as live for ``expiry`` seconds (at least :data:`MIN_EXPIRY`)."""
        self.expiry = max(MIN_EXPIRY, expiry)
        self._max_rdy = 0
        #: message id -> when it was received or last touched; oldest first
        self._live: dict[bytes, float] = {}

    def __repr__(self) -> str:
        return f"<DeliveryLedger live={len(self._live)} limit={self.limit}>"

    @property
    def limit(self) -> int:
        """How many live deliveries are allowed now."""
        return SLACK * self._max_rdy

    def live(self, now: float) -> int:
        """Live deliveries at ``now``."""
        self._expire(now)
        return len(self._live)

    def rdy(self, count: int) -> None:
        """Record a ``RDY count`` sent."""
        if count > self._max_rdy:
            self._max_rdy = count

    def delivered(self, message_id: bytes, now: float) -> None:
        """Record a message received at ``now``; raise RemoteProtocolError beyond the limit.
        Expired deliveries are dropped only at the limit: the same decision with no scan in the
        common case (``next(iter())`` on a dict emptied from the front walks every freed slot)."""
        live = self._live
        if message_id in live:  # nsqd timed it out and sent it again: still one message
            del live[message_id]
        elif len(live) >= self.limit:
            self._expire(now)
            if len(live) >= self.limit:
                raise RemoteProtocolError(
                    f"nsqd sent a message beyond the RDY given: {len(live)} messages already in "
                    f"flight unanswered within {self.expiry:g} s, allowed {self.limit} "
                    f"({SLACK} x the largest RDY sent, {self._max_rdy})"
                )
        live[message_id] = now

    def settled(self, message_id: bytes) -> None:
        """Forget a message answered with FIN or REQ."""
        self._live.pop(message_id, None)

    def touched(self, message_id: bytes, now: float) -> None:
        """Renew a message answered with TOUCH (nsqd restarts its timeout); one already expired
        is forgotten instead (nsqd has timed it out: the TOUCH fails there)."""
        live = self._live
        received = live.pop(message_id, None)
        if received is not None and received > now - self.expiry:
            live[message_id] = now

    def _expire(self, now: float) -> None:
        """Drop deliveries older than ``expiry`` (they are first: the dict is oldest first)."""
        live = self._live
        horizon = now - self.expiry
        while live:
            oldest = next(iter(live))
            if live[oldest] > horizon:
                return
            del live[oldest]
