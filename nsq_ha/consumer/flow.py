"""Flow control of one consumer: the :class:`~nsq_ha.consumer.rdy.RdyPlanner`'s decisions, sent.

Slots tell :attr:`Flow.planner` of each message in and out of flight and call :meth:`Flow.apply`
only when the planner changed something, so a steady delivery does not enter this module.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable

from nsq_ha.connection import NsqdConnection
from nsq_ha.consumer.backoff import Exponential
from nsq_ha.consumer.config import ConsumerConfig
from nsq_ha.consumer.rdy import DEFAULT_MAX_RDY, RdyPlanner
from nsq_ha.errors import NsqError

__all__ = ["Flow"]

log = logging.getLogger(__name__)


class Flow:
    """Send the planner's RDY changes to the subscribed connections; back off when it says so."""

    __slots__ = (
        "_backoff",
        "_backoff_handle",
        "_name",
        "_redistribute_interval",
        "_redistributor",
        "_sinks",
        "_stopped",
        "planner",
    )

    def __init__(self, config: ConsumerConfig) -> None:
        self._name = f"{config.topic}/{config.channel}"
        #: told by the slots of every message in and out of flight
        self.planner = RdyPlanner(
            config.max_in_flight,
            idle_timeout=config.low_rdy_idle_timeout,
            hold_timeout=config.low_rdy_timeout,
            clock=time.monotonic,
        )
        self._backoff = config.backoff or Exponential()
        self._redistribute_interval = config.rdy_redistribute_interval
        self._sinks: dict[Hashable, NsqdConnection] = {}
        self._backoff_handle: asyncio.TimerHandle | None = None
        self._redistributor: asyncio.Task[None] | None = None
        self._stopped = False

    def __repr__(self) -> str:
        return f"<Flow {self._name} {self.planner!r}>"

    def start(self) -> None:
        """Start the periodic redistribution (once, before :meth:`stop`; on the running loop)."""
        self._redistributor = asyncio.get_running_loop().create_task(
            self._redistribute_loop(), name=f"nsq_ha-rdy-{self._name}"
        )

    def add(
        self, key: Hashable, sink: NsqdConnection, *, max_rdy: int | None, ordered: bool
    ) -> None:
        """A new subscription (ordered ones get RDY 1 at most)."""
        self._sinks[key] = sink
        self.apply(
            self.planner.add(key, max_rdy=max_rdy or DEFAULT_MAX_RDY, cap=1 if ordered else None)
        )

    def remove(self, key: Hashable) -> None:
        """A subscription ended (or retires): its budget goes to the others."""
        self._sinks.pop(key, None)
        self.apply(self.planner.remove(key))

    async def stop(self) -> None:
        """RDY 0 everywhere, for good: no backoff timer, no redistribution."""
        self._stopped = True
        if self._backoff_handle is not None:
            self._backoff_handle.cancel()
            self._backoff_handle = None
        task, self._redistributor = self._redistributor, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.apply(self.planner.stop())

    def apply(self, changes: dict[Hashable, int]) -> None:
        """Send the RDY changes; start a backoff wait when the planner blocked."""
        for key, value in changes.items():
            sink = self._sinks.get(key)
            if sink is None or sink.closed:
                continue
            try:
                sink.rdy(value)
            except NsqError as exc:  # closing or closed: its watcher reports it
                log.debug("RDY %d to %s not sent: %s", value, key, exc)
        if self.planner.blocked and self._backoff_handle is None and not self._stopped:
            delay = self._backoff.delay(self.planner.level)
            log.warning(
                "%s: backing off (level %d): every connection paused for %.2f s",
                self._name,
                self.planner.level,
                delay,
            )
            self._backoff_handle = asyncio.get_running_loop().call_later(
                delay, self._backoff_elapsed
            )

    def _backoff_elapsed(self) -> None:
        self._backoff_handle = None
        if not self._stopped:
            self.apply(self.planner.backoff_elapsed())

    async def _redistribute_loop(self) -> None:
        while True:
            await asyncio.sleep(self._redistribute_interval)
            self.apply(self.planner.redistribute())
