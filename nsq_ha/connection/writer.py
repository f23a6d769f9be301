"""The send side of one connection: commands queued in one event-loop turn leave as one write.

:class:`CommandWriter` gathers command bytes, hands them to the :class:`StreamTransport` at the
end of the loop turn (or at once past ``limit`` bytes), lets senders wait while the socket
buffer is full (:meth:`CommandWriter.backpressure`; the caller bounds that wait), and answers a
flood of heartbeats with one NOP per write instead of one per heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nsq_ha.errors import NsqConnectionError
from nsq_ha.protocol.commands import encode_nop
from nsq_ha.transport import StreamTransport, loop_of

__all__ = ["CommandWriter"]

log = logging.getLogger(__name__)


class CommandWriter:
    """Coalescing writer in front of one transport."""

    def __init__(self, limit: int, address: str) -> None:
        """Flush at once past ``limit`` queued bytes; make senders wait above it."""
        self.limit = limit
        self.address = address
        self.transport: StreamTransport | None = None
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_handle: asyncio.Handle | None = None
        #: a NOP waits in ``_out``: another heartbeat needs no other one
        self._nop_queued = False
        #: socket writes issued (a coalescing statistic)
        self.writes = 0

    def __repr__(self) -> str:
        """Show what is queued."""
        return f"<CommandWriter {self.address} queued={self._out_size} writes={self.writes}>"

    def enqueue(self, data: bytes) -> None:
        """Queue bytes; everything queued in one loop turn leaves in one write."""
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= self.limit:
            self.flush()
        elif self._flush_handle is None:
            self._flush_handle = loop_of(self.transport).call_soon(self.flush)

    def answer(self, data: bytes, *, last: bool) -> None:
        """Queue a message's answer. The ``last`` one nsqd waits for (nothing else is in
        flight: an ordered channel sends its next message only after it) leaves now, with
        what is queued, instead of a loop turn later."""
        if not last:
            self.enqueue(data)
            return
        self._out.append(data)
        self._out_size += len(data)
        self.flush()

    def flush(self) -> None:
        """Hand the queued bytes to the socket layer as one write."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._out or self.transport is None:
            return
        data = b"".join(self._out)
        self.clear()
        try:
            self.transport.write(data)
        except NsqConnectionError as exc:  # the read loop reports the close
            log.debug("write to %s dropped: %s", self.address, exc)
            return
        self.writes += 1

    def clear(self) -> None:
        """Drop what is queued (the connection is closing)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._out.clear()
        self._out_size = 0
        self._nop_queued = False

    def answer_heartbeat(self) -> None:
        """Queue a NOP, unless one is already queued or the socket buffer is full (nsqd is
        not reading what we sent: one more NOP tells it nothing)."""
        if self._nop_queued:
            return
        if self.transport is not None and self.transport.write_buffer_size() > self.limit:
            return
        self._nop_queued = True
        self.enqueue(encode_nop())

    def backlogged(self) -> bool:
        """True while the socket layer and the queue hold more than ``limit`` bytes."""
        transport = self.transport
        return transport is not None and transport.write_buffer_size() + self._out_size > self.limit

    async def backpressure(self) -> None:
        """Wait while the socket layer holds more than ``limit`` bytes (unbounded here: the
        caller puts a timeout around it)."""
        transport = self.transport
        if transport is None:
            return
        if self.backlogged():
            self.flush()
            with contextlib.suppress(NsqConnectionError):  # waiters learn it from the reader
                await transport.drain()
