"""What a :class:`~nsq_ha.protocol.session.ClientSession` reads from nsqd: one event per frame,
after the session's bookkeeping (state moves, the FIFO of pending commands, in-flight ids).

The per-frame events are named tuples, which the session builds with ``tuple.__new__`` (a third
of a frozen dataclass's cost, on the path of every message and answer); the field-less ones are
singletons (:data:`HEARTBEAT`, :data:`CLOSE_WAIT`, :data:`SYNCED`): compare them with ``is``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from nsq_ha.errors import BrokerError
from nsq_ha.protocol.message import DecodedMessage


class Answer(NamedTuple):
    """A response frame answering the oldest pending command (``command`` is its name)."""

    data: bytes
    command: bytes


class Failed(NamedTuple):
    """An error frame.

    ``command`` is the name of the pending command it answers, ``None`` when it answers none
    (FIN/REQ/TOUCH failures, or an error nsqd sent on its own); ``fatal`` is True when the
    connection must be dropped (nsqd closes it, or the stream is out of step); ``error.fatal``
    says the same.
    """

    error: BrokerError
    fatal: bool
    command: bytes | None


class Delivered(NamedTuple):
    """A message frame, decoded; its id is now in flight."""

    message: DecodedMessage


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """nsqd's heartbeat: send ``NOP``."""


@dataclass(frozen=True, slots=True)
class CloseWait:
    """``CLOSE_WAIT``, nsqd's answer to ``CLS``: no more messages will be sent."""


@dataclass(frozen=True, slots=True)
class Synced:
    """The answer to a sync ``TOUCH``: nsqd processed every command sent before it."""


class NeedData(enum.Enum):
    """The type of :data:`NEED_DATA`."""

    NEED_DATA = "need data"


#: No whole frame is buffered: read more bytes.
NEED_DATA: Final = NeedData.NEED_DATA
#: The heartbeat event (one instance).
HEARTBEAT: Final = Heartbeat()
#: The CLOSE_WAIT event (one instance).
CLOSE_WAIT: Final = CloseWait()
#: The sync event (one instance).
SYNCED: Final = Synced()

#: Everything :meth:`ClientSession.next_event` returns.
Event = Answer | Failed | Delivered | Heartbeat | CloseWait | Synced | Literal[NeedData.NEED_DATA]
