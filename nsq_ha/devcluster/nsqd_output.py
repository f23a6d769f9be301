"""One emulated nsqd connection's output side: compression and the node's write faults.

:class:`FrameWriter` writes frames as the connection hands them over (the emulator does no
output buffering), compressed once the connection negotiated snappy or deflate, and applies the
node's :class:`~nsq_ha.devcluster.model.NodeFaults`: responses and errors held (``delay``) or
swallowed (``drop``), and the connection cut after a byte budget (``cut_after``), possibly in
the middle of a frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from typing import Any

from nsq_ha.protocol.compression import StreamCodec
from nsq_ha.protocol.frames import FrameType, encode_frame

from .model import DevNode, EventKind

__all__ = ["FrameWriter"]


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
        """Write one encoded frame now (or the part of it the cut budget leaves)."""
        if self.closed:
            return
        data = self.codec.compress(frame) if self.codec is not None else frame
        if self._cut_budget is not None:
            if len(data) >= self._cut_budget:
                self.writer.write(data[: self._cut_budget])
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
        with contextlib.suppress(Exception):
            await self.writer.drain()

    async def start_tls(self, context: ssl.SSLContext) -> None:
        """Upgrade the connection to TLS (after the IDENTIFY answer went out)."""
        await self.writer.drain()
        await self.writer.start_tls(context)

    def close(self, *, abort: bool) -> None:
        """Close the transport (``abort``: reset it, nothing flushed)."""
        self.closed = True
        transport = self.writer.transport
        if abort:
            transport.abort()
        else:
            transport.close()
