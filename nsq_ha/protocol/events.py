"""What a :class:`~nsq_ha.protocol.session.ClientSession` reads from nsqd: one event per frame,
after the session's bookkeeping. The events with fields are named tuples, which the session
builds with ``tuple.__new__`` (a third of a frozen dataclass's cost, on the path of every message
and answer); the field-less ones are the members of :class:`Signal`: compare them with ``is``.
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple

from nsq_ha.errors import BrokerError
from nsq_ha.protocol.message import DecodedMessage


class Answer(NamedTuple):
    """A response frame answering the oldest pending command (``command`` is its name)."""

    data: bytes
    command: bytes


class Failed(NamedTuple):
    """An error frame: ``command`` is the name of the pending command it answers (``None``:
    none, as for FIN/REQ/TOUCH failures); ``fatal`` (and ``error.fatal``) is True when the
    connection must be dropped (nsqd closes it, or the stream is out of step)."""

    error: BrokerError
    fatal: bool
    command: bytes | None


class Delivered(NamedTuple):
    """A message frame, decoded; its id is now in flight."""

    message: DecodedMessage


class Signal(enum.Enum):
    """The field-less events, one member each: compare them with ``is``."""

    #: No whole frame is buffered: read more bytes.
    NEED_DATA = "need data"
    #: nsqd's heartbeat: send ``NOP``.
    HEARTBEAT = "heartbeat"
    #: ``CLOSE_WAIT``, nsqd's answer to ``CLS``: no more messages will be sent.
    CLOSE_WAIT = "close wait"
    #: The answer to a sync ``TOUCH``: nsqd processed every command sent before it.
    SYNCED = "synced"


NEED_DATA: Final = Signal.NEED_DATA
HEARTBEAT: Final = Signal.HEARTBEAT
CLOSE_WAIT: Final = Signal.CLOSE_WAIT
SYNCED: Final = Signal.SYNCED

#: Everything :meth:`ClientSession.next_event` returns.
Event = Answer | Failed | Delivered | Signal
