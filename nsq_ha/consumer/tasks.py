"""The background tasks of one consumer (watchers, retirements, refreshes, give-ups)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger(__name__)


class Background:
    """Tasks started in the background, kept referenced until they end."""

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finish(self, timeout: float) -> None:  # noqa: ASYNC109 - the wait limit
        """Wait ``timeout`` s for the tasks to end; cancel what still runs then."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(list(self._tasks), timeout=timeout)
        for task in pending:
            log.warning("closing: cancelling %s, still running after %.1f s", task, timeout)
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
