"""Publish calls at work outside a lane (a lookup, a DPUB), which :meth:`Producer.close`
waits for: :class:`Activity`."""

from __future__ import annotations

import asyncio


class Activity:
    """Publish calls waiting outside a lane (a lookup, a DPUB) between entry and exit
    (``with activity:``); :meth:`wait_idle` waits until there are none."""

    __slots__ = ("active", "waiters")

    def __init__(self) -> None:
        self.active = 0
        self.waiters: list[asyncio.Future[None]] = []

    def __enter__(self) -> None:
        self.active += 1

    def __exit__(self, *exc_info: object) -> None:
        self.active -= 1
        if not self.active and self.waiters:
            for waiter in self.waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self.waiters.clear()

    async def wait_idle(self) -> None:
        """Return once no publish call is active."""
        if self.active:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            await waiter
