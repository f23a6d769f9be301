"""Admin requests to an nsqlookupd cluster (:class:`LookupdAdmin`): create, list and delete
topics, move a partition's leader, and reach the nsqd that holds each partition for the channel
calls of :class:`~nsq_ha.admin.nsqd.NsqdAdmin`.

The fork creates topics only here: ``POST /topic/create`` on the *leader* nsqlookupd (the first
node ``/listlookup`` names), after which the topic becomes writable once lookupd's periodic
topic check has placed its partitions (seconds; re-posting the identical request triggers the
check again and is harmless). Vanilla nsqlookupd (``/listlookup`` answers 404) has a
``/topic/create?topic=T`` too (no partitions, no replicas).

Every public call has one overall deadline, the client's ``timeout`` or the call's own
``timeout=`` where it waits on purpose (:meth:`LookupdAdmin.create_topic`,
:meth:`~LookupdAdmin.move_leader`, :meth:`~LookupdAdmin.wait_stable`), counted from the call's
start and covering connect, every request and every read of a body, however slowly a server
trickles: past it, :class:`~nsq_ha.errors.NsqTimeoutError`. Answers are read up to
``max_answer_bytes`` (:class:`~nsq_ha.errors.RemoteProtocolError` past it), as
:class:`~nsq_ha.lookup.LookupClient` reads its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from nsq_ha.durations import seconds
from nsq_ha.errors import (
    ConfigError,
    LookupdUnavailableError,
    NsqError,
    UnsupportedByServerError,
)
from nsq_ha.lookup import LookupClient
from nsq_ha.lookup.client import DEFAULT_MAX_ANSWER_BYTES
from nsq_ha.lookup.http import ADMIN_TIMEOUT, Endpoint, normalize_lookupd, tls_context
from nsq_ha.lookup.wire import (
    V1_ACCEPT,
    LookupdError,
    NodeInfo,
    PartitionMap,
    parse_listlookup,
    unwrap,
)
from nsq_ha.protocol.names import validate_channel

from .answers import fetch, within
from .exists import ALREADY_EXISTS, TopicExistsError
from .expansion import expand_topic
from .nsqd import AdminError, NsqdAdmin, PartitionEmptyError, seek_position
from .spec import TopicSpec

__all__ = [
    "CREATE_TOPIC_TIMEOUT",
    "EXPAND_TOPIC_TIMEOUT",
    "MOVE_LEADER_TIMEOUT",
    "WAIT_STABLE_TIMEOUT",
    "LookupdAdmin",
]

log = logging.getLogger(__name__)

#: :meth:`LookupdAdmin.create_topic`'s ``timeout`` (seconds), the wait until writable included
CREATE_TOPIC_TIMEOUT = 120.0
#: :meth:`LookupdAdmin.expand_topic`'s ``timeout`` (seconds), the wait until writable included
EXPAND_TOPIC_TIMEOUT = 120.0
#: :meth:`LookupdAdmin.wait_stable`'s ``timeout`` (seconds)
WAIT_STABLE_TIMEOUT = 240.0
#: :meth:`LookupdAdmin.move_leader`'s ``timeout`` (seconds), the wait for the new leader included
MOVE_LEADER_TIMEOUT = 240.0
#: how long to wait between identical ``/topic/create`` requests that nudge the topic check
_REPOST_INTERVAL = 6.0
#: how long "No node is available" counts as start-up (nodes not yet registered)
_NODES_PATIENCE = 20.0
#: how many topics' lookups :meth:`LookupdAdmin.move_leader` reads to learn node ids
_MAX_TOPICS_ASKED = 64
#: the largest ``max_answer_bytes`` allowed (as for :class:`~nsq_ha.lookup.LookupClient`)
_MAX_ANSWER_BYTES_LIMIT = 64 << 20


class LookupdAdmin:
    """Admin requests to an nsqlookupd cluster (``lookupd``: one or more HTTP addresses).

    ``timeout``: the deadline of each call that does not take its own, in seconds.
    ``max_answer_bytes``: the largest answer read from an nsqlookupd (512 KiB by default, at
    most 64 MiB; ``/topics`` spends some 40 bytes per topic). Bad values are a
    :class:`ConfigError` before anything is created.
    """

    def __init__(
        self,
        lookupd: str | Sequence[str],
        *,
        timeout: float = ADMIN_TIMEOUT,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        import httpx

        #: the deadline of each call that takes no ``timeout=`` of its own, in seconds
        self.timeout = seconds(timeout, "timeout")
        if (
            isinstance(max_answer_bytes, bool)
            or not isinstance(max_answer_bytes, int)
            or not 1 <= max_answer_bytes <= _MAX_ANSWER_BYTES_LIMIT
        ):
            raise ConfigError(
                f"max_answer_bytes must be an int in 1..{_MAX_ANSWER_BYTES_LIMIT}, "
                f"got {max_answer_bytes!r}"
            )
        self.max_answer_bytes = max_answer_bytes
        seeds = [lookupd] if isinstance(lookupd, str) else list(lookupd)
        if not seeds:
            raise ConfigError("LookupdAdmin needs at least one nsqlookupd address")
        normalized = [normalize_lookupd(s) for s in seeds]
        #: bare base URL -> endpoint (a seed's credentials travel as basic auth, never in a URL)
        self._endpoints = {e.url: e for e in map(Endpoint.parse, normalized)}
        self._seeds = list(self._endpoints)
        self._http = httpx.AsyncClient(timeout=self.timeout, verify=tls_context())
        self.lookup = LookupClient(
            normalized, http=self._http, timeout=self.timeout, max_answer_bytes=max_answer_bytes
        )
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

    # -- deadlines and HTTP -----------------------------------------------------------------

    def _within(
        self, what: str, limit: float | None = None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """One deadline for the call ``what``: ``limit`` seconds (the client's ``timeout``)."""
        limit = self.timeout if limit is None else limit
        seeds = ", ".join(e.shown for e in self._endpoints.values())
        return within(
            limit,
            f"LookupdAdmin.{what} did not finish within {limit:g} s (nsqlookupd {seeds}): raise "
            "the timeout (timeout=, nsq-ha --timeout), or check that the address names a "
            "running nsqlookupd",
        )

    async def _request(
        self, method: str, base: str, path: str, params: dict[str, str] | None = None
    ) -> object:
        import httpx

        endpoint = self._endpoints.get(base)
        shown = self._shown(base)
        try:
            answer = await fetch(
                self._http,
                method,
                f"{base}{path}",
                where=f"nsqlookupd {shown}{path}",
                max_bytes=self.max_answer_bytes,
                limit_name="max_answer_bytes",
                params=params,
                headers=V1_ACCEPT,
                auth=endpoint.auth if endpoint is not None else None,
            )
        except httpx.HTTPError as exc:
            # the URL sent holds no credentials, so httpx's text may be shown as it is
            raise LookupdUnavailableError(f"nsqlookupd {shown} unreachable: {exc!r}") from exc
        return unwrap(answer.status, answer.headers, answer.body, f"{shown}{path}")

    async def leader(self) -> str:
        """The leader nsqlookupd's HTTP URL (the first seed on vanilla or standalone lookupd)."""
        if self._leader is not None:
            return self._leader
        async with self._within("leader"):
            return await self._find_leader()

    async def _find_leader(self) -> str:
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
        async with self._within(f"post({path!r})"):
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
        partitions: int | None = None,
        replicas: int | None = None,
        *,
        ordered: bool | None = None,
        ext: bool | None = None,
        multi_part: bool | None = None,
        sync_every: int | None = None,
        durable: bool = False,
        retention_days: int | None = None,
        channel_auto_create: bool | None = None,
        wait: bool = True,
        timeout: float = CREATE_TOPIC_TIMEOUT,  # noqa: ASYNC109 - a deadline for the whole wait
    ) -> PartitionMap | None:
        """Create a topic; with ``wait`` return its ``access=w`` map once every partition has a
        leader. Without ``ordered`` or ``multi_part`` the fork needs nodes >= partitions x
        replicas. ``durable`` is ``sync_every=1`` (see :class:`TopicSpec`, whose defaults an
        option left at ``None`` takes). Re-creating with the same parameters succeeds; different
        ones raise :class:`TopicExistsError` (an :class:`AdminError` naming the existing
        topic's partitions, replicas and flags). ``timeout`` bounds the whole call, from its
        start."""
        timeout = seconds(timeout, "timeout")
        deadline = time.monotonic() + timeout
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
        async with self._within(f"create_topic({name!r})", timeout):
            await self.leader()
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
            return await self._wait_writable(spec, deadline)

    async def expand_topic(
        self,
        name: str,
        partitions: int,
        *,
        wait: bool = True,
        timeout: float = EXPAND_TOPIC_TIMEOUT,  # noqa: ASYNC109 - a deadline for the whole wait
    ) -> PartitionMap | None:
        """Grow fork topic ``name`` to ``partitions`` partitions; with ``wait`` return its
        ``access=w`` map once every partition has a leader (see :mod:`nsq_ha.admin.expansion`
        for what the fork does meanwhile). Asking for the count it has changes nothing;
        fewer raises :class:`~nsq_ha.admin.expansion.PartitionsNotReducibleError` before
        anything is sent, an unknown topic :class:`AdminError`, vanilla NSQ
        :class:`~nsq_ha.errors.UnsupportedByServerError`. ``timeout`` bounds the whole call."""
        timeout = seconds(timeout, "timeout")
        deadline = time.monotonic() + timeout
        async with self._within(f"expand_topic({name!r}, {partitions!r})", timeout):
            return await expand_topic(self, name, partitions, wait=wait, deadline=deadline)

    async def _post_create(self, spec: TopicSpec, deadline: float) -> None:
        # right after start-up the coordinator may not know every node yet, so "No node is
        # available" is retried for a while; for longer it means too few nodes
        patience = min(deadline, time.monotonic() + _NODES_PATIENCE)
        checked = False
        while True:
            try:
                await self.post("/topic/create", spec.query())
                return
            except AdminError as exc:
                no_node = "No node is available" in str(exc)
                if ALREADY_EXISTS in str(exc) or (no_node and not checked):
                    # lookupd checks the node count before it compares with an existing topic
                    checked = True
                    exists = await self._exists(spec, exc, capacity=no_node)
                    if exists is not None:
                        raise exists from exc
                if not (no_node or "unstable" in str(exc)):
                    raise
                # the refusal itself says more than a timeout would: raise it before the end
                if time.monotonic() + 1.0 > (patience if no_node else deadline):
                    if no_node and not (spec.ordered or spec.multi_part):
                        raise AdminError(
                            f"{exc}; a plain topic needs nodes >= partitions x replicas "
                            f"({spec.partitions} x {spec.replicas}) unless multi-part"
                        ) from exc
                    raise
                log.info("topic/create %s: %s; retrying", spec.name, exc)
            await asyncio.sleep(1.0)

    async def _exists(
        self, spec: TopicSpec, refusal: AdminError, *, capacity: bool = False
    ) -> AdminError | None:
        """:class:`TopicExistsError` naming the topic's partitions, replicas and flags (its
        lookup) when ``spec.name`` exists with others; for ``already exist`` the refusal itself
        when the lookup cannot say, for a ``capacity`` refusal None (it stands)."""
        try:
            meta = (await self.lookup.lookup(spec.name, "r", force=True)).meta
        except NsqError:
            return None if capacity else refusal
        if meta is None or meta.partition_num < 1:
            return None if capacity else refusal
        exists = TopicExistsError(spec, meta)
        return None if capacity and exists.same_as_shown else exists

    async def wait_writable(self, spec: TopicSpec, deadline: float) -> PartitionMap:
        """Poll ``access=w`` until every partition of ``spec`` has a leader, nudging the check,
        until ``deadline`` (a :func:`time.monotonic` time)."""
        async with self._within("wait_writable", max(0.0, deadline - time.monotonic())):
            return await self._wait_writable(spec, deadline)

    async def _wait_writable(self, spec: TopicSpec, deadline: float) -> PartitionMap:
        last_post = time.monotonic()
        while True:
            pmap = await self.lookup.lookup(spec.name, "w", force=True)
            if len(pmap.partitions) >= spec.partitions:
                return pmap
            now = time.monotonic()
            if now + 0.2 > deadline:
                raise AdminError(
                    f"topic {spec.name!r} was created but only {len(pmap.partitions)} of "
                    f"{spec.partitions} partitions became writable in time"
                )
            if now - last_post > _REPOST_INTERVAL:
                await self._post_create(spec, deadline)
                last_post = now
            await asyncio.sleep(0.2)

    async def wait_stable(self, timeout: float = WAIT_STABLE_TIMEOUT) -> None:  # noqa: ASYNC109
        """Wait until ``/cluster/stats`` says ``stable`` (lookupd refuses moves otherwise), at
        most ``timeout`` seconds."""
        timeout = seconds(timeout, "timeout")
        async with self._within("wait_stable", timeout):
            await self._wait_stable(time.monotonic() + timeout)

    async def _wait_stable(self, deadline: float) -> None:
        base = await self.leader()
        started = time.monotonic()
        first = True
        while True:
            stats = await self._request("GET", base, "/cluster/stats")
            if isinstance(stats, dict) and stats.get("stable") is True:
                return
            if first:
                first = False
                log.info("waiting for lookupd to deem the cluster stable (checked once a minute)")
            if time.monotonic() + 1.0 > deadline:
                waited = time.monotonic() - started
                raise AdminError(f"the cluster did not become stable within {waited:.0f}s")
            await asyncio.sleep(1.0)

    async def move_leader(
        self,
        topic: str,
        partition: int,
        *,
        to: str | None = None,
        timeout: float = MOVE_LEADER_TIMEOUT,  # noqa: ASYNC109 - a deadline for the whole move
    ) -> NodeInfo:
        """Move ``topic``/``partition``'s leadership to another in-sync replica and return the
        new leader once ``access=w`` names it. ``to`` asks for a node (its TCP ``host:port``,
        HTTP URL or ``host:http_port``, or distributed id); lookupd may still pick another
        replica, so compare the result. Vanilla has no leaders: :class:`UnsupportedByServerError`.
        ``timeout`` bounds the whole call, from its start.
        """
        timeout = seconds(timeout, "timeout")
        async with self._within(f"move_leader({topic!r}, {partition})", timeout):
            return await self._move_leader(topic, partition, to, time.monotonic() + timeout)

    async def _move_leader(
        self, topic: str, partition: int, to: str | None, deadline: float
    ) -> NodeInfo:
        await self.leader()
        if self._vanilla:
            raise UnsupportedByServerError(
                "vanilla nsqd has no partition leaders to move (every nsqd holds its own copy)"
            )
        pmap = await self.lookup.lookup(topic, "w", force=True)
        old = pmap.leader(partition)
        if old is None:
            raise AdminError(f"{topic}/{partition} has no leader to move away from")
        nodes = await self._known_nodes([topic])
        if to is not None or not [n for n in nodes if n.distributed_id != old.distributed_id]:
            nodes = await self._known_nodes(await self.topics())  # the ids of more nodes
        others = [n.distributed_id for n in nodes if n.distributed_id != old.distributed_id]
        if to is not None:
            others = [_target_id(to, nodes)]
            if others[0] == old.distributed_id:
                raise AdminError(f"{to} already leads {topic}/{partition}")
        if not others:
            raise AdminError(
                f"{topic}/{partition}: no other node known to move the leader to (the lookups "
                "name no other nsqd): pass its distributed id as to= (nsq-ha leader move --to)"
            )
        await self._wait_stable(deadline)
        await self.post(
            "/topic/partition/move",
            {
                "topic": topic,
                "partition": str(partition),
                "move_leader": "true",
                "move_from": old.distributed_id,
                "move_to": others[0],
            },
        )
        while time.monotonic() < deadline:
            new = (await self.lookup.lookup(topic, "w", force=True)).leader(partition)
            if new is not None and new.distributed_id != old.distributed_id:
                log.info("moved the leader of %s/%d: %s -> %s", topic, partition, old, new)
                return new
            await asyncio.sleep(0.2)
        raise AdminError(f"the leader of {topic}/{partition} is still {old.address}")

    async def _known_nodes(self, topics: Sequence[str]) -> list[NodeInfo]:
        """The fork's nodes the lookups of ``topics`` name, with their distributed ids
        (``/nodes`` has none): the leaders of their partitions."""
        maps = await asyncio.gather(
            *(self.lookup.lookup(t, "r", force=True) for t in topics[:_MAX_TOPICS_ASKED]),
            return_exceptions=True,
        )
        found: dict[str, NodeInfo] = {}
        for pmap in maps:
            if isinstance(pmap, PartitionMap):
                for node in (*pmap.partitions.values(), *pmap.producers):
                    if node.distributed_id:
                        found.setdefault(node.distributed_id, node)
        return list(found.values())

    @property
    def vanilla(self) -> bool | None:
        """True when the lookupd is vanilla NSQ's (None before :meth:`leader` asked)."""
        return None if self._leader is None else self._vanilla

    async def topics(self) -> list[str]:
        """Every topic name nsqlookupd lists (``GET /topics``: the leader's on the fork, the
        union over the seeds on vanilla, whose nsqlookupds share nothing)."""
        async with self._within("topics"):
            leader = await self.leader()
            names: set[str] = set()
            for base in self._seeds if self._vanilla else [leader]:
                try:
                    answer = await self._request("GET", base, "/topics")
                except LookupdError as exc:
                    raise AdminError(f"nsqlookupd /topics refused: {exc.message}") from exc
                listed = answer.get("topics") if isinstance(answer, dict) else None
                names.update(t for t in listed or () if isinstance(t, str))
            return sorted(names)

    async def nodes(self) -> list[NodeInfo]:
        """Every nsqd registered with nsqlookupd (``GET /nodes``: the leader's on the fork,
        the union over the seeds on vanilla), without distributed ids (``/nodes`` has none)."""
        async with self._within("nodes"):
            leader = await self.leader()
            found: dict[str, NodeInfo] = {}
            for base in self._seeds if self._vanilla else [leader]:
                try:
                    answer = await self._request("GET", base, "/nodes")
                except LookupdError as exc:
                    raise AdminError(f"nsqlookupd /nodes refused: {exc.message}") from exc
                listed = answer.get("producers") if isinstance(answer, dict) else None
                for raw in listed if isinstance(listed, list) else ():
                    node = NodeInfo.from_wire(raw)
                    found.setdefault(node.http_url, node)
            return list(found.values())

    async def delete_topic(self, topic: str) -> list[str]:
        """Delete ``topic`` with its channels and data; returns what was asked to delete it.

        The fork: nsqlookupd's ``/topic/delete?partition=**`` (every partition). Vanilla: the
        ``/topic/delete`` of every nsqd producing it, then each nsqlookupd's (which forgets the
        registrations)."""
        async with self._within(f"delete_topic({topic!r})"):
            await self.leader()
            if not self._vanilla:
                await self.post("/topic/delete", {"topic": topic, "partition": "**"})
                return [self._shown(self._leader) or ""]
            done: list[str] = []
            pmap = await self.lookup.lookup(topic, "r", force=True)
            for node in pmap.producers:
                await NsqdAdmin(node.http_url, http=self._http, timeout=self.timeout).delete_topic(
                    topic
                )
                done.append(node.http_url)
            for base in self._seeds:
                try:
                    await self._request("POST", base, "/topic/delete", {"topic": topic})
                except LookupdError as exc:
                    raise AdminError(f"nsqlookupd /topic/delete refused: {exc.message}") from exc
                done.append(self._shown(base) or base)
            return done

    async def channel_targets(self, topic: str) -> list[tuple[int | None, NodeInfo]]:
        """Where ``topic``'s channel calls go, as (partition, nsqd) pairs: on the fork each
        partition's leader (``access=w``, completed by ``access=r`` for a partition that has
        no writer listed), on vanilla every nsqd producing it (partition None). A topic
        nsqlookupd does not know is an :class:`AdminError`."""
        async with self._within(f"channel_targets({topic!r})"):
            readers = await self.lookup.lookup(topic, "r", force=True)
            if not readers.fork:
                if not readers.producers:
                    raise AdminError(f"topic {topic!r} has no nsqd producing it")
                return [(None, node) for node in readers.producers]
            found = dict(readers.partitions)
            found.update((await self.lookup.lookup(topic, "w", force=True)).partitions)
            if not found:
                raise AdminError(f"topic {topic!r} does not exist (or has no partition leader)")
            return sorted(found.items())

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
        ``commit log end of file``, :class:`PartitionEmptyError`, on a partition that never had a
        message, which is then already at its start). Returns the partitions done.

        On the fork a channel made by a consumer's first SUB starts at the partition's end;
        creating and rewinding it first lets the consumer see what the topic already holds.
        """
        validate_channel(channel)
        async with self._within(f"create_channel({topic!r}, {channel!r})"):
            pmap = await self.lookup.lookup(topic, "w", force=True)
            if not pmap.fork:
                raise UnsupportedByServerError("channel create/rewind per partition is the fork's")
            done: list[int] = []
            for partition, node in sorted(pmap.partitions.items()):
                if partitions is not None and partition not in partitions:
                    continue
                nsqd = NsqdAdmin(node.http_url, http=self._http, timeout=self.timeout)
                await nsqd.create_channel(topic, channel, partition)
                if rewind:
                    # a partition that never had a message is at its start already
                    with contextlib.suppress(PartitionEmptyError):
                        await nsqd.set_offset(topic, channel, partition, seek_position(offset=0))
                done.append(partition)
            return done


def _target_id(to: str, nodes: Sequence[NodeInfo]) -> str:
    """The distributed id ``--to`` names: given as such (``ip:rpc_port:tcp_port:worker``), or
    the TCP ``host:port``, ``host:http_port`` or HTTP URL of a node the lookups listed."""
    if to.count(":") >= 3 and "/" not in to:
        return to
    wanted = to.removeprefix("http://").removeprefix("https://").rstrip("/")
    for node in nodes:
        http = node.http_url.removeprefix("http://")
        if wanted in (node.address, http) and node.distributed_id:
            return node.distributed_id
    known = ", ".join(f"{n.address} ({n.distributed_id})" for n in nodes) or "none"
    raise AdminError(
        f"no nsqd {to!r} among the topic's nodes ({known}); give its distributed id "
        "(ip:rpc_port:tcp_port:worker_id)"
    )
