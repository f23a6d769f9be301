"""The lag poller's HTTP reads (:mod:`nsq_ha.otel.lag`), on the poller's own event loop.

Per (topic, channel): where the partitions are (nsqlookupd's ``/lookup``, or the map a shared
:class:`~nsq_ha.lookup.LookupClient` has cached), then each partition leader's ``/stats``. Every
request is bounded twice:

* in time: ``request_timeout`` seconds for the whole request, from connecting to the answer's
  last byte (``asyncio.timeout``: a server that trickles its head or its body does not keep
  it alive);
* in size: a lookupd answer as :class:`~nsq_ha.lookup.LookupClient` caps it; an nsqd
  ``/stats`` answer at :data:`MAX_STATS_BYTES`, refused as soon as it passes (read as it
  streams in, never whole), and parsed only if it holds at most :data:`MAX_STATS_CONTAINERS`
  objects and arrays and :data:`MAX_STATS_VALUES` values.

Parsing holds the GIL (``json.loads`` is one C call), so every thread of the process, a
consumer's event loop too, waits while an answer is parsed: the caps bound that wait (the
slowest answer let through, 80,000 floats, stalled a consumer's loop 25 ms) and what the parse
allocates (5.5 MiB for 80,000 short strings). An 8 MiB answer, parsed whole before the caps,
stalled it 0.3 s (1.6 s under tracemalloc) and grew the process by 225 MiB.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from nsq_ha.admin import ChannelLag, entry_lag
from nsq_ha.admin.lag import is_fork_entry, stat_int
from nsq_ha.errors import LookupdUnavailableError, NsqError, NsqTimeoutError, RemoteProtocolError
from nsq_ha.lookup import LookupClient, NodeInfo, PartitionMap, merge_maps, parse_lookup, unwrap
from nsq_ha.lookup.client import DEFAULT_MAX_ANSWER_BYTES
from nsq_ha.lookup.http import Endpoint, get_answer, normalize_lookupd, read_capped
from nsq_ha.lookup.wire import V1_ACCEPT

if TYPE_CHECKING:
    import httpx

__all__ = [
    "MAX_STATS_BYTES",
    "MAX_STATS_CONTAINERS",
    "MAX_STATS_VALUES",
    "Source",
    "lags_from_stats",
    "read_lags",
]

#: The largest ``/stats`` answer read. The poller asks for one topic and one channel without
#: clients (``topic=``, ``channel=``, ``needClients=false`` / ``include_clients=false``): the
#: fork answers an entry per partition the node holds, 1.2 KiB each (2 KiB with latency
#: percentiles, long names and big numbers), and a topic has at most 255 partitions
#: (nsqlookupd's limit), so 510 KiB at most; vanilla answers one entry. Twice that is room
#: enough.
MAX_STATS_BYTES = 1 << 20
#: JSON objects and arrays a ``/stats`` answer may hold: 9 per fork partition entry (21 with
#: latency percentiles), so 5,400 at most for 255 partitions.
MAX_STATS_CONTAINERS = 20_000
#: JSON values a ``/stats`` answer may hold, counted by the commas between them: 99 per fork
#: partition entry (157 with latency percentiles), so 40,000 at most for 255 partitions.
#: Parsing time and memory grow with values and containers more than with bytes: 1 MiB of
#: floats (``1.5,``) took 50 to 150 ms to parse, 1 MiB of ``{},`` 25 MiB of memory.
MAX_STATS_VALUES = 80_000

_STATS_HEADERS = {**V1_ACCEPT, "Accept-Encoding": "identity"}
#: how an answer over MAX_STATS_BYTES names the limit
_LIMIT = "MAX_STATS_BYTES, for one topic and channel"

#: how to find a channel's partitions: a shared LookupClient, or lookupd seed addresses
Source = LookupClient | tuple[str, ...]


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


async def read_lags(
    http: httpx.AsyncClient, source: Source, topic: str, channel: str, *, request_timeout: float
) -> dict[int | None, ChannelLag]:
    """The lag of ``topic``/``channel`` per partition (vanilla: one value, key None); each
    request whole within ``request_timeout`` seconds (else
    :class:`~nsq_ha.errors.NsqTimeoutError`)."""
    pmap = source.cached(topic, "r") if isinstance(source, LookupClient) else None
    if isinstance(source, tuple):
        pmap = await _lookup(http, source, topic, request_timeout)
    if pmap is None:
        return {}  # the shared client has not looked the topic up yet
    if not pmap.fork:
        found = []
        for node in pmap.producers:
            entries = await _stats(http, node, topic, channel, request_timeout)
            lag = lags_from_stats(entries, channel, None).get(None)
            if lag is not None:
                found.append(lag)
        return {None: _sum(found)} if found else {}
    by_node: dict[str, tuple[NodeInfo, list[int]]] = {}
    for partition, node in sorted(pmap.partitions.items()):
        by_node.setdefault(node.http_url, (node, []))[1].append(partition)
    lags: dict[int | None, ChannelLag] = {}
    for node, partitions in by_node.values():
        entries = await _stats(http, node, topic, channel, request_timeout)
        lags.update(lags_from_stats(entries, channel, partitions))
    return lags


async def _lookup(
    http: httpx.AsyncClient, seeds: tuple[str, ...], topic: str, request_timeout: float
) -> PartitionMap:
    """``/lookup?topic=T&access=r``: the first fork answer, or vanilla's merged over seeds."""
    import httpx

    maps: list[PartitionMap] = []
    errors: list[str] = []
    for seed in seeds:
        endpoint = Endpoint.parse(normalize_lookupd(seed))
        params = {"topic": topic, "access": "r"}
        try:
            async with asyncio.timeout(request_timeout):
                got = await get_answer(
                    http, endpoint, "/lookup", params, max_bytes=DEFAULT_MAX_ANSWER_BYTES
                )
            result = unwrap(got.status, got.headers, got.body, endpoint.shown)
            pmap = parse_lookup(topic, "r", result)
        except TimeoutError:
            errors.append(f"{endpoint.shown}: no answer within {request_timeout:g} s")
            continue
        except (httpx.HTTPError, NsqError, ValueError) as exc:  # this lookupd: ask the next
            errors.append(f"{endpoint.shown}: {type(exc).__name__}: {exc}")
            continue
        if pmap.fork:
            return pmap
        maps.append(pmap)
    if maps:
        return merge_maps(maps)
    raise LookupdUnavailableError(f"lookup of {topic!r} failed: " + "; ".join(errors))


async def _stats(
    http: httpx.AsyncClient, node: NodeInfo, topic: str, channel: str, request_timeout: float
) -> list[dict[str, Any]]:
    """The topic entries of ``node``'s ``/stats`` for ``topic``/``channel`` (no clients)."""
    params = {
        "format": "json",
        "topic": topic,
        "channel": channel,
        "needClients": "false",  # the fork's name
        "include_clients": "false",  # vanilla's
    }
    where = f"nsqd {node.http_url}/stats"
    try:
        async with asyncio.timeout(request_timeout):
            status, body = await _get(http, f"{node.http_url}/stats", params, where)
    except TimeoutError:
        raise NsqTimeoutError(
            f"{where} did not answer within {request_timeout:g} s (the whole answer): "
            "asked again at the next interval"
        ) from None
    if status != 200:
        raise RemoteProtocolError(f"{where} answered HTTP {status}")
    containers, values = body.count(b"{") + body.count(b"["), body.count(b",") + 1
    if containers > MAX_STATS_CONTAINERS or values > MAX_STATS_VALUES:
        raise RemoteProtocolError(
            f"{where} answered {len(body)} bytes with {containers} JSON objects and arrays and "
            f"{values} values, over the limits of {MAX_STATS_CONTAINERS} and "
            f"{MAX_STATS_VALUES} for one topic and channel: refused unparsed"
        )
    data = json.loads(body)
    if isinstance(data, dict) and "topics" not in data and isinstance(data.get("data"), dict):
        data = data["data"]  # the wrapped form
    topics = data.get("topics") if isinstance(data, dict) else None
    if topics is not None and not isinstance(topics, list):
        raise RemoteProtocolError(f"{where}: 'topics' is not a list")
    return [t for t in topics or () if isinstance(t, dict)]


async def _get(
    http: httpx.AsyncClient, url: str, params: Mapping[str, str], where: str
) -> tuple[int, bytes]:
    """GET ``url``: its status and body, refused past :data:`MAX_STATS_BYTES` (a declared
    ``Content-Length`` over it before any of the body is read), as lookupd's answers are
    (:func:`~nsq_ha.lookup.http.read_capped`)."""
    request = http.build_request("GET", url, params=params, headers=_STATS_HEADERS)
    response = await http.send(request, stream=True)
    answer = await read_capped(response, where, max_bytes=MAX_STATS_BYTES, limit_name=_LIMIT)
    return answer.status, answer.body
