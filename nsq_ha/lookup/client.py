"""LookupClient: the partition maps of topics, per access, through nsqlookupd (fork or vanilla).

Every usable lookupd is asked at once, so a slow one never holds back the others; one that fails,
or whose answer is refused, is skipped until its backoff (:class:`LookupdHealth`) has passed. Until
a lookupd has answered, an address that answered something that is not HTTP is asked once more in
NSQ's protocol (:func:`looks_like_nsqd`): nsqd's TCP port given for lookupd's HTTP port is the
usual mix-up, and :func:`never_answered`'s error then says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self, TypeVar

from nsq_ha.durations import seconds
from nsq_ha.errors import (
    ConfigError,
    DiscoveryError,
    LookupdNeverAnsweredError,
    LookupdUnavailableError,
    NsqError,
    RemoteProtocolError,
    TopicNotFoundError,
    TopicNotWritableError,
)
from nsq_ha.lookup.http import Endpoint, get_answer, normalize_lookupd, tls_context
from nsq_ha.lookup.wire import (
    Access,
    LookupdError,
    PartitionMap,
    merge_maps,
    parse_listlookup,
    parse_lookup,
    unwrap,
)
from nsq_ha.redact import redact_text
from nsq_ha.retry import LOOKUPD, Backoff, Failure, log_failure, retry_after

if TYPE_CHECKING:  # httpx is imported where a request is made: nsqd= clients never load it
    import httpx

__all__ = ["ANSWER_GRACE", "DEFAULT_MAX_ANSWER_BYTES", "LookupClient", "LookupdHealth"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Listener = Callable[[PartitionMap], Awaitable[None] | None]
Key = tuple[str, Access]
Params = dict[str, str] | None

#: Default cap on one lookupd answer: a 255-partition fork answer is about 100 KB, and parsing
#: 512 KiB of the costliest JSON allowed takes ~15 ms of one idle core (the event loop stall).
DEFAULT_MAX_ANSWER_BYTES = 512 << 10
_MAX_ANSWER_BYTES_LIMIT = 64 << 20
#: Seconds the other lookupds get, once one has answered a lookup, to answer too.
ANSWER_GRACE = 0.5
#: What an address that answers with nsqd's E_BAD_PROTOCOL is told.
NSQD_TCP_PORT = "this looks like nsqd's TCP port (4150): lookupd's HTTP port is usually 4161"
#: The most of a probe's answer read: nsqd's whole E_BAD_PROTOCOL frame is 22 bytes.
_PROBE_BYTES = 256


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


def never_answered(tried: Sequence[tuple[str, str]]) -> LookupdNeverAnsweredError:
    """No lookupd has answered since the client started: ``tried`` is (address, what it did)."""
    what = "; ".join(f"{shown}: {reason}" for shown, reason in tried) or "none given"
    reasons = " ".join(reason for _, reason in tried)
    if NSQD_TCP_PORT in reasons:
        advice = "give nsqlookupd's HTTP address"
    elif "not HTTP" in reasons:
        advice = (
            "check the port (nsqlookupd's HTTP port, usually 4161, not nsqd's TCP port 4150) "
            "and the scheme (http:// or https://)"
        )
    else:
        advice = (
            "check the address: nsqlookupd's HTTP port (usually 4161), that nsqlookupd runs "
            "there and is reachable from here"
        )
    return LookupdNeverAnsweredError(
        f"no nsqlookupd has answered yet (tried {what}): {advice}. A lookupd that never "
        "answered is taken for a wrong address and not retried; one that answered once is "
        "retried through outages"
    )


async def looks_like_nsqd(url: str, deadline: float) -> bool:
    """Whether ``url``'s host and port answer like nsqd's TCP port by ``deadline`` (loop time): a
    request that is not NSQ's magic gets ``E_BAD_PROTOCOL``. Any failure is False."""
    import httpx

    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        async with asyncio.timeout_at(deadline):
            reader, writer = await asyncio.open_connection(parsed.host, port)
            try:
                writer.write(b"GET / HTTP/1.1\r\n\r\n")  # what an HTTP client sends first
                await writer.drain()
                return b"E_BAD_PROTOCOL" in await reader.read(_PROBE_BYTES)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return False


@dataclass
class LookupdHealth:
    """One lookupd: where it is, and how its recent requests went."""

    endpoint: Endpoint
    failures: int = 0
    #: ``time.monotonic()`` before which it is asked only if no other lookupd may be
    retry_at: float = 0.0
    #: what its last failure was (for the error when no lookupd has ever answered)
    reason: str = ""

    def failed(self, reason: str, backoff: Backoff) -> None:
        """Skip it for ``backoff``'s wait after this many failures in a row (logged)."""
        self.failures += 1
        self.reason = reason
        delay = backoff.delay(self.failures)
        self.retry_at = time.monotonic() + delay
        what = f"nsqlookupd {self.endpoint.shown}"
        log_failure(log, what, self.failures, reason, delay, "until it answers again")

    def answered(self) -> None:
        """It answered (not with a server error): the streak, if any, ends."""
        if self.failures:
            what, failures = self.endpoint.shown, self.failures
            log.info("nsqlookupd %s answers again (after %d failures in a row)", what, failures)
        self.failures, self.retry_at = 0, 0.0


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

        ``timeout``: the deadline of one lookup (discovery and every request included), in seconds.
        ``refresh_interval``: how often watched topics are refreshed. ``jitter``: the random
        fraction (0 <= j < 1) spread over the refresh timer (0: no jitter in the backoffs either).
        ``max_backoff``: the longest a failing lookupd is skipped (30 s). ``max_answer_bytes``: the
        largest answer read (512 KiB by default, at most 64 MiB)."""
        import httpx

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
        size, limit = max_answer_bytes, _MAX_ANSWER_BYTES_LIMIT
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= limit:
            raise ConfigError(f"max_answer_bytes must be an int in 1..{limit}, got {size!r}")
        self.max_answer_bytes = max_answer_bytes
        self._seeds: dict[str, Endpoint] = {}
        for endpoint in (Endpoint.parse(normalize_lookupd(seed)) for seed in seed_list):
            self._seeds.setdefault(endpoint.url, endpoint)
        self._lookupds = {u: LookupdHealth(e) for u, e in self._seeds.items()}
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=self.timeout, verify=tls_context())
        self._backoff = LOOKUPD.capped(self.max_backoff, jitter=bool(jitter))
        self._retry_backoff = LOOKUPD.capped(self.refresh_interval, jitter=bool(jitter))
        #: ``/listlookup`` was asked once (the lookupds known are the cluster's)
        self._discovered = False
        #: some lookupd has sent an HTTP answer (until then, failures are not retried)
        self._answered = False
        #: requests still running after their lookup returned (they end by its deadline)
        self._stragglers: set[asyncio.Task[object]] = set()
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
        usable = sum(now >= s.retry_at for s in self._lookupds.values())
        return (
            f"<LookupClient lookupds={len(self._lookupds)} usable={usable} "
            f"topics={len(self._maps)} watched={len(self._watch)}>"
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def lookupds(self) -> list[str]:
        """Known lookupd base URLs (seeds and discovered), leader first when known, passwords
        redacted (``http://user:***@host:4161``)."""
        return [s.endpoint.shown for s in self._lookupds.values()]

    @property
    def cached_keys(self) -> frozenset[Key]:
        """The (topic, access) keys whose partition map is cached."""
        return frozenset(self._maps)

    def lookupd_status(self) -> list[tuple[str, int, float]]:
        """``(url as in :attr:`lookupds`, failures in a row, seconds until it is asked again)``
        per known lookupd."""
        now = time.monotonic()
        states = self._lookupds.values()
        return [(s.endpoint.shown, s.failures, max(0.0, s.retry_at - now)) for s in states]

    async def close(self) -> None:
        """Stop the timer and every request, and close the HTTP client if this object made it."""
        self._closed = True
        timer, self._timer = self._timer, None
        tasks: list[asyncio.Task[object]] = [*self._inflight.values(), *self._retrying.values()]
        await _cancel([*tasks, *self._stragglers, *([timer] if timer else [])])
        if self._owns_http:
            await self._http.aclose()

    async def discover(self) -> list[str]:
        """Ask ``/listlookup`` for the fork's lookupds within ``timeout``; the lookupds known then.
        The seeds stay on vanilla (404) and a standalone fork (null); else the lookupds named
        (leader first), then the seeds not named, replace those known (a named seed keeps its
        credentials)."""
        await self._discover(asyncio.get_running_loop().time() + self.timeout)
        return self.lookupds

    async def _discover(self, deadline: float) -> None:
        tasks = self._ask_all("/listlookup", None, parse_listlookup, deadline)
        errors: list[NsqError] = []  # but unreachable lookupds
        try:
            for next_done in asyncio.as_completed(tasks):
                try:
                    found = await next_done
                except NsqError as exc:
                    if isinstance(exc, LookupdError) and exc.status == 404:
                        log.debug("nsqlookupd has no /listlookup (vanilla): using the seeds")
                        break
                    if not isinstance(exc, LookupdUnavailableError):
                        errors.append(exc)
                    continue
                if found:
                    self._lookupds = {
                        u: self._lookupds.get(u)
                        or LookupdHealth(self._seeds.get(u) or Endpoint(u, u))
                        for u in found + [u for u in self._seeds if u not in found]
                    }
                    log.info("nsqlookupd cluster: %s (leader first)", ", ".join(found))
                else:
                    log.debug("/listlookup is null (standalone fork): using the seeds")
                break
            else:
                if errors:
                    raise errors[0]
        finally:
            await _cancel(tasks)
        self._discovered = True

    # -- asking the lookupds ----------------------------------------------------------------

    def _ask_all(
        self, path: str, params: Params, parse: Callable[[object], T], deadline: float
    ) -> list[asyncio.Task[T]]:
        """GET ``path`` of every usable lookupd (else of the one whose backoff ends first) by
        ``deadline``, each in a task: one that fails or sends an answer we refuse is marked failed
        (an error status is an answer)."""
        import httpx

        async def ask(state: LookupdHealth) -> T:
            shown = state.endpoint.shown
            try:
                async with asyncio.timeout_at(deadline):
                    answer = await get_answer(
                        self._http, state.endpoint, path, params, max_bytes=self.max_answer_bytes
                    )
            except TimeoutError:
                what = f"did not answer {path} within {self.timeout:.1f} s"
                state.failed(what, self._backoff)
                raise LookupdUnavailableError(f"nsqlookupd {shown} {what} (timeout)") from None
            except httpx.HTTPError as exc:
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                what = f"unreachable: {reason}"
                if isinstance(exc, httpx.RemoteProtocolError) and not self._answered:
                    what = f"its answer is not HTTP ({reason})"
                    if await looks_like_nsqd(state.endpoint.url, deadline):
                        what = f"it answered nsqd's E_BAD_PROTOCOL, not HTTP: {NSQD_TCP_PORT}"
                state.failed(what, self._backoff)
                raise LookupdUnavailableError(f"nsqlookupd {shown} {what}") from exc
            except RemoteProtocolError as exc:
                self._answered = True  # an HTTP answer, refused for its size or encoding
                state.failed(str(exc), self._backoff)
                raise
            self._answered = True
            if answer.status < 500:
                state.answered()
            try:
                return parse(unwrap(answer.status, answer.headers, answer.body, shown + path))
            except RemoteProtocolError as exc:
                state.failed(str(exc), self._backoff)
                raise

        now = time.monotonic()
        states = [s for s in self._lookupds.values() if now >= s.retry_at]
        states = states or [min(self._lookupds.values(), key=lambda s: s.retry_at)]
        loop = asyncio.get_running_loop()
        return [loop.create_task(ask(s), name=f"nsq_ha-lookupd-{path}") for s in states]

    async def _gather(
        self, path: str, params: Params, parse: Callable[[object], T], deadline: float
    ) -> list[T | NsqError]:
        """Every usable lookupd's answer or error, in their order: once one has answered, the
        others get :data:`ANSWER_GRACE` s more, then go on in the background until the deadline."""
        loop = asyncio.get_running_loop()
        tasks = self._ask_all(path, params, parse, deadline)
        pending: set[asyncio.Task[T]] = set(tasks)
        grace_end: float | None = None
        try:
            while pending:
                wait = None if grace_end is None else max(0.0, grace_end - loop.time())
                done, pending = await asyncio.wait(
                    pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break
                if grace_end is None and any(
                    not t.cancelled() and t.exception() is None for t in done
                ):
                    grace_end = min(deadline, loop.time() + ANSWER_GRACE)
        except BaseException:
            await _cancel(tasks)
            raise
        results: list[T | NsqError] = []
        for task in tasks:
            if task in pending:
                self._stragglers.add(task)
                task.add_done_callback(self._straggler_done)
            elif (exc := task.exception()) is None:
                results.append(task.result())
            elif isinstance(exc, NsqError):
                results.append(exc)
            else:
                raise exc
        return results

    def _straggler_done(self, task: asyncio.Task[object]) -> None:
        self._stragglers.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a late answer or failure was already accounted for

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
            self._inflight[key] = task = asyncio.get_running_loop().create_task(
                self._fetch(key), name=f"nsq_ha-lookup-{topic}-{access}"
            )
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
        if not self._discovered:
            with contextlib.suppress(NsqError):
                await self._discover(deadline)
        params = {"topic": topic, "access": access, "metainfo": "true"}
        parse = functools.partial(parse_lookup, topic, access)
        answers = await self._gather("/lookup", params, parse, deadline)
        maps = [a for a in answers if isinstance(a, PartitionMap)]
        if not maps:
            errors = [a for a in answers if a not in maps]
            if not self._answered and all(isinstance(e, LookupdUnavailableError) for e in errors):
                # each was unreachable, and none ever answered: a wrong address, not an outage
                states = self._lookupds.values()
                raise never_answered([(s.endpoint.shown, s.reason) for s in states if s.failures])
            raise lookup_failure(topic, access, errors)
        merged = merge_maps(maps)
        old = self._maps.get(key)
        if key not in self._uncached:
            self._maps[key] = merged
        if old != merged:
            routes = ", ".join(str(r) for r in merged.routes()) or "no routes"
            num = f" (partition_num={merged.partition_num})" if merged.meta else ""
            log.info("lookup %s access=%s: %s%s", topic, access, routes, num)
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
        """Stop calling ``listener`` (or watching the key when none is given); a key no longer
        watched drops its cached map too (the next lookup asks lookupd again)."""
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
                    self._retrying[key] = task = asyncio.get_running_loop().create_task(
                        self._retry_refresh(key, exc), name=f"nsq_ha-lookup-retry-{key}"
                    )
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


async def _cancel(tasks: Sequence[asyncio.Task[T]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
