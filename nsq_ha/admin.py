"""Topic administration through nsqlookupd's admin API (the fork; vanilla where it has one).

The fork creates topics only here: ``POST /topic/create`` on the *leader* nsqlookupd (the first
node ``/listlookup`` names), after which the topic becomes writable once lookupd's periodic
topic check has placed its partitions (seconds; re-posting the identical request triggers the
check again and is harmless). :class:`LookupdAdmin` does that, waits for it, and can move a
partition's leader (``/topic/partition/move``), which the scenarios and the demo use to show
failover on a real cluster as on the embedded one.

Vanilla nsqlookupd has a ``/topic/create?topic=T`` too (no partitions, no replicas): it is
used when ``/listlookup`` answers 404.

nsqd's own admin calls (``/channel/create``, ``/channel/setoffset``, ``/channel/delete``) are
written here once, in :class:`NsqdAdmin`: the consumer's :meth:`~nsq_ha.consumer.Consumer.seek`,
the Spark source and :meth:`LookupdAdmin.create_channel` all use it, and every refusal is an
:class:`AdminError`. :func:`seek_position` spells a setoffset position.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from nsq_ha.durations import seconds
from nsq_ha.errors import (
    ConfigError,
    DiscoveryError,
    LookupdUnavailableError,
    UnsupportedByServerError,
)
from nsq_ha.lookup import LookupClient
from nsq_ha.lookup.http import Endpoint, normalize_lookupd, tls_context
from nsq_ha.lookup.wire import (
    V1_ACCEPT,
    LookupdError,
    NodeInfo,
    PartitionMap,
    parse_listlookup,
    unwrap,
)
from nsq_ha.protocol.names import validate_channel, validate_topic

if TYPE_CHECKING:  # httpx is imported where a request is made: nsqd= clients never load it
    import httpx

__all__ = [
    "MAX_RETENTION_DAYS",
    "MAX_SYNC_EVERY",
    "AdminError",
    "LookupdAdmin",
    "NsqdAdmin",
    "TopicSpec",
    "seek_position",
]

log = logging.getLogger(__name__)

#: how long to wait between identical ``/topic/create`` requests that nudge the topic check
_REPOST_INTERVAL = 6.0
#: how long "No node is available" counts as start-up (nodes not yet registered)
_NODES_PATIENCE = 20.0


class AdminError(DiscoveryError):
    """nsqlookupd or nsqd refused an admin request (or was unreachable), or it did not take
    effect in time."""


def seek_position(
    *,
    offset: int | None = None,
    timestamp: float | None = None,
    count: int | None = None,
    end: bool = False,
) -> str:
    """The ``/channel/setoffset`` body for exactly one position: ``offset`` (queue byte offset),
    ``timestamp`` (Unix seconds), ``count`` (the N-th message, from 1) or ``end=True``; anything
    else is a :class:`ConfigError`."""
    chosen = [x for x in (offset, timestamp, count) if x is not None] + ([True] if end else [])
    if len(chosen) != 1:
        raise ConfigError("seek needs exactly one of offset=, timestamp=, count= or end=True")
    if offset is not None:
        return f"virtual_queue:{_whole(offset, 'offset', 0)}"
    if timestamp is not None:
        return f"timestamp:{int(seconds(timestamp, 'timestamp', zero=True))}"
    if count is not None:
        return f"msgcount:{_whole(count, 'count', 1)}"
    return "special:-1"


def _whole(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class NsqdAdmin:
    """nsqd's HTTP admin calls on one node (``http_url``, e.g. a lookup NodeInfo's).

    Give ``http`` to share a client (it is then not closed here). Every refusal, and an
    unreachable nsqd, is an :class:`AdminError` naming the call.
    """

    def __init__(
        self, http_url: str, *, http: httpx.AsyncClient | None = None, timeout: float = 10.0
    ) -> None:
        """Admin calls to the nsqd at ``http_url``."""
        import httpx

        self.http_url = http_url.rstrip("/")
        self._owns_http = http is None
        self._http = (
            http if http is not None else httpx.AsyncClient(timeout=timeout, verify=tls_context())
        )

    def __repr__(self) -> str:
        return f"<NsqdAdmin {self.http_url}>"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP client if this object made it."""
        if self._owns_http:
            await self._http.aclose()

    async def create_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """``POST /channel/create`` (on the fork: on the partition's leader)."""
        await self._post("/channel/create", topic, channel, partition)

    async def delete_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """``POST /channel/delete``."""
        await self._post("/channel/delete", topic, channel, partition)

    async def set_offset(self, topic: str, channel: str, partition: int, position: str) -> None:
        """``POST /channel/setoffset`` on the partition's leader (the fork): move ``channel``
        to ``position`` (see :func:`seek_position`)."""
        await self._post("/channel/setoffset", topic, channel, partition, position)

    async def topic_stats(self, topic: str, partition: int | None = None) -> list[dict[str, Any]]:
        """``GET /stats?format=json&topic=T[&partition=P]`` (v1, unwrapped: §5.1): the entries of
        ``topics`` (one per partition this nsqd holds; an empty list when it holds none)."""
        import httpx

        params = {"format": "json", "topic": topic}
        if partition is not None:
            params["partition"] = str(partition)
        url = f"{self.http_url}/stats"
        try:
            resp = await self._http.get(url, params=params, headers=dict(V1_ACCEPT))
        except httpx.HTTPError as exc:
            raise AdminError(f"nsqd {self.http_url} unreachable: {exc!r}") from exc
        if resp.status_code != 200:
            raise AdminError(
                f"nsqd {self.http_url} refused /stats for {topic}: "
                f"HTTP {resp.status_code} {resp.text[:200]}"
            )
        try:
            data = resp.json()
        except ValueError as exc:
            raise AdminError(f"nsqd {self.http_url} /stats is not JSON: {exc}") from None
        topics = data.get("topics") if isinstance(data, dict) else None
        if topics is not None and not isinstance(topics, list):
            raise AdminError(f"nsqd {self.http_url} /stats: 'topics' is not a list")
        return [t for t in topics or () if isinstance(t, dict)]

    async def _post(
        self, path: str, topic: str, channel: str, partition: int | None, body: str = ""
    ) -> None:
        import httpx

        params = {"topic": topic, "channel": channel}
        if partition is not None:
            params["partition"] = str(partition)
        url = f"{self.http_url}{path}"
        try:
            resp = await self._http.post(url, params=params, content=body.encode())
        except httpx.HTTPError as exc:
            raise AdminError(f"nsqd {self.http_url} unreachable: {exc!r}") from exc
        if resp.status_code != 200:
            where = f"{topic}/{'-' if partition is None else partition}/{channel}"
            what = f"{path} {body!r}" if body else path
            raise AdminError(
                f"nsqd {self.http_url} refused {what} for {where}: "
                f"HTTP {resp.status_code} {resp.text[:200]}"
            )


#: the fork's upper bound for ``syncdisk`` (larger values are clamped by nsqlookupd)
MAX_SYNC_EVERY = 4000
#: the fork's upper bound for a topic's ``retention`` (days)
MAX_RETENTION_DAYS = 60


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """What ``/topic/create`` is asked for.

    ``sync_every`` is the fork's ``syncdisk``: nsqd fsyncs the partition's log after that many
    messages (and flushes its write buffer then).  ``1`` (``durable``) means every write is on
    disk before nsqd acknowledges it, so a leader crash (``kill -9``) loses no acknowledged
    write; ``None`` leaves nsqd's ``--sync-every`` default (2500), with which a crash can lose
    the writes acknowledged since the last sync, on every replica (see the README's
    "Durability on the fork").  ``retention_days`` (1..60) overrides nsqd's retention of
    consumed data; ``channel_auto_create=False`` makes SUB to an unknown channel fail until
    ``/channel/create`` made it.
    """

    name: str
    partitions: int = 1
    replicas: int = 1
    ordered: bool = False
    ext: bool = False
    #: several partitions of a plain topic may share a node (ordered topics always may)
    multi_part: bool = False
    sync_every: int | None = None
    retention_days: int | None = None
    channel_auto_create: bool = True

    def __post_init__(self) -> None:
        validate_topic(self.name)
        for what in ("partitions", "replicas", "sync_every", "retention_days"):
            value = getattr(self, what)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{what} must be an int, got {value!r}")
        if not 1 <= self.partitions <= 254:
            raise ConfigError(f"partitions must be 1..254, got {self.partitions}")
        if not 1 <= self.replicas <= 5:
            raise ConfigError(f"replicas must be 1..5, got {self.replicas}")
        if self.sync_every is not None and not 1 <= self.sync_every <= MAX_SYNC_EVERY:
            raise ConfigError(
                f"sync_every must be 1..{MAX_SYNC_EVERY} (1 = fsync every write), "
                f"got {self.sync_every}"
            )
        if self.retention_days is not None and not 1 <= self.retention_days <= MAX_RETENTION_DAYS:
            raise ConfigError(
                f"retention_days must be 1..{MAX_RETENTION_DAYS}, got {self.retention_days}"
            )

    @property
    def durable(self) -> bool:
        """Every acknowledged write is fsynced first (``sync_every == 1``)."""
        return self.sync_every == 1

    @classmethod
    def with_durability(
        cls,
        name: str,
        partitions: int = 1,
        replicas: int = 1,
        ordered: bool = False,
        ext: bool = False,
        multi_part: bool = False,
        *,
        durable: bool = False,
        sync_every: int | None = None,
        retention_days: int | None = None,
        channel_auto_create: bool = True,
    ) -> TopicSpec:
        """The spec, where ``durable=True`` means ``sync_every=1`` (any other ``sync_every``
        with it is a :class:`ConfigError`)."""
        if durable:
            if sync_every not in (None, 1):
                raise ConfigError(f"durable means sync_every=1; got sync_every={sync_every}")
            sync_every = 1
        return cls(
            name,
            partitions,
            replicas,
            ordered,
            ext,
            multi_part,
            sync_every=sync_every,
            retention_days=retention_days,
            channel_auto_create=channel_auto_create,
        )

    def query(self) -> dict[str, str]:
        """The query string of the fork's ``/topic/create``."""
        params = {
            "topic": self.name,
            "partition_num": str(self.partitions),
            "replicator": str(self.replicas),
        }
        if self.ordered:
            params["orderedmulti"] = "true"
        if self.ext:
            params["extend"] = "true"
        if self.multi_part:
            params["multipart"] = "true"
        if self.sync_every is not None:
            params["syncdisk"] = str(self.sync_every)
        if self.retention_days is not None:
            params["retention"] = str(self.retention_days)
        if not self.channel_auto_create:
            params["disable_channel_auto_create"] = "true"
        return params


class LookupdAdmin:
    """Admin requests to an nsqlookupd cluster (``lookupd``: one or more HTTP addresses)."""

    def __init__(self, lookupd: str | Sequence[str], *, timeout: float = 10.0) -> None:
        import httpx

        seeds = [lookupd] if isinstance(lookupd, str) else list(lookupd)
        if not seeds:
            raise ConfigError("LookupdAdmin needs at least one nsqlookupd address")
        normalized = [normalize_lookupd(s) for s in seeds]
        #: bare base URL -> endpoint (a seed's credentials travel as basic auth, never in a URL)
        self._endpoints = {e.url: e for e in map(Endpoint.parse, normalized)}
        self._seeds = list(self._endpoints)
        self._http = httpx.AsyncClient(timeout=timeout, verify=tls_context())
        self.lookup = LookupClient(normalized, http=self._http, timeout=timeout)
        self._leader: str | None = None
        self._vanilla = False

    def __repr__(self) -> str:
        seeds = ", ".join(e.shown for e in self._endpoints.values())
        return f"<LookupdAdmin [{seeds}] leader={self._shown(self._leader)}>"

    def _shown(self, base: str | None) -> str | None:
        endpoint = self._endpoints.get(base) if base is not None else None
        return endpoint.shown if endpoint is not None else base

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.lookup.close()
        await self._http.aclose()

    # -- HTTP -------------------------------------------------------------------------------

    async def _request(
        self, method: str, base: str, path: str, params: dict[str, str] | None = None
    ) -> object:
        import httpx

        endpoint = self._endpoints.get(base)
        auth = endpoint.auth if endpoint is not None else None
        shown = self._shown(base)
        try:
            resp = await self._http.request(
                method,
                f"{base}{path}",
                params=params,
                headers=dict(V1_ACCEPT),
                auth=auth if auth is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as exc:
            # the URL sent holds no credentials, so httpx's text may be shown as it is
            raise LookupdUnavailableError(f"nsqlookupd {shown} unreachable: {exc!r}") from exc
        return unwrap(resp.status_code, resp.headers, resp.content, f"{shown}{path}")

    async def leader(self) -> str:
        """The leader nsqlookupd's HTTP URL (the first seed on vanilla or standalone lookupd)."""
        if self._leader is not None:
            return self._leader
        errors: list[str] = []
        for seed in self._seeds:
            try:
                answer = await self._request("GET", seed, "/listlookup")
            except LookupdUnavailableError as exc:
                errors.append(str(exc))
                continue
            except LookupdError as exc:
                if exc.status != 404:
                    raise
                self._vanilla = True
                self._leader = seed
                return seed
            # leader first; a null answer (standalone fork) leaves the seed
            self._leader = (parse_listlookup(answer) or [seed])[0]
            return self._leader
        raise LookupdUnavailableError("no nsqlookupd answered: " + "; ".join(errors))

    async def post(self, path: str, params: dict[str, str]) -> object:
        """POST an admin request to the leader; :class:`AdminError` with lookupd's message."""
        base = await self.leader()
        try:
            return await self._request("POST", base, path, params)
        except LookupdError as exc:
            message = f"nsqlookupd {path} refused: {exc.message} (HTTP {exc.status})"
            raise AdminError(message) from exc

    # -- topics -----------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replicas: int = 1,
        *,
        ordered: bool = False,
        ext: bool = False,
        multi_part: bool = False,
        sync_every: int | None = None,
        durable: bool = False,
        retention_days: int | None = None,
        channel_auto_create: bool = True,
        wait: bool = True,
        timeout: float = 120.0,  # noqa: ASYNC109 - a deadline for the whole wait
    ) -> PartitionMap | None:
        """Create a topic; with ``wait`` return its ``access=w`` map once every partition has a
        leader. Without ``ordered`` or ``multi_part`` the fork needs nodes >= partitions x
        replicas. ``durable`` is ``sync_every=1`` (see :class:`TopicSpec`). Re-creating with the
        same parameters succeeds; different ones raise :class:`AdminError` (``already
        exist``)."""
        spec = TopicSpec.with_durability(
            name,
            partitions,
            replicas,
            ordered,
            ext,
            multi_part,
            durable=durable,
            sync_every=sync_every,
            retention_days=retention_days,
            channel_auto_create=channel_auto_create,
        )
        await self.leader()
        deadline = time.monotonic() + timeout
        if self._vanilla:
            if spec != TopicSpec(name):
                raise ConfigError(
                    "vanilla nsqlookupd creates plain topics only (no partitions, replicas, "
                    "ordered, ext, sync_every, retention_days or channel_auto_create)"
                )
            await self.post("/topic/create", {"topic": name})
            return None
        await self._post_create(spec, deadline)
        if not wait:
            return None
        return await self.wait_writable(spec, deadline)

    async def _post_create(self, spec: TopicSpec, deadline: float) -> None:
        # right after start-up the coordinator may not know every node yet, so "No node is
        # available" is retried for a while; for longer it means too few nodes
        patience = min(deadline, time.monotonic() + _NODES_PATIENCE)
        while True:
            try:
                await self.post("/topic/create", spec.query())
                return
            except AdminError as exc:
                no_node = "No node is available" in str(exc)
                if not (no_node or "unstable" in str(exc)):
                    raise
                if time.monotonic() > (patience if no_node else deadline):
                    if no_node and not (spec.ordered or spec.multi_part):
                        raise AdminError(
                            f"{exc}; a plain topic needs nodes >= partitions x replicas "
                            f"({spec.partitions} x {spec.replicas}) unless multi-part"
                        ) from exc
                    raise
                log.info("topic/create %s: %s; retrying", spec.name, exc)
            await asyncio.sleep(1.0)

    async def wait_writable(self, spec: TopicSpec, deadline: float) -> PartitionMap:
        """Poll ``access=w`` until every partition of ``spec`` has a leader, nudging the check."""
        last_post = time.monotonic()
        while True:
            pmap = await self.lookup.lookup(spec.name, "w", force=True)
            if len(pmap.partitions) >= spec.partitions:
                return pmap
            now = time.monotonic()
            if now > deadline:
                raise AdminError(
                    f"topic {spec.name!r} was created but only {len(pmap.partitions)} of "
                    f"{spec.partitions} partitions became writable in time"
                )
            if now - last_post > _REPOST_INTERVAL:
                await self._post_create(spec, deadline)
                last_post = now
            await asyncio.sleep(0.2)

    async def wait_stable(self, timeout: float = 240.0) -> None:  # noqa: ASYNC109
        """Wait until ``/cluster/stats`` says ``stable`` (lookupd refuses moves otherwise)."""
        base = await self.leader()
        deadline = time.monotonic() + timeout
        while True:
            stats = await self._request("GET", base, "/cluster/stats")
            if isinstance(stats, dict) and stats.get("stable") is True:
                return
            if time.monotonic() > deadline:
                raise AdminError(f"the cluster did not become stable within {timeout:.0f}s")
            await asyncio.sleep(1.0)

    async def move_leader(
        self,
        topic: str,
        partition: int,
        *,
        timeout: float = 240.0,  # noqa: ASYNC109 - a deadline for the whole move
    ) -> NodeInfo:
        """Move ``topic``/``partition``'s leadership to another in-sync replica and return the
        new leader once ``access=w`` names it (lookupd picks it among the replicas)."""
        deadline = time.monotonic() + timeout
        await self.wait_stable(timeout)
        pmap = await self.lookup.lookup(topic, "w", force=True)
        old = pmap.leader(partition)
        if old is None:
            raise AdminError(f"{topic}/{partition} has no leader to move away from")
        readers = await self.lookup.lookup(topic, "r", force=True)
        others = [n for n in readers.producers if n.distributed_id != old.distributed_id]
        if not others:
            raise AdminError(f"{topic}/{partition}: no other node to move the leader to")
        await self.post(
            "/topic/partition/move",
            {
                "topic": topic,
                "partition": str(partition),
                "move_leader": "true",
                "move_from": old.distributed_id,
                "move_to": others[0].distributed_id,
            },
        )
        while time.monotonic() < deadline:
            new = (await self.lookup.lookup(topic, "w", force=True)).leader(partition)
            if new is not None and new.distributed_id != old.distributed_id:
                log.info("moved the leader of %s/%d: %s -> %s", topic, partition, old, new)
                return new
            await asyncio.sleep(0.2)
        raise AdminError(f"the leader of {topic}/{partition} is still {old.address}")

    # -- channels (nsqd, on each partition's leader) -----------------------------------------

    async def create_channel(
        self,
        topic: str,
        channel: str,
        *,
        partitions: Sequence[int] | None = None,
        rewind: bool = False,
    ) -> list[int]:
        """Create ``channel`` on the leader of each partition (all, or ``partitions``) with
        nsqd's ``POST /channel/create``; with ``rewind``, move it to the partition's first
        retained message (``/channel/setoffset virtual_queue:0``; nsqd refuses that with
        ``commit log end of file`` on a partition that never had a message, which is then
        already at its start). Returns the partitions done.

        On the fork a channel made by a consumer's first SUB starts at the partition's end;
        creating and rewinding it first lets the consumer see what the topic already holds.
        """
        validate_channel(channel)
        pmap = await self.lookup.lookup(topic, "w", force=True)
        if not pmap.fork:
            raise UnsupportedByServerError("channel create/rewind per partition is the fork's")
        done: list[int] = []
        for partition, node in sorted(pmap.partitions.items()):
            if partitions is not None and partition not in partitions:
                continue
            nsqd = NsqdAdmin(node.http_url, http=self._http)
            await nsqd.create_channel(topic, channel, partition)
            if rewind:
                try:
                    await nsqd.set_offset(topic, channel, partition, seek_position(offset=0))
                except AdminError as exc:
                    # a partition that never had a message: its start is its end already
                    if "commit log end of file" not in str(exc):
                        raise
            done.append(partition)
        return done
