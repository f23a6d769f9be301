"""A real StreamTransport for the reader's unit tests, over a stand-in of the socket layer (an
``asyncio.Transport``, which the transport is given as any object): the test pushes the reads
and the end of the stream by hand. A real one, since the compiled reader refuses a stand-in
StreamTransport."""

from __future__ import annotations

import asyncio
import json

from nsq_ha.errors import NsqError
from nsq_ha.protocol.commands import Rdy, Sub
from nsq_ha.protocol.events import Answer
from nsq_ha.protocol.frames import FrameType, encode_frame
from nsq_ha.protocol.identify import parse_identify_response
from nsq_ha.protocol.session import ClientSession
from nsq_ha.transport import StreamTransport, _Pipe

ADDRESS = "127.0.0.1:4150"


def subscribed_session(rdy: int | None = None) -> ClientSession:
    """A session past IDENTIFY with vanilla nsqd and subscribed, with RDY ``rdy`` if given."""
    session = ClientSession()
    session.start()
    session.identify({})
    answer = json.dumps({"version": "1.3.0", "max_rdy_count": 2500}).encode()
    session.receive_data(encode_frame(FrameType.RESPONSE, answer))
    assert isinstance(session.next_event(), Answer)
    session.identified(parse_identify_response(answer))
    session.ready()
    session.send(Sub("t", "c"))
    session.receive_data(encode_frame(FrameType.RESPONSE, b"OK"))
    assert isinstance(session.next_event(), Answer)
    if rdy is not None:
        session.send_nowait(Rdy(rdy))
    return session


class Wire:
    """The part of an ``asyncio.Transport`` a StreamTransport uses: keeps what is written and
    whether reading is paused (what ``hold()`` does)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.paused = False
        self.pauses = 0

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False


class Pushed:
    """A StreamTransport whose reads come from :meth:`push` and whose stream ends at
    :meth:`end`, as the socket's callbacks would hand them on."""

    def __init__(self) -> None:
        self.wire = Wire()
        self.pipe = _Pipe(asyncio.get_running_loop())
        self.pipe.connection_made(self.wire)  # type: ignore[arg-type]
        self.transport = StreamTransport(self.wire, self.pipe, ADDRESS, 65536)  # type: ignore[arg-type]

    @property
    def receiving(self) -> bool:
        """True while a receiver is handed what is read (``receive()``, not yet stopped)."""
        return self.pipe.on_end is not None

    @property
    def held(self) -> bool:
        return self.wire.paused

    @property
    def holds(self) -> int:
        return self.wire.pauses

    def push(self, data: bytes) -> None:
        """``data`` was read (in one read)."""
        self.pipe.receiver(data)

    def end(self, error: NsqError | None) -> None:
        """The stream ended: the peer closed it (``None``) or ``error``."""
        self.pipe.end(error)
