"""One emulated nsqd connection's output side: compression and the node's write faults.

:class:`FrameWriter` writes frames in the order the connection hands them over, the frames of
one event-loop turn in one socket write (nsqd buffers its output too; the emulator never holds
a frame past the turn), compressed once the connection negotiated snappy or deflate, and
applies the node's :class:`~nsq_ha.devcluster.model.NodeFaults`: responses and errors held
(``delay``) or swallowed (``drop``), and the connection cut after a byte budget
(``cut_after``), possibly in the middle of a frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Callable
from typing import Any

from nsq_ha.protocol.broker import encode_message
from nsq_ha.protocol.compression import StreamCodec
from nsq_ha.protocol.frames import FrameType, encode_frame
from nsq_ha.protocol.message import DecodedMessage, MessageFormat

from ..model import DevNode, EventKind
from ..store import StoredMessage

__all__ = ["FrameWriter", "message_frame"]

#: frame size, frame type, timestamp, attempts, the id's two halves (internal id, trace id)
_FRAME_HEAD = struct.Struct(">IiqHQQ")
#: the same, then the offset/raw-size part
_FRAME_HEAD_DETAIL = struct.Struct(">IiqHQQQI")
_MESSAGE = int(FrameType.MESSAGE)


def message_frame(message: StoredMessage, attempts: int, fmt: MessageFormat) -> bytes:
    """The message frame (frame header included) of one delivery of ``message`` in ``fmt``:
    the bytes of ``encode_frame(MESSAGE, encode_message(...))``, packed at once when the frame
    has no ext part (one delivery per message and per client: the broker's hot path)."""
    body = message.body
    if fmt.fork_ids and not fmt.ext:
        if fmt.detail:
            head = _FRAME_HEAD_DETAIL.pack(
                _FRAME_HEAD_DETAIL.size - 4 + len(body),
                _MESSAGE,
                message.timestamp,
                attempts,
                message.internal_id,
                message.trace_id,
                message.offset,
                message.raw_size,
            )
        else:
            head = _FRAME_HEAD.pack(
                _FRAME_HEAD.size - 4 + len(body),
                _MESSAGE,
                message.timestamp,
                attempts,
                message.internal_id,
                message.trace_id,
            )
        return head + body
    data = encode_message(
        DecodedMessage(
            timestamp=message.timestamp,
            attempts=attempts,
            id=message.id,
            body=body,
            ext_version=message.ext_version,
            ext_data=message.ext_data,
            offset=message.offset,
            raw_size=message.raw_size,
        ),
        fmt,
    )
    return encode_frame(FrameType.MESSAGE, data)


class FrameWriter:
    """The output of one connection to ``node`` (peer ``peer``).

    ``record`` logs the faults it applies; ``on_cut`` is called once a cut closed the
    connection's transport.
    """

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        node: DevNode,
        peer: str,
        *,
        record: Callable[..., Any],
        on_cut: Callable[[], None],
    ) -> None:
        self.writer = writer
        self.node = node
        self.peer = peer
        self.codec: StreamCodec | None = None
        self.closed = False
        self._record = record
        self._on_cut = on_cut
        self._cut_budget: int | None = None
        self._cut_epoch = -1
        #: frames (final bytes) written this loop turn, sent together at its end
        self._pending: list[bytes] = []
        self._push_handle: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.arm_cut()

    def __repr__(self) -> str:
        return f"<FrameWriter node{self.node.index} {self.peer} closed={self.closed}>"

    def arm_cut(self) -> None:
        """Take the node's current ``cut_after`` setting."""
        faults = self.node.faults
        if faults.cut_epoch != self._cut_epoch:
            self._cut_epoch = faults.cut_epoch
            self._cut_budget = faults.cut_after

    def write(self, frame: bytes) -> None:
        """Write one encoded frame (or the part of it the cut budget leaves) at the end of this
        loop turn, with the turn's other frames."""
        if self.closed:
            return
        data = self.codec.compress(frame) if self.codec is not None else frame
        if self._cut_budget is not None:
            if len(data) >= self._cut_budget:
                self._pending.append(data[: self._cut_budget])
                self._push()
                self._record(
                    EventKind.CONNECTION_CUT,
                    node=self.node.index,
                    peer=self.peer,
                    bytes=self._cut_budget,
                )
                self._cut_budget = 0
                self._on_cut()
                return
            self._cut_budget -= len(data)
        self._pending.append(data)
        if self._push_handle is None:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            self._push_handle = loop.call_soon(self._push)

    def _push(self) -> None:
        """Hand the frames written so far to the transport, as one write."""
        if self._push_handle is not None:
            self._push_handle.cancel()
            self._push_handle = None
        if not self._pending:
            return
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending.clear()
        if not self.writer.transport.is_closing():
            self.writer.write(data)

    async def respond(self, command: bytes, data: bytes, frame_type: FrameType) -> None:
        """Write a response or error frame, through the delay/drop faults."""
        faults = self.node.faults
        name = command.decode("latin-1")
        if faults.applies_to(name):
            if faults.drop:
                if faults.drop > 0:
                    faults.drop -= 1
                self._record(
                    EventKind.RESPONSE_DROPPED, node=self.node.index, command=name, frame=data[:40]
                )
                return
            if faults.delay > 0:
                await asyncio.sleep(faults.delay)
        self.write(encode_frame(frame_type, data))

    async def flush(self) -> None:
        """Wait until what was written is handed to the socket (errors ignored)."""
        self._push()
        with contextlib.suppress(Exception):
            await self.writer.drain()

    async def start_tls(self, context: ssl.SSLContext) -> None:
        """Upgrade the connection to TLS (after the IDENTIFY answer went out)."""
        self._push()
        await self.writer.drain()
        await self.writer.start_tls(context)

    def close(self, *, abort: bool) -> None:
        """Close the transport (``abort``: reset it, nothing flushed)."""
        if abort:
            self._pending.clear()
        self._push()
        self.closed = True
        transport = self.writer.transport
        if abort:
            transport.abort()
        else:
            transport.close()
