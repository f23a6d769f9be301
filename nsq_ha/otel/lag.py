"""Consumer lag per partition for ``nsq.consumer.lag``: polled off the client's hot path.

nsqd does not send a channel's lag over the TCP protocol; its HTTP ``/stats`` has it. A
:class:`LagPoller` runs one daemon thread while instrumented consumers exist (started by the
first consumer's ``start()``, ended by :func:`~nsq_ha.otel.uninstrument` or once no consumer is
left). Every ``lag_interval`` seconds it asks, per (topic, channel) of the live consumers:

* where the partitions are: nsqlookupd's ``/lookup?topic=T&access=r`` through the consumer's
  ``lookupd=`` addresses (their credentials as basic auth, ``https://`` verified as the
  consumer's :class:`~nsq_ha.lookup.LookupClient` verifies it), or, for a ``lookup=`` consumer,
  the map its shared :class:`~nsq_ha.lookup.LookupClient` has cached (no request);
* each partition leader's ``/stats?format=json&topic=T&channel=C`` (plain HTTP at the node's
  ``http_port``, as ``nsq-ha stats`` reads it; nsqd's ``/stats`` needs no credentials), lag as
  :func:`nsq_ha.admin.entry_lag` computes it. On vanilla nsqd the lag of the channel is summed
  over the nsqds producing the topic and has no partition.

Every request has a timeout (:data:`HTTP_TIMEOUT`) and the observable gauges' callbacks only read
the cache (:class:`LagCache`), so a metric collection never waits for a server and nothing runs
on a consumer's event loop. A value not refreshed for :data:`STALE_INTERVALS` intervals is
dropped; a (topic, channel) no live consumer has any more is forgotten. A failing poll is logged
once (WARNING) per failure streak, then at DEBUG.

Consumers given ``nsqd=`` addresses have no lag: their nsqds' HTTP addresses are not known.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nsq_ha.admin import ChannelLag, entry_lag
from nsq_ha.admin.lag import is_fork_entry, stat_int
from nsq_ha.errors import LookupdUnavailableError, NsqError, RemoteProtocolError
from nsq_ha.lookup import LookupClient, NodeInfo, PartitionMap, merge_maps, parse_lookup, unwrap
from nsq_ha.lookup.client import DEFAULT_MAX_ANSWER_BYTES
from nsq_ha.lookup.http import Endpoint, normalize_lookupd, tls_context
from nsq_ha.lookup.wire import V1_ACCEPT
from nsq_ha.redact import redact_text

if TYPE_CHECKING:
    import httpx

    from nsq_ha.consumer import Consumer

__all__ = [
    "HTTP_TIMEOUT",
    "STALE_INTERVALS",
    "LagCache",
    "LagPoller",
    "check_interval",
    "lags_from_stats",
]

log = logging.getLogger(__name__)

#: seconds one HTTP request of a poll may take (connect, read, the whole answer)
HTTP_TIMEOUT = 5.0
#: a value is dropped once this many intervals passed without a fresh one
STALE_INTERVALS = 3
#: the largest ``/stats`` answer read (one topic and channel: a few KB per partition)
MAX_STATS_BYTES = 8 << 20

#: (topic, channel, partition or None on vanilla)
LagKey = tuple[str, str, int | None]
#: how to find a channel's partitions: a shared LookupClient, or lookupd seed addresses
Source = LookupClient | tuple[str, ...]


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


def lags_from_stats(
    entries: Iterable[Mapping[str, Any]], channel: str, partitions: Iterable[int] | None
) -> dict[int | None, ChannelLag]:
    """The lags of ``channel`` in one nsqd's ``/stats`` entries: per partition of
    ``partitions`` this node leads (the fork), or one value with key None (vanilla, whose
    ``partitions`` is None)."""
    wanted = None if partitions is None else set(partitions)
    found: dict[int | None, ChannelLag] = {}
    for entry in entries:
        fork = is_fork_entry(entry)
        partition = stat_int(entry.get("topic_partition")) if fork else None
        if fork != (wanted is not None) or (wanted is not None and partition not in wanted):
            continue
        lag = entry_lag(entry, channel)
        if lag is not None and lag.messages is not None:
            found[partition] = lag
    return found


def _sum(lags: Iterable[ChannelLag]) -> ChannelLag:
    messages = [lag.messages or 0 for lag in lags]
    return ChannelLag(sum(messages), None)


def _live(consumers: weakref.WeakSet[Consumer]) -> list[Consumer]:
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
    ``consumers`` has live members."""

    def __init__(
        self, consumers: weakref.WeakSet[Consumer], cache: LagCache, interval: float
    ) -> None:
        """Poll for ``consumers`` (read, never changed) into ``cache``."""
        self.consumers = consumers
        self.cache = cache
        self.interval = interval
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        #: (topic, channel) whose last poll failed: logged once per streak
        self._failing: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running" if self._thread else "idle"
        return f"<LagPoller every {self.interval:g}s {state} values={len(self.cache)}>"

    @property
    def running(self) -> bool:
        """True while the thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self) -> None:
        """Start the thread unless it runs (called after a consumer was added)."""
        with self._lock:
            if self._stopped or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="nsq_ha-otel-lag", daemon=True)
            self._thread.start()

    def forget(self, now: float | None = None) -> None:
        """Drop what no live consumer needs (called after a consumer closed), and let the
        thread end at once if none is left."""
        groups = {(c.topic, c.channel) for c in _live(self.consumers)}
        self.cache.retain(groups, time.monotonic() if now is None else now)
        if not groups:
            self._wake.set()

    def stop(self, timeout: float = 1.0) -> None:
        """End the thread (waits ``timeout`` seconds at most: a request under way ends by
        itself, within :data:`HTTP_TIMEOUT`, and its answer is not kept)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=HTTP_TIMEOUT, verify=tls_context()) as http:
            while True:
                self._wake.clear()  # a wake from now on ends the wait below at once
                with self._lock:
                    consumers = _live(self.consumers)
                    if self._stopped or not consumers:
                        self._thread = None
                        return
                sources: dict[tuple[str, str], Source] = {}
                for consumer in consumers:
                    source = _source(consumer)
                    if source is not None:
                        sources.setdefault((consumer.topic, consumer.channel), source)
                del consumers  # no strong reference kept while waiting
                self.poll(http, sources)
                del sources
                self._wake.wait(self.interval)

    def poll(self, http: httpx.Client, sources: Mapping[tuple[str, str], Source]) -> None:
        """Read the lag of every (topic, channel) of ``sources`` once, into the cache."""
        for (topic, channel), source in sources.items():
            try:
                lags = _read(http, source, topic, channel)
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


# -- HTTP ---------------------------------------------------------------------------------------


def _read(
    http: httpx.Client, source: Source, topic: str, channel: str
) -> dict[int | None, ChannelLag]:
    """The lag of ``topic``/``channel`` per partition (vanilla: one value, key None)."""
    pmap = source.cached(topic, "r") if isinstance(source, LookupClient) else None
    if isinstance(source, tuple):
        pmap = _lookup(http, source, topic)
    if pmap is None:
        return {}  # the shared client has not looked the topic up yet
    if not pmap.fork:
        per_node = [
            lags_from_stats(_stats(http, node, topic, channel), channel, None)
            for node in pmap.producers
        ]
        found = [lags[None] for lags in per_node if None in lags]
        return {None: _sum(found)} if found else {}
    by_node: dict[str, tuple[NodeInfo, list[int]]] = {}
    for partition, node in sorted(pmap.partitions.items()):
        by_node.setdefault(node.http_url, (node, []))[1].append(partition)
    lags: dict[int | None, ChannelLag] = {}
    for node, partitions in by_node.values():
        lags.update(lags_from_stats(_stats(http, node, topic, channel), channel, partitions))
    return lags


def _get(
    http: httpx.Client, url: str, params: Mapping[str, str], auth: Any, max_bytes: int
) -> tuple[int, httpx.Headers, bytes]:
    """GET ``url``; the answer, refused past ``max_bytes``."""
    import httpx

    headers = {**V1_ACCEPT, "Accept-Encoding": "identity"}
    with http.stream(
        "GET",
        url,
        params=params,
        headers=headers,
        auth=auth if auth is not None else httpx.USE_CLIENT_DEFAULT,
    ) as response:
        body = bytearray()
        for chunk in response.iter_raw():
            body += chunk
            if len(body) > max_bytes:
                raise RemoteProtocolError(f"{url} answered more than {max_bytes} bytes")
        return response.status_code, response.headers, bytes(body)


def _lookup(http: httpx.Client, seeds: tuple[str, ...], topic: str) -> PartitionMap:
    """``/lookup?topic=T&access=r``: the first fork answer, or vanilla's merged over seeds."""
    import httpx

    maps: list[PartitionMap] = []
    errors: list[str] = []
    for seed in seeds:
        endpoint = Endpoint.parse(normalize_lookupd(seed))
        url = f"{endpoint.url}/lookup"
        params = {"topic": topic, "access": "r"}
        try:
            status, headers, body = _get(http, url, params, endpoint.auth, DEFAULT_MAX_ANSWER_BYTES)
            pmap = parse_lookup(topic, "r", unwrap(status, headers, body, endpoint.shown))
        except (httpx.HTTPError, NsqError, ValueError) as exc:  # this lookupd: ask the next
            errors.append(f"{endpoint.shown}: {type(exc).__name__}: {exc}")
            continue
        if pmap.fork:
            return pmap
        maps.append(pmap)
    if maps:
        return merge_maps(maps)
    raise LookupdUnavailableError(f"lookup of {topic!r} failed: " + "; ".join(errors))


def _stats(http: httpx.Client, node: NodeInfo, topic: str, channel: str) -> list[dict[str, Any]]:
    """The topic entries of ``node``'s ``/stats`` for ``topic``/``channel`` (no clients)."""
    params = {
        "format": "json",
        "topic": topic,
        "channel": channel,
        "needClients": "false",  # the fork's name
        "include_clients": "false",  # vanilla's
    }
    url = f"{node.http_url}/stats"
    status, _, body = _get(http, url, params, None, MAX_STATS_BYTES)
    if status != 200:
        raise RemoteProtocolError(f"nsqd {node.http_url} /stats answered HTTP {status}")
    data = json.loads(body)
    if isinstance(data, dict) and "topics" not in data and isinstance(data.get("data"), dict):
        data = data["data"]  # the wrapped form
    topics = data.get("topics") if isinstance(data, dict) else None
    if topics is not None and not isinstance(topics, list):
        raise RemoteProtocolError(f"nsqd {node.http_url} /stats: 'topics' is not a list")
    return [t for t in topics or () if isinstance(t, dict)]
