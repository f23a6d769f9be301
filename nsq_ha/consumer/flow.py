"""Flow control of one consumer: the :class:`~nsq_ha.consumer.rdy.RdyPlanner`'s decisions, sent.

:class:`Flow` holds the planner and the connection of each subscription (by key), sends every
RDY the planner decides, arms the backoff timer when the planner blocks, and runs the periodic
redistribution. It knows connections only as RDY sinks; it calls nothing else. Messages in and
out of flight go to the planner straight from the slots (:attr:`Flow.planner`), which call
:meth:`Flow.apply` only when the planner changed something.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable
from typing import Protocol

from nsq_ha.consumer.backoff import BackoffStrategy, Exponential
from nsq_ha.consumer.rdy import DEFAULT_MAX_RDY, RdyPlanner
from nsq_ha.errors import NsqError

__all__ = ["Flow", "RdySink"]

log = logging.getLogger(__name__)


class RdySink(Protocol):
    """What :class:`Flow` needs of a connection."""

    @property
    def closed(self) -> bool:
        """True once the connection is closed or closing."""
        ...

    def rdy(self, count: int) -> None:
        """Send ``RDY count``."""
        ...


class Flow:
    """Send the planner's RDY changes to the subscribed connections; back off when it says so."""

    __slots__ = (
        "_backoff",
        "_backoff_handle",
        "_name",
        "_planner",
        "_redistribute_interval",
        "_redistributor",
        "_sinks",
        "_stopped",
    )

    def __init__(
        self,
        name: str,
        *,
        max_in_flight: int,
        backoff: BackoffStrategy | None,
        idle_timeout: float,
        hold_timeout: float,
        redistribute_interval: float,
    ) -> None:
        """Flow control named ``name`` (topic/channel, for the logs)."""
        self._name = name
        self._planner = RdyPlanner(
            max_in_flight,
            idle_timeout=idle_timeout,
            hold_timeout=hold_timeout,
            clock=time.monotonic,
        )
        self._backoff = backoff or Exponential()
        self._redistribute_interval = redistribute_interval
        self._sinks: dict[Hashable, RdySink] = {}
        self._backoff_handle: asyncio.TimerHandle | None = None
        self._redistributor: asyncio.Task[None] | None = None
        self._stopped = False

    def __repr__(self) -> str:
        """Show the planner's state."""
        return f"<Flow {self._name} {self._planner!r}>"

    # -- views --------------------------------------------------------------------------------

    @property
    def planner(self) -> RdyPlanner:
        """The planner the slots tell of every message in and out of flight."""
        return self._planner

    @property
    def max_in_flight(self) -> int:
        """The RDY budget across all connections."""
        return self._planner.max_in_flight

    @property
    def level(self) -> int:
        """The backoff level (0: not backing off)."""
        return self._planner.level

    @property
    def rdy(self) -> int:
        """The RDY counts last sent, summed over the connections."""
        return self._planner.total_rdy

    def is_starved(self) -> bool:
        """True when a connection holds nearly all its RDY in flight."""
        return self._planner.is_starved()

    # -- changes ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the periodic redistribution (call on the running loop)."""
        if self._redistributor is None and not self._stopped:
            self._redistributor = asyncio.get_running_loop().create_task(
                self._redistribute_loop(), name=f"nsq_ha-rdy-{self._name}"
            )

    def add(self, key: Hashable, sink: RdySink, *, max_rdy: int | None, ordered: bool) -> None:
        """A new subscription (ordered ones get RDY 1 at most)."""
        self._sinks[key] = sink
        self.apply(
            self._planner.add(key, max_rdy=max_rdy or DEFAULT_MAX_RDY, cap=1 if ordered else None)
        )

    def remove(self, key: Hashable) -> None:
        """A subscription ended (or retires): its budget goes to the others."""
        self._sinks.pop(key, None)
        self.apply(self._planner.remove(key))

    def set_max_in_flight(self, value: int) -> None:
        """Change the budget (0 pauses every connection)."""
        self.apply(self._planner.set_max_in_flight(value))

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
        self.apply(self._planner.stop())

    # -- sending ------------------------------------------------------------------------------

    def apply(self, changes: dict[Hashable, int]) -> None:
        """Send the RDY changes; start a backoff wait when the planner blocked.

        A slot calls it after telling the :attr:`planner` of a message in or out of flight,
        when the planner changed something or blocked: the steady state sends nothing, and a
        delivery does not enter this module."""
        for key, value in changes.items():
            sink = self._sinks.get(key)
            if sink is None or sink.closed:
                continue
            try:
                sink.rdy(value)
            except NsqError as exc:  # closing or closed: its watcher reports it
                log.debug("RDY %d to %s not sent: %s", value, key, exc)
        if self._planner.blocked and self._backoff_handle is None and not self._stopped:
            delay = self._backoff.delay(self._planner.level)
            log.warning(
                "%s: backing off (level %d): every connection paused for %.2f s",
                self._name,
                self._planner.level,
                delay,
            )
            self._backoff_handle = asyncio.get_running_loop().call_later(
                delay, self._backoff_elapsed
            )

    def _backoff_elapsed(self) -> None:
        self._backoff_handle = None
        if not self._stopped:
            self.apply(self._planner.backoff_elapsed())

    async def _redistribute_loop(self) -> None:
        while True:
            await asyncio.sleep(self._redistribute_interval)
            self.apply(self._planner.redistribute())
