"""Consumer lag per partition for ``nsq.consumer.lag``: polled off the client's hot path.

nsqd does not send a channel's lag over the TCP protocol; its HTTP ``/stats`` has it. A
:class:`LagPoller` runs one daemon thread while instrumented consumers exist (started by the
first consumer's ``start()``, ended by :func:`~nsq_ha.otel.uninstrument` or by the close of the
last one, each of which waits for the thread to end, :data:`STOP_TIMEOUT` seconds at most; a
request under way is abandoned at once). The thread runs its requests on an event loop of its
own. Every ``lag_interval`` seconds it asks, per (topic, channel) of the live consumers:

* where the partitions are: nsqlookupd's ``/lookup?topic=T&access=r`` through the consumer's
  ``lookupd=`` addresses (their credentials as basic auth, ``https://`` verified as the
  consumer's :class:`~nsq_ha.lookup.LookupClient` verifies it), or, for a ``lookup=`` consumer,
  the map its shared :class:`~nsq_ha.lookup.LookupClient` has cached (no request);
* each partition leader's ``/stats?format=json&topic=T&channel=C`` without clients (plain HTTP
  at the node's ``http_port``, as ``nsq-ha stats`` reads it; nsqd's ``/stats`` needs no
  credentials), lag as :func:`nsq_ha.admin.entry_lag` computes it. On vanilla nsqd the lag of
  the channel is summed over the nsqds producing the topic and has no partition.

Every request has an overall deadline (:data:`HTTP_TIMEOUT`, from connecting to the last byte)
and a size cap (:mod:`nsq_ha.otel.lag_http`), and the observable gauges' callbacks only read the
cache (:class:`LagCache`), so a metric collection never waits for a server and nothing runs on a
consumer's event loop. A value not refreshed for :data:`STALE_INTERVALS` intervals is dropped; a
(topic, channel) no live consumer has any more is forgotten. A failing poll is logged once
(WARNING) per failure streak, then at DEBUG.

Consumers given ``nsqd=`` addresses have no lag: their nsqds' HTTP addresses are not known.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nsq_ha.admin import ChannelLag
from nsq_ha.lookup.http import tls_context
from nsq_ha.otel.lag_http import Source, lags_from_stats, read_lags
from nsq_ha.redact import redact_text

if TYPE_CHECKING:
    import httpx

    from nsq_ha.consumer import Consumer

__all__ = [
    "HTTP_TIMEOUT",
    "STALE_INTERVALS",
    "STOP_TIMEOUT",
    "LagCache",
    "LagPoller",
    "check_interval",
    "lags_from_stats",
    "live_consumers",
]

log = logging.getLogger(__name__)

#: seconds one HTTP request of a poll may take, whole (connect, send, the answer's last byte)
HTTP_TIMEOUT = 5.0
#: seconds :meth:`LagPoller.stop` (``uninstrument()``) and the last consumer's close wait for
#: the thread to end; it ends in milliseconds, as what it awaits is cancelled
STOP_TIMEOUT = 5.0
#: a value is dropped once this many intervals passed without a fresh one
STALE_INTERVALS = 3

#: (topic, channel, partition or None on vanilla)
LagKey = tuple[str, str, int | None]


def check_interval(value: object) -> float | None:
    """``lag_interval`` as a float (None: no polling); TypeError or ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"lag_interval must be a number of seconds or None, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"lag_interval must be a positive finite number of seconds, got {value}")
    return float(value)


@dataclass(frozen=True, slots=True)
class _Entry:
    at: float
    lag: ChannelLag


class LagCache:
    """The latest lag per (topic, channel, partition), each with when it was read.

    Written by the poller's thread, read by the metric reader's, pruned by a consumer's close:
    every access holds one lock, for a moment."""

    def __init__(self, max_age: float) -> None:
        """Values older than ``max_age`` seconds are neither reported nor kept."""
        self.max_age = max_age
        self._lock = threading.Lock()
        self._entries: dict[LagKey, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self, topic: str, channel: str, lags: Mapping[int | None, ChannelLag], now: float
    ) -> None:
        """Store the lags just read of ``topic``/``channel``'s partitions."""
        with self._lock:
            for partition, lag in lags.items():
                self._entries[(topic, channel, partition)] = _Entry(now, lag)

    def fresh(self, now: float) -> list[tuple[LagKey, ChannelLag]]:
        """Every value not older than ``max_age`` at ``now`` (the stale ones are dropped)."""
        with self._lock:
            self._drop_stale(now)
            return [(key, entry.lag) for key, entry in self._entries.items()]

    def retain(self, groups: Iterable[tuple[str, str]], now: float) -> None:
        """Keep only the values of ``groups`` ((topic, channel) pairs) that are not stale."""
        keep = set(groups)
        with self._lock:
            for key in [k for k in self._entries if (k[0], k[1]) not in keep]:
                del self._entries[key]
            self._drop_stale(now)

    def _drop_stale(self, now: float) -> None:
        for key in [k for k, e in self._entries.items() if now - e.at > self.max_age]:
            del self._entries[key]


def live_consumers(consumers: weakref.WeakSet[Consumer]) -> list[Consumer]:
    """The members of ``consumers`` (a copy, taken while other threads may add to it)."""
    for _ in range(5):  # the set may change while it is copied (another thread adds to it)
        try:
            return list(consumers)
        except RuntimeError:
            continue
    return []


def _source(consumer: Consumer) -> Source | None:
    config = consumer.config
    if config.lookup is not None:
        return config.lookup
    if config.lookupd is not None:
        return tuple(config.lookupd)
    return None  # nsqd= addresses: no HTTP address known


class LagPoller:
    """The daemon thread that fills a :class:`LagCache` every ``interval`` seconds while
    ``consumers`` has live members; its requests run on an event loop of its own."""

    def __init__(
        self, consumers: weakref.WeakSet[Consumer], cache: LagCache, interval: float
    ) -> None:
        """Poll for ``consumers`` (read, never changed) into ``cache``."""
        self.consumers = consumers
        self.cache = cache
        self.interval = interval
        self._lock = threading.Lock()
        #: the thread that polls; None once it decided to end (it may still be ending)
        self._thread: threading.Thread | None = None
        #: every thread started that may be alive (the ended ones are pruned at start)
        self._threads: list[threading.Thread] = []
        #: what waits for each thread to end, until its last moment
        self._waiters: dict[threading.Thread, list[Callable[[], None]]] = {}
        #: the poller thread's loop and the poll (and wait) it runs now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._step: asyncio.Task[None] | None = None
        self._stopped = False
        #: (topic, channel) whose last poll failed: logged once per streak
        self._failing: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running" if self._thread else "idle"
        return f"<LagPoller every {self.interval:g}s {state} values={len(self.cache)}>"

    @property
    def running(self) -> bool:
        """True while a poller thread is alive (also one that is ending)."""
        with self._lock:
            return any(thread.is_alive() for thread in self._threads)

    def start(self) -> None:
        """Start the thread unless it runs (called after a consumer was added)."""
        with self._lock:
            if self._stopped or self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="nsq_ha-otel-lag", daemon=True)
            self._thread = thread
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            self._waiters[thread] = []
            thread.start()

    def forget(self, now: float | None = None) -> bool:
        """Drop what no live consumer needs (called after a consumer closed); with none left,
        end the thread at once (a request under way is abandoned) and return True."""
        groups = {(c.topic, c.channel) for c in live_consumers(self.consumers)}
        self.cache.retain(groups, time.monotonic() if now is None else now)
        if not groups:
            self._interrupt()
        return not groups

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """End the thread for good: a request under way is abandoned. Waits ``timeout``
        seconds at most for the thread to end; True once it has."""
        with self._lock:
            self._stopped = True
        self._interrupt()
        return self.join(timeout)

    def join(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Wait ``timeout`` seconds at most until no poller thread is alive; True if none is
        (the calling thread aside)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = [t for t in self._threads if t is not threading.current_thread()]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    async def wait_ended(self, within: float = STOP_TIMEOUT) -> bool:
        """:meth:`join` for a coroutine: waits without blocking the running event loop."""
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        with self._lock:
            threads = [t for t in self._threads if t in self._waiters]  # not at their end yet
            left = [len(threads)]

            def one_ended() -> None:  # on ``loop``
                left[0] -= 1
                if left[0] == 0 and not ended.done():
                    ended.set_result(None)

            def wake() -> None:  # on the thread that ends
                loop.call_soon_threadsafe(one_ended)

            for thread in threads:
                self._waiters[thread].append(wake)
        if threads:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await ended
        return self.join(0.1 if ended.done() else 0.0)  # each thread is at its very end

    def _interrupt(self) -> None:
        """Have the poller thread look at its consumers again now: a poll under way, or the
        wait for the next one, is cancelled."""
        with self._lock:
            loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._cancel_step)

    def _cancel_step(self) -> None:  # on the poller's loop
        step = self._step
        if step is not None:
            step.cancel()

    def _run(self) -> None:
        me = threading.current_thread()
        try:
            asyncio.run(self._main())
        except Exception:  # not expected: the thread ends, a later start() makes another
            log.exception("the consumer lag poller failed")
        finally:
            with self._lock:
                if self._thread is me:
                    self._thread = None
                waiters = self._waiters.pop(me, [])
            for wake in waiters:
                with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                    wake()

    async def _main(self) -> None:
        import httpx

        loop = asyncio.get_running_loop()
        me = threading.current_thread()
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT, verify=tls_context()) as http:
            while True:
                with self._lock:  # _interrupt() sees this loop and this step, or the change
                    consumers = live_consumers(self.consumers)
                    if self._stopped or not consumers or self._thread is not me:
                        if self._thread is me:  # a later start() makes a new thread
                            self._thread = None
                            self._loop = self._step = None
                        return
                    sources: dict[tuple[str, str], Source] = {}
                    for consumer in consumers:
                        source = _source(consumer)
                        if source is not None:
                            sources.setdefault((consumer.topic, consumer.channel), source)
                    del consumers  # no strong reference kept while polling and waiting
                    step = loop.create_task(self._poll_then_wait(http, sources))
                    self._loop, self._step = loop, step
                del sources
                await asyncio.wait([step])
                if not step.cancelled() and step.exception() is not None:
                    log.warning("consumer lag poll failed", exc_info=step.exception())

    async def _poll_then_wait(
        self, http: httpx.AsyncClient, sources: Mapping[tuple[str, str], Source]
    ) -> None:
        await self.poll(http, sources)
        await asyncio.sleep(self.interval)

    async def poll(
        self, http: httpx.AsyncClient, sources: Mapping[tuple[str, str], Source]
    ) -> None:
        """Read the lag of every (topic, channel) of ``sources`` once, into the cache; each
        request within :data:`HTTP_TIMEOUT` seconds."""
        for (topic, channel), source in sources.items():
            try:
                lags = await read_lags(http, source, topic, channel, request_timeout=HTTP_TIMEOUT)
            except Exception as exc:  # unreachable, refused, malformed: the thread goes on
                self._failed(topic, channel, exc)
                continue
            if (topic, channel) in self._failing:
                self._failing.discard((topic, channel))
                log.info("consumer lag of %s/%s: read again", topic, channel)
            if not self._stopped:
                self.cache.put(topic, channel, lags, time.monotonic())
        self.cache.retain(sources, time.monotonic())
        self._failing &= set(sources)

    def _failed(self, topic: str, channel: str, exc: Exception) -> None:
        reason = redact_text(f"{type(exc).__name__}: {exc}")
        if (topic, channel) in self._failing:
            log.debug("consumer lag of %s/%s: still failing: %s", topic, channel, reason)
            return
        self._failing.add((topic, channel))
        log.warning(
            "consumer lag of %s/%s: cannot read it (%s); the last value is reported for %g s "
            "more at most",
            topic,
            channel,
            reason,
            self.interval * STALE_INTERVALS,
        )
