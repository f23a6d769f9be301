"""Keyed publishes reach their lanes in call order, even while some wait for routes.

A keyed call (``sharding_key``, ``sharding_keys`` or ``partition``) normally finds its topic's
routes cached and queues its messages on the partition's lane at once, in the same loop step:
call order is lane order, and the lane keeps it. A call that has to wait for a lookup breaks
that unless later calls wait too: the lookup caches the routes before its caller resumes, and a
call made in between would find them and queue first. :class:`ArrivalOrder` gives such calls
turns, per topic, in the order they were made; a call that finds no turn taken queues at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["ArrivalOrder"]


class ArrivalOrder:
    """Per topic, the last keyed call that is waiting for its turn or for routes."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, asyncio.Future[None]] = {}

    def waiting(self, topic: str) -> bool:
        """True while an earlier keyed call on ``topic`` has not queued its messages yet."""
        return topic in self._last

    @asynccontextmanager
    async def turn(self, topic: str) -> AsyncIterator[None]:
        """Wait until every keyed call on ``topic`` made before this one has queued (or
        failed, or was cancelled); the caller queues its messages before leaving the block."""
        previous = self._last.get(topic)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last[topic] = mine
        try:
            if previous is not None:
                await asyncio.wait((previous,))  # a cancelled wait leaves ``previous`` alone
            yield
        finally:
            mine.set_result(None)
            if self._last.get(topic) is mine:
                del self._last[topic]
