"""LookupClient: the partition maps of topics, per access, through nsqlookupd (fork or vanilla).

The lookupds themselves (discovery, health, failover, the size cap, the credentials) are
:class:`~nsq_ha.lookup.pool.LookupdPool`'s. Here the answers of every lookupd are merged (the
leader's first), cached, fetched once however many callers ask at once, and, for watched
topics, refreshed on a timer with jitter, a failed refresh being retried before the next round.
A lookup no lookupd answered with a map raises an error that says what to do next.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Self

from nsq_ha.durations import seconds
from nsq_ha.errors import (
    ConfigError,
    DiscoveryError,
    LookupdUnavailableError,
    NsqError,
    RemoteProtocolError,
    TopicNotFoundError,
    TopicNotWritableError,
)
from nsq_ha.lookup.pool import LookupdPool
from nsq_ha.lookup.wire import Access, LookupdError, PartitionMap, merge_maps, parse_lookup
from nsq_ha.redact import redact_text
from nsq_ha.retry import LOOKUPD, Failure, retry_after

if TYPE_CHECKING:  # httpx is imported where a request is made: nsqd= clients never load it
    import httpx

__all__ = ["DEFAULT_MAX_ANSWER_BYTES", "LookupClient", "missing_on_fork"]

log = logging.getLogger(__name__)

Listener = Callable[[PartitionMap], Awaitable[None] | None]
Key = tuple[str, Access]

#: Default cap on one lookupd answer: a 255-partition fork answer is about 100 KB, and parsing
#: 512 KiB of the costliest JSON allowed takes ~15 ms of one idle core (the event loop stall).
DEFAULT_MAX_ANSWER_BYTES = 512 << 10
_MAX_ANSWER_BYTES_LIMIT = 64 << 20


def missing_on_fork(topic: str, detail: str = "") -> TopicNotFoundError:
    """A fork topic nsqlookupd does not know (``detail``: lookupd's own words)."""
    said = f" ({detail})" if detail else ""
    return TopicNotFoundError(
        f"topic {topic!r} does not exist in the cluster{said}: on the fork, topics are created "
        f"by an operator, with nsq-ha topic create --lookupd URL --topic {topic} --partitions N "
        f"--replicas R or nsq_ha.admin.LookupdAdmin.create_topic({topic!r}, partitions=N, "
        "replicas=R)"
    )


def lookup_failure(topic: str, access: Access, errors: Sequence[object]) -> NsqError:
    """The error of a lookup no lookupd answered with a map, from what each one raised."""
    for err in errors:
        # matched on the message: the wrapped envelope reports these as HTTP 500
        msg = err.message if isinstance(err, LookupdError) else ""
        if "no channel" in msg:
            return TopicNotWritableError(
                f"topic {topic!r} has no channel yet, so nsqlookupd hides it from writers: "
                "subscribe a consumer (or nsqd POST /channel/create) first, or run nsqlookupd "
                "with --allow-write-with-nochannels=true"
            )
        if msg == "TOPIC_NOT_FOUND":
            return TopicNotFoundError(
                f"topic {topic!r} is not known to nsqlookupd (vanilla): it is created by the "
                "first publish to an nsqd (use nsqd= addresses, or nsq-ha pub --nsqd HOST:4150)"
            )
        if msg == "Key not found":
            return missing_on_fork(topic, msg)
    for kind in (LookupdError, RemoteProtocolError):
        for err in errors:
            if isinstance(err, kind):
                return err
    detail = "; ".join(str(e) for e in errors) or "no nsqlookupd to ask"
    return LookupdUnavailableError(f"lookup of {topic!r} (access={access}) failed: {detail}")


def unwritable(pmap: PartitionMap) -> NsqError:
    """The error of an ``access=w`` map without a route."""
    if pmap.fork and (pmap.meta is None or pmap.partition_num == 0):
        return missing_on_fork(pmap.topic)
    if pmap.fork:
        return TopicNotWritableError(
            f"topic {pmap.topic!r} has {pmap.partition_num} partitions but none is writable now "
            "(new topic not yet checked by nsqlookupd, writes disabled, or leaders failing "
            "over): retry later"
        )
    return TopicNotFoundError(
        f"no nsqd has topic {pmap.topic!r} (vanilla): publish through nsqd= addresses to create it"
    )


class LookupClient:
    """Discovery through nsqlookupd, shared by producers and consumers of one process."""

    def __init__(
        self,
        seeds: Sequence[str] | str,
        *,
        http: httpx.AsyncClient | None = None,
        timeout: float = 5.0,
        refresh_interval: float = 30.0,
        jitter: float = 0.2,
        max_backoff: float = LOOKUPD.cap,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        """Validate every option (:class:`ConfigError`) before anything is created.

        ``timeout``: the deadline of one lookup (discovery and every request included), in
        seconds. ``refresh_interval``: how often watched topics are refreshed. ``jitter``:
        the random fraction (0 <= j < 1) spread over the refresh timer (0: no jitter in the
        backoffs either). ``max_backoff``: the longest a failing lookupd is skipped (30 s).
        ``max_answer_bytes``: the largest answer read (512 KiB by default, at most 64 MiB).
        """
        try:
            seed_list = [seeds] if isinstance(seeds, str) else list(seeds)
        except TypeError:
            raise ConfigError(f"seeds must be addresses, got {type(seeds).__name__}") from None
        if not seed_list:
            raise ConfigError("LookupClient needs at least one nsqlookupd address")
        self.timeout = seconds(timeout, "timeout")
        self.refresh_interval = seconds(refresh_interval, "refresh_interval")
        self.max_backoff = seconds(max_backoff, "max_backoff")
        # `not 0 <= jitter < 1` also refuses NaN
        if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter < 1:
            raise ConfigError(f"jitter must be a number in [0, 1), got {jitter!r}")
        self.jitter = float(jitter)
        limit = _MAX_ANSWER_BYTES_LIMIT
        size = max_answer_bytes
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= limit:
            raise ConfigError(f"max_answer_bytes must be an int in 1..{limit}, got {size!r}")
        self.max_answer_bytes = max_answer_bytes
        self._pool = LookupdPool(
            seed_list,
            http=http,
            timeout=self.timeout,
            max_bytes=max_answer_bytes,
            backoff=LOOKUPD.capped(self.max_backoff, jitter=bool(jitter)),
        )
        self._retry_backoff = LOOKUPD.capped(self.refresh_interval, jitter=bool(jitter))
        self._maps: dict[Key, PartitionMap] = {}
        self._inflight: dict[Key, asyncio.Task[PartitionMap]] = {}
        #: keys unwatched while their fetch was under way: that answer is not cached
        self._uncached: set[Key] = set()
        #: watched keys whose periodic refresh failed, each retried by its own task
        self._retrying: dict[Key, asyncio.Task[None]] = {}
        self._watch: dict[Key, list[Listener]] = {}
        self._timer: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        now = time.monotonic()
        usable = sum(now >= s.retry_at for s in self._pool.states.values())
        return (
            f"<LookupClient lookupds={len(self._pool.states)} usable={usable} "
            f"topics={len(self._maps)} watched={len(self._watch)}>"
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def lookupds(self) -> list[str]:
        """Known lookupd base URLs (seeds and discovered), leader first when known, passwords
        redacted (``http://user:***@host:4161``)."""
        return [s.endpoint.shown for s in self._pool.states.values()]

    @property
    def cached_keys(self) -> frozenset[Key]:
        """The (topic, access) keys whose partition map is cached."""
        return frozenset(self._maps)

    def lookupd_status(self) -> list[tuple[str, int, float]]:
        """``(url as in :attr:`lookupds`, failures in a row, seconds until it is asked again)``
        per known lookupd."""
        now = time.monotonic()
        states = self._pool.states.values()
        return [(s.endpoint.shown, s.failures, max(0.0, s.retry_at - now)) for s in states]

    async def close(self) -> None:
        """Stop the timer and every request, and close the HTTP client if this object made it."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        tasks: list[asyncio.Task[object]] = [*self._inflight.values(), *self._retrying.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._pool.close()

    async def discover(self) -> list[str]:
        """Ask ``/listlookup`` for the fork's lookupds (see :meth:`LookupdPool.discover`), within
        ``timeout``; the lookupds known then."""
        await self._pool.discover(asyncio.get_running_loop().time() + self.timeout)
        return self.lookupds

    # -- lookups ----------------------------------------------------------------------------

    def cached(self, topic: str, access: Access = "r") -> PartitionMap | None:
        """The last map fetched for ``topic``/``access``, without any I/O."""
        return self._maps.get((topic, access))

    async def lookup(
        self, topic: str, access: Access = "r", *, force: bool = False
    ) -> PartitionMap:
        """The partition map of ``topic`` for readers (``r``) or writers (``w``), cached unless
        ``force``."""
        if access not in ("r", "w"):
            raise ConfigError(f"access must be 'r' or 'w', got {access!r}")
        if not force and (topic, access) in self._maps:
            return self._maps[(topic, access)]
        return await self.refresh(topic, access)

    async def refresh(self, topic: str, access: Access = "r") -> PartitionMap:
        """Fetch ``topic`` now, or join the fetch already under way for the same key (its own
        task: a caller that is cancelled leaves it running for the others)."""
        if self._closed:
            raise DiscoveryError("LookupClient is closed")
        key = (topic, access)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._fetch(key), name=f"nsq_ha-lookup-{topic}-{access}"
            )
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._fetch_done, key))
        return await asyncio.shield(task)

    def _fetch_done(self, key: Key, task: asyncio.Task[PartitionMap]) -> None:
        del self._inflight[key]  # the only task of its key: none is made while it is listed
        self._uncached.discard(key)
        if not task.cancelled():
            task.exception()  # retrieved here; every waiter re-raises it from the shield

    async def _fetch(self, key: Key) -> PartitionMap:
        topic, access = key
        deadline = asyncio.get_running_loop().time() + self.timeout
        if not self._pool.discovered:
            with contextlib.suppress(NsqError):
                await self._pool.discover(deadline)
        params = {"topic": topic, "access": access, "metainfo": "true"}
        parse = functools.partial(parse_lookup, topic, access)
        answers = await self._pool.gather("/lookup", params, parse, deadline)
        maps = [a for a in answers if isinstance(a, PartitionMap)]
        if not maps:
            errors = [a for a in answers if a not in maps]
            raise self._pool.never_answered(errors) or lookup_failure(topic, access, errors)
        merged = merge_maps(maps)
        old = self._maps.get(key)
        if key not in self._uncached:
            self._maps[key] = merged
        if old != merged:
            log.info(
                "lookup %s access=%s: %s%s",
                topic,
                access,
                ", ".join(str(r) for r in merged.routes()) or "no routes",
                f" (partition_num={merged.partition_num})" if merged.meta else "",
            )
            for listener in list(self._watch.get(key, ())):
                try:
                    if (res := listener(merged)) is not None:
                        await res
                except Exception:
                    log.exception("lookup listener %r failed for %s", listener, key)
        return merged

    async def writable(self, topic: str, *, force: bool = False) -> PartitionMap:
        """The ``access=w`` map, raising a typed error that says what to do if it has no route."""
        pmap = await self.lookup(topic, "w", force=force)
        if pmap.routes():
            return pmap
        raise unwritable(pmap)

    # -- watching ---------------------------------------------------------------------------

    def watch(self, topic: str, access: Access, listener: Listener | None = None) -> None:
        """Keep ``topic``/``access`` fresh on the timer; call ``listener`` when the map changes."""
        listeners = self._watch.setdefault((topic, access), [])
        if listener is not None:
            listeners.append(listener)
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().create_task(
                self._refresh_loop(), name="nsq_ha-lookup-refresh"
            )

    def unwatch(self, topic: str, access: Access, listener: Listener | None = None) -> None:
        """Stop calling ``listener`` (or stop watching the key when no listener is given); a
        key no longer watched also drops its cached map, so state per topic ever used is not
        kept (the next lookup asks lookupd again)."""
        key = (topic, access)
        listeners = self._watch.get(key)
        if listeners is None:
            return
        if listener in listeners:
            listeners.remove(listener)
        if listener is None or not listeners:
            del self._watch[key]
            if (retrying := self._retrying.pop(key, None)) is not None:
                retrying.cancel()
            self._maps.pop(key, None)
            if key in self._inflight:  # its answer must not cache the map again
                self._uncached.add(key)

    async def _refresh_loop(self) -> None:
        while True:
            delay = self.refresh_interval * (1 + random.uniform(-self.jitter, self.jitter))  # noqa: S311
            await asyncio.sleep(delay)
            with contextlib.suppress(NsqError):
                await self.discover()
            for key in list(self._watch):
                if key not in self._watch or key in self._retrying:
                    continue  # unwatched while this round was under way, or being retried
                try:
                    await self.refresh(*key)
                except NsqError as exc:
                    task = asyncio.get_running_loop().create_task(
                        self._retry_refresh(key, exc), name=f"nsq_ha-lookup-retry-{key}"
                    )
                    self._retrying[key] = task
                    task.add_done_callback(functools.partial(self._retry_done, key))

    async def _retry_refresh(self, key: Key, first_error: NsqError) -> None:
        """Retry a failed periodic refresh until it works (unwatch and close cancel it)."""
        what = f"periodic lookup of {key[0]} (access={key[1]})"
        failed: list[Failure] = []
        await retry_after(
            first_error,
            lambda _: self.refresh(*key),
            what=what,
            backoff=self._retry_backoff,
            should_retry=lambda exc: isinstance(exc, NsqError) and not self._closed,
            on_retry=failed.append,
            describe=lambda exc: redact_text(str(exc)),
            logger=log,
        )
        log.info("%s works again (after %d failed attempts)", what, len(failed))

    def _retry_done(self, key: Key, task: asyncio.Task[None]) -> None:
        if self._retrying.get(key) is task:
            del self._retrying[key]
