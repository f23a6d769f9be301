"""Where one connection's delivered messages go, and who waits for them to be answered.

:class:`Deliveries` hands each message to the ``on_message`` callback, or queues it for
:meth:`Deliveries.messages` when there is none; it wakes :meth:`Deliveries.changed` waiters
when a message is answered (FIN/REQ) and ends the iterators when the connection closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from nsq_ha.errors import LocalProtocolError
from nsq_ha.protocol.message import DecodedMessage

__all__ = ["Deliveries"]


class Deliveries:
    """The message sink of one connection."""

    __slots__ = ("_changed", "_on_message", "_queue", "deliver")

    def __init__(self, on_message: Callable[[DecodedMessage], object] | None) -> None:
        """Deliver to ``on_message``, or to :meth:`messages` when it is ``None``."""
        self._on_message = on_message
        self._queue: asyncio.Queue[DecodedMessage | None] = asyncio.Queue()
        self._changed = asyncio.Event()
        #: Called with each delivered message (``on_message`` itself, or the queue's put).
        self.deliver: Callable[[DecodedMessage], object] = (
            self._queue.put_nowait if on_message is None else on_message
        )

    def __repr__(self) -> str:
        """Show where messages go."""
        target = "queue" if self._on_message is None else "on_message"
        return f"<Deliveries to={target} queued={self._queue.qsize()}>"

    async def messages(self) -> AsyncIterator[DecodedMessage]:
        """Yield delivered messages until the connection closes."""
        if self._on_message is not None:
            raise LocalProtocolError("messages go to on_message on this connection")
        while True:
            message = await self._queue.get()
            if message is None:
                self._queue.put_nowait(None)  # wake other iterators too
                return
            yield message

    def answered(self) -> None:
        """A message was answered: wake :meth:`changed` waiters."""
        self._changed.set()

    async def changed(self) -> None:
        """Wait for the next :meth:`answered` or :meth:`close`."""
        self._changed.clear()
        await self._changed.wait()

    def close(self) -> None:
        """The connection closed: end the iterators, wake the waiters."""
        self._queue.put_nowait(None)
        self._changed.set()
