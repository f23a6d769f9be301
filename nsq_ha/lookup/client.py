"""LookupClient: find topic partitions through nsqlookupd (fork or vanilla).

* Seeds are nsqlookupd HTTP addresses; ``/listlookup`` finds the rest of a fork's lookupds (404 on
  vanilla, null on a standalone fork: the seeds are used as they are).
* ``/lookup?topic=T&access=r|w&metainfo=true`` is asked of every usable lookupd at once and the
  answers merged (the leader's first).
* Refreshes are coalesced: however many callers ask at once, one request per lookupd goes out.
* A lookupd that fails is skipped until a backoff (doubling, with jitter, capped) has passed.
* Watched topics are refreshed on a timer with jitter; listeners hear about changed maps.
* All HTTP goes through one ``httpx.AsyncClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import httpx

from nsq_ha.errors import (
    ConfigError,
    DiscoveryError,
    LookupdUnavailableError,
    NsqError,
    TopicNotFoundError,
    TopicNotWritableError,
)
from nsq_ha.lookup.wire import (
    V1_ACCEPT,
    Access,
    LookupdError,
    PartitionMap,
    merge_maps,
    parse_listlookup,
    parse_lookup,
    unwrap,
)

__all__ = ["LookupClient", "normalize_lookupd"]

log = logging.getLogger(__name__)

Listener = Callable[[PartitionMap], Awaitable[None] | None]


def normalize_lookupd(address: str) -> str:
    """``host:port`` or ``http://host:port[/]`` -> ``http://host:port``."""
    addr = address.strip().rstrip("/")
    if not addr:
        raise ConfigError("empty nsqlookupd address")
    if "://" not in addr:
        addr = f"http://{addr}"
    url = httpx.URL(addr)
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"nsqlookupd address must be host:port or an http URL, got {address!r}")
    return addr


@dataclass
class _LookupdState:
    url: str
    failures: int = 0
    retry_at: float = 0.0

    def usable(self, now: float) -> bool:
        return now >= self.retry_at


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
        max_backoff: float = 60.0,
    ) -> None:
        seed_list = [seeds] if isinstance(seeds, str) else list(seeds)
        if not seed_list:
            raise ConfigError("LookupClient needs at least one nsqlookupd address")
        if refresh_interval <= 0 or timeout <= 0 or max_backoff <= 0:
            raise ConfigError("refresh_interval, timeout and max_backoff must be > 0")
        if not 0 <= jitter < 1:
            raise ConfigError(f"jitter must be in [0, 1), got {jitter}")
        self._seeds = list(dict.fromkeys(normalize_lookupd(s) for s in seed_list))
        self._lookupds = {u: _LookupdState(u) for u in self._seeds}
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._timeout = timeout
        self.refresh_interval = refresh_interval
        self.jitter = jitter
        self.max_backoff = max_backoff
        self._maps: dict[tuple[str, Access], PartitionMap] = {}
        self._inflight: dict[tuple[str, Access], asyncio.Task[PartitionMap]] = {}
        self._discovered = False
        self._watch: dict[tuple[str, Access], list[Listener]] = {}
        self._timer: asyncio.Task[None] | None = None
        self._closed = False
        #: how many HTTP requests this client sent, per path (for logs and tests)
        self.requests_sent: dict[str, int] = {}

    def __repr__(self) -> str:
        now = time.monotonic()
        up = sum(s.usable(now) for s in self._lookupds.values())
        return (
            f"<LookupClient lookupds={len(self._lookupds)} usable={up} "
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
        """Known lookupd base URLs (seeds and discovered), leader first when known."""
        return list(self._lookupds)

    def lookupd_status(self) -> list[tuple[str, int, float]]:
        """``(url, failures in a row, seconds until it is asked again)`` per known lookupd."""
        now = time.monotonic()
        return [(s.url, s.failures, max(0.0, s.retry_at - now)) for s in self._lookupds.values()]

    async def close(self) -> None:
        """Stop the refresh timer and close the HTTP client if this object created it."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        for task in list(self._inflight.values()):
            task.cancel()
        if self._owns_http:
            await self._http.aclose()

    # -- HTTP -------------------------------------------------------------------------------

    async def _get(self, base: str, path: str, params: dict[str, str] | None = None) -> object:
        state = self._lookupds.get(base)
        self.requests_sent[path] = self.requests_sent.get(path, 0) + 1
        url = f"{base}{path}"
        try:
            resp = await self._http.get(url, params=params, headers=dict(V1_ACCEPT))
        except httpx.HTTPError as exc:
            if state is not None:
                self._mark_failed(state, exc)
            raise LookupdUnavailableError(f"nsqlookupd {base} unreachable: {exc!r}") from exc
        if state is not None and resp.status_code < 500:
            state.failures, state.retry_at = 0, 0.0
        return unwrap(resp.status_code, resp.headers, resp.content, url)

    def _mark_failed(self, state: _LookupdState, exc: BaseException) -> None:
        state.failures += 1
        delay = min(self.max_backoff, 0.5 * 2 ** (state.failures - 1))
        delay *= 1 + random.uniform(-self.jitter, self.jitter)  # noqa: S311 - jitter, not crypto
        state.retry_at = time.monotonic() + delay
        log.warning(
            "nsqlookupd %s failed (%s); next try in %.1fs (%d failures in a row)",
            state.url,
            exc,
            delay,
            state.failures,
        )

    def _usable(self) -> list[_LookupdState]:
        now = time.monotonic()
        usable = [s for s in self._lookupds.values() if s.usable(now)]
        if usable:
            return usable
        # every lookupd is backing off: try the one whose backoff ends first rather than none
        return [min(self._lookupds.values(), key=lambda s: s.retry_at)]

    # -- discovery --------------------------------------------------------------------------

    async def discover(self) -> list[str]:
        """Ask ``/listlookup`` for the fork's lookupds; keep the seeds on vanilla/standalone."""
        for state in self._usable():
            try:
                found = parse_listlookup(await self._get(state.url, "/listlookup"))
            except LookupdError as exc:
                if exc.status == 404:  # vanilla nsqlookupd has no /listlookup
                    log.debug("%s has no /listlookup (vanilla): using the seeds", state.url)
                    break
                raise
            except LookupdUnavailableError:
                continue
            if not found:
                log.debug("%s: /listlookup is null (standalone fork): using the seeds", state.url)
                break
            ordered = found + [u for u in self._lookupds if u not in found]
            self._lookupds = {u: self._lookupds.get(u) or _LookupdState(u) for u in ordered}
            log.info("nsqlookupd cluster: %s (leader first)", ", ".join(found))
            break
        self._discovered = True
        return self.lookupds

    # -- lookups ----------------------------------------------------------------------------

    def cached(self, topic: str, access: Access = "r") -> PartitionMap | None:
        """The last map fetched for ``topic``/``access``, without any I/O."""
        return self._maps.get((topic, access))

    async def lookup(
        self, topic: str, access: Access = "r", *, force: bool = False
    ) -> PartitionMap:
        """The partition map of ``topic`` for readers (``r``) or writers (``w``).

        Cached unless ``force``; concurrent refreshes of the same key share one request round.
        """
        if access not in ("r", "w"):
            raise ConfigError(f"access must be 'r' or 'w', got {access!r}")
        key = (topic, access)
        if not force and key in self._maps:
            return self._maps[key]
        return await self.refresh(topic, access)

    async def refresh(self, topic: str, access: Access = "r") -> PartitionMap:
        """Fetch ``topic`` now, or join the fetch already under way for the same key.

        The fetch runs as its own task: a caller that is cancelled leaves it running for the
        others.
        """
        if self._closed:
            raise DiscoveryError("LookupClient is closed")
        key = (topic, access)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._fetch(topic, access), name=f"nsq_ha-lookup-{topic}-{access}"
            )
            self._inflight[key] = task
            task.add_done_callback(self._fetch_done)
        return await asyncio.shield(task)

    def _fetch_done(self, task: asyncio.Task[PartitionMap]) -> None:
        for key, t in list(self._inflight.items()):
            if t is task:
                del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved here; every waiter re-raises it from the shield

    async def _fetch(self, topic: str, access: Access) -> PartitionMap:
        if not self._discovered:
            with contextlib.suppress(NsqError):
                await self.discover()
        params = {"topic": topic, "access": access, "metainfo": "true"}
        states = self._usable()
        answers = await asyncio.gather(
            *(self._get(s.url, "/lookup", params) for s in states), return_exceptions=True
        )
        maps: list[PartitionMap] = []
        errors: list[BaseException] = []
        for ans in answers:
            if isinstance(ans, BaseException):
                if not isinstance(ans, NsqError):
                    raise ans
                errors.append(ans)
            else:
                maps.append(parse_lookup(topic, access, ans))
        if not maps:
            raise self._lookup_failure(topic, access, errors)
        merged = merge_maps(maps)
        old = self._maps.get((topic, access))
        self._maps[(topic, access)] = merged
        if old != merged:
            log.info(
                "lookup %s access=%s: %s%s",
                topic,
                access,
                ", ".join(str(r) for r in merged.routes()) or "no routes",
                f" (partition_num={merged.partition_num})" if merged.meta else "",
            )
            await self._notify((topic, access), merged)
        return merged

    @staticmethod
    def _lookup_failure(topic: str, access: Access, errors: list[BaseException]) -> NsqError:
        for err in errors:
            # matched on the message: the wrapped envelope reports these as HTTP 500
            msg = err.message if isinstance(err, LookupdError) else ""
            if msg in ("Key not found", "TOPIC_NOT_FOUND") or "no channel" in msg:
                if "no channel" in msg:
                    return TopicNotWritableError(
                        f"topic {topic!r} has no channel yet, so nsqlookupd hides it from "
                        "writers: subscribe a consumer (or nsqd POST /channel/create) first, or "
                        "run nsqlookupd with --allow-write-with-nochannels=true"
                    )
                if "TOPIC_NOT_FOUND" in msg:
                    return TopicNotFoundError(
                        f"topic {topic!r} is not known to nsqlookupd (vanilla): it is created "
                        "by the first PUB to an nsqd (use nsqd= addresses) or nsqd "
                        "POST /topic/create"
                    )
                return TopicNotFoundError(
                    f"topic {topic!r} does not exist in the cluster ({msg}): on the fork, "
                    "topics are created by an operator with nsqlookupd POST /topic/create "
                    "(partition_num, replicator)"
                )
        for err in errors:
            if isinstance(err, LookupdError):
                return err
        detail = "; ".join(str(e) for e in errors) or "no nsqlookupd to ask"
        return LookupdUnavailableError(f"lookup of {topic!r} (access={access}) failed: {detail}")

    async def writable(self, topic: str, *, force: bool = False) -> PartitionMap:
        """The ``access=w`` map, raising a typed error that says what to do if it has no route."""
        pmap = await self.lookup(topic, "w", force=force)
        if pmap.routes():
            return pmap
        if pmap.fork and (pmap.meta is None or pmap.partition_num == 0):
            raise TopicNotFoundError(
                f"topic {topic!r} does not exist in the cluster: on the fork, topics are "
                "created by an operator with nsqlookupd POST /topic/create"
            )
        if pmap.fork:
            raise TopicNotWritableError(
                f"topic {topic!r} has {pmap.partition_num} partitions but none is writable now "
                "(new topic not yet checked by nsqlookupd, writes disabled, or leaders failing "
                "over): retry later"
            )
        raise TopicNotFoundError(
            f"no nsqd has topic {topic!r} (vanilla): publish through nsqd= addresses to create it"
        )

    # -- watching ---------------------------------------------------------------------------

    def watch(self, topic: str, access: Access, listener: Listener | None = None) -> None:
        """Keep ``topic``/``access`` fresh on the timer; call ``listener`` when the map changes."""
        self._watch.setdefault((topic, access), [])
        if listener is not None:
            self._watch[(topic, access)].append(listener)
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().create_task(
                self._refresh_loop(), name="nsq_ha-lookup-refresh"
            )

    def unwatch(self, topic: str, access: Access, listener: Listener | None = None) -> None:
        """Stop calling ``listener`` (or stop watching the key when no listener is given)."""
        listeners = self._watch.get((topic, access))
        if listeners is None:
            return
        if listener is not None and listener in listeners:
            listeners.remove(listener)
        if listener is None or not listeners:
            del self._watch[(topic, access)]

    async def _notify(self, key: tuple[str, Access], pmap: PartitionMap) -> None:
        for listener in list(self._watch.get(key, ())):
            try:
                res = listener(pmap)
                if res is not None:
                    await res
            except Exception:
                log.exception("lookup listener %r failed for %s", listener, key)

    async def _refresh_loop(self) -> None:
        while True:
            delay = self.refresh_interval * (1 + random.uniform(-self.jitter, self.jitter))  # noqa: S311
            await asyncio.sleep(delay)
            with contextlib.suppress(NsqError):
                await self.discover()
            for topic, access in list(self._watch):
                try:
                    await self.refresh(topic, access)
                except NsqError as exc:
                    log.warning("periodic lookup of %s (access=%s) failed: %s", topic, access, exc)
