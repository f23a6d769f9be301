"""Client-side connection states and the one table of legal transitions (§1.7, §1.8, §2.8).

The states follow one nsqd connection from the client's point of view::

    INIT -> CONNECTED (magic sent) -> IDENTIFYING -> [TLS_UPGRADE] -> [COMPRESSION_UPGRADE]
         -> [AUTHENTICATING] -> READY -> SUBSCRIBING -> SUBSCRIBED -> CLOSING (CLS sent)
         -> CLOSE_WAIT (CLOSE_WAIT received) -> CLOSED

Every state may go to ``CLOSED`` (the peer or we closed the socket); the session
(:class:`~nsq_ha.protocol.session.ClientSession`) refuses any move :data:`TRANSITIONS` does not
list with :class:`~nsq_ha.errors.LocalProtocolError`, and :func:`check_command` says which
commands the client may send in which state, so an illegal command never reaches the wire.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from nsq_ha.errors import LocalProtocolError


class ConnState(enum.Enum):
    """Where one client connection to nsqd stands."""

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

_PUBLISH = frozenset(
    {b"PUB", b"PUB_TRACE", b"PUB_EXT", b"MPUB", b"MPUB_TRACE", b"MPUB_EXT", b"DPUB"}
)
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
    _S.READY: _PUBLISH
    | {b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED", b"NOP", b"INTERNAL_CREATE_TOPIC"},
    _S.SUBSCRIBING: _PUBLISH | {b"NOP"},
    _S.SUBSCRIBED: _PUBLISH | _ACKS | {b"RDY", b"CLS", b"NOP"},
    _S.CLOSING: _PUBLISH | _ACKS | {b"RDY", b"NOP"},
    _S.CLOSE_WAIT: _PUBLISH | _ACKS | {b"RDY", b"NOP"},
    _S.CLOSED: frozenset(),
}


def command_name(command: bytes) -> bytes:
    """Return the name of an encoded command (the bytes before the first space or newline)."""
    line = command.split(b"\n", 1)[0]
    return line.split(b" ", 1)[0]


def check_command(state: ConnState, command: bytes) -> bytes:
    """Return the command's name if it may be sent in ``state``, else raise LocalProtocolError.

    ``command`` is the encoded command (or just its name).
    """
    name = command_name(command)
    if name not in COMMANDS_BY_STATE[state]:
        shown = name.decode("ascii", errors="replace") or "(empty)"
        raise LocalProtocolError(f"cannot send {shown} in state {state.name}")
    return name
