"""The embedded nsqlookupd: the fork's lookupd HTTP API in cluster mode (PROTOCOL.md §5.1-5.4).

Read endpoints: ``/ping`` (plain), ``/info``, ``/lookup``, ``/listlookup``, ``/topics``,
``/channels``, ``/nodes`` (negotiated), ``/cluster/stats`` (v1).  Admin endpoints, all v1 with
their parameters in the query string: ``/topic/create`` (POST or PUT),
``/topic/partition/expand``, ``/topic/delete``,
``/topic/partition/move``, ``/channel/create``, ``/channel/delete``, ``/topic/tombstone``,
``/disable/write`` and ``/loglevel/set``.  Parameter checks, their order and the error texts are
those of ``nsqlookupd/http.go`` (youzan/nsq b16e68eb); lookup answers are assembled by
:meth:`DevCluster.lookup_answer` and shaped here as Go serialises them (map keys sorted, so
``channels, meta, partitions, producers`` and the ``meta`` keys alphabetically; node objects in
struct order).

Where the emulation deliberately differs from the real lookupd:

* there is one lookupd and it is always the leader (no ``E_FAILED_ON_NOT_LEADER``), the cluster
  is always ``"stable": true``, and a topic is usable as soon as it is created (no topic check
  delay);
* ``/listlookup`` reports the HTTP port as ``TcpPort`` and ``RpcPort`` too (there is no lookupd
  TCP or RPC port here);
* ``/topic/partition/move`` with ``move_leader=true`` makes ``move_to`` the leader (the real one
  picks from the ISR); without ``move_to`` the cluster picks a replica.  Without
  ``move_leader`` the replica ``move_from`` is replaced by ``move_to`` at once;
* a node's registrations (``/nodes``, ``/topics``) are the partitions it leads, on every live
  node; ``/topics?metaInfo=true`` leaves ``registered_channels`` null as the real handler does;
* tombstones (``/topic/tombstone``) last until restored (no ``--tombstone-lifetime``) and apply
  to whatever the node leads, now or later;
* unsupported admin paths (``/topic/partition/expand``, ``/topic/meta/update``, ``/cluster/*``
  writes, ``/debug``) answer 404 ``NOT_FOUND``.

Faults come from :attr:`DevCluster.lookupd_faults` on every request (``/ping`` included): the
``delay`` is slept first; ``fail_status`` answers that status with ``{"message":
"INJECTED_FAULT"}`` (counting down ``fail_count``); ``stale`` serves each ``/lookup`` from the first
answer computed after the fault was set.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nsq_ha.protocol.names import is_valid_name

from .http import (
    JSON_TYPE,
    NSQ_CONTENT_TYPE,
    ApiError,
    Handler,
    Request,
    Response,
    Route,
    dispatch,
    go_atoi,
)
from .model import FORK_VERSION, DevNode, DevPartition, DevTopic, EventKind, NodeState, ServerError
from .view import ClusterView

__all__ = ["LookupdApi", "make_lookupd_handler"]

#: the body of an injected failure
FAULT_BODY = b'{"message":"INJECTED_FAULT"}'
_GET = frozenset({"GET"})
_POST = frozenset({"POST"})
_MAX_PARTITION_NUM = 255
_OLD_VERSION_PID = -11
_MAX_LOAD_FACTOR = 10000


def make_lookupd_handler(view: ClusterView) -> Handler:
    """The HTTP handler of the cluster's lookupd (its state lives in a :class:`LookupdApi`,
    reachable as the handler's ``__self__``)."""
    return LookupdApi(view).handle


def _sorted_map(mapping: dict[str, Any]) -> dict[str, Any]:
    """A Go map as ``json.Marshal`` writes it: keys in byte order."""
    return {key: mapping[key] for key in sorted(mapping)}


class LookupdApi:
    """The lookupd endpoints and the lookupd-only state: tombstones and the write switch."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        #: ``(topic, "<broadcast_address>:<http_port>")`` hidden from ``access=w`` lookups
        self.tombstones: set[tuple[str, str]] = set()
        #: ``/disable/write`` state: ``""`` (writes allowed), ``"all"`` or ``"ordered"``
        self.write_disabled = ""
        self.log_level = 0
        self.routes: dict[str, Route] = {
            "/ping": Route(_GET, "plain", lambda _request: "OK"),
            "/info": Route(_GET, "negotiate", self.info),
            "/lookup": Route(_GET, "negotiate", self.lookup),
            "/listlookup": Route(_GET, "negotiate", self.listlookup),
            "/topics": Route(_GET, "negotiate", self.topics),
            "/channels": Route(_GET, "negotiate", self.channels),
            "/nodes": Route(_GET, "negotiate", self.nodes),
            "/cluster/stats": Route(_GET, "v1", self.cluster_stats),
            "/topic/create": Route(frozenset({"POST", "PUT"}), "v1", self.topic_create),
            "/topic/delete": Route(_POST, "v1", self.topic_delete),
            "/topic/partition/move": Route(_POST, "v1", self.partition_move),
            "/topic/partition/expand": Route(_POST, "v1", self.partition_expand),
            "/channel/create": Route(_POST, "v1", self.channel_create),
            "/channel/delete": Route(_POST, "v1", self.channel_delete),
            "/topic/tombstone": Route(_POST, "v1", self.topic_tombstone),
            "/disable/write": Route(_POST, "v1", self.disable_write),
            "/loglevel/set": Route(_POST, "v1", self.loglevel_set),
        }

    def __repr__(self) -> str:
        return (
            f"<LookupdApi http://{self.view.host}:{self.view.lookupd_port} "
            f"tombstones={len(self.tombstones)} write_disabled={self.write_disabled or 'no'}>"
        )

    async def handle(self, request: Request) -> Response:
        """Answer one request (faults first)."""
        faults = self.view.lookupd_faults
        if faults.delay > 0:
            await asyncio.sleep(faults.delay)
        injected = self._injected_failure(request)
        if injected is not None:
            return injected
        return dispatch(self.routes, request)

    def _injected_failure(self, request: Request) -> Response | None:
        faults = self.view.lookupd_faults
        status = faults.fail_status
        if status is None:
            return None
        if faults.fail_count is not None:
            if faults.fail_count <= 0:
                faults.fail_status = faults.fail_count = None
                return None
            faults.fail_count -= 1
            if faults.fail_count == 0:
                faults.fail_status = faults.fail_count = None
        self.view.record(EventKind.LOOKUPD_FAULT_HIT, path=request.path, status=status)
        return Response(status, FAULT_BODY, [("Content-Type", JSON_TYPE), NSQ_CONTENT_TYPE])

    # -- read endpoints ---------------------------------------------------------------------

    def info(self, request: Request) -> object:
        """``{"version", "ha_support"}``."""
        return {"version": FORK_VERSION, "ha_support": True}

    def lookup(self, request: Request) -> object:
        """``/lookup`` (§5.2)."""
        query = request.query
        topic = query.get("topic", "")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        partition = query.get("partition") or "*"
        access = query.get("access") or "r"
        if access not in ("r", "w"):
            raise ApiError(400, "INVALID_ACCESS_MODE")
        answer = self._lookup_answer(topic, access, partition)
        want_meta = bool(query.get("metainfo"))
        lists_null = False
        if access == "w":
            if self.write_disabled == "all":
                lists_null = True
            elif self.write_disabled == "ordered":
                want_meta = True
                lists_null = bool(answer["meta"]["ordered"])
        result: dict[str, Any] = {"channels": answer["channels"]}
        if want_meta:
            result["meta"] = _sorted_map(answer["meta"])
        partitions: dict[str, Any] = answer["partitions"]
        producers: list[dict[str, Any]] = answer["producers"]
        if access == "w" and not lists_null:
            partitions, producers = self._without_tombstoned(topic, partitions)
        result["partitions"] = None if lists_null else _sorted_map(partitions)
        result["producers"] = None if lists_null else producers
        return result

    def _lookup_answer(self, topic: str, access: str, partition: str) -> dict[str, Any]:
        """The cluster's answer (always with ``meta``), or the stale copy when frozen."""
        stale = self.view.lookupd_faults.stale
        key = (topic, access, partition)
        if stale is not None and key in stale:
            cached = stale[key]
        else:
            try:
                cached = self.view.lookup_answer(
                    topic, access=access, partition=partition, metainfo=True
                )
            except ServerError as exc:
                cached = exc
            if stale is not None:
                stale[key] = cached
        if isinstance(cached, ServerError):
            raise ApiError(404, cached.code)
        answer: dict[str, Any] = cached
        return answer

    def _without_tombstoned(
        self, topic: str, partitions: dict[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        kept: dict[str, Any] = {}
        producers: list[dict[str, Any]] = []
        for number, node in partitions.items():
            if (topic, f"{node['broadcast_address']}:{node['http_port']}") in self.tombstones:
                continue
            kept[number] = node
            if node not in producers:
                producers.append(node)
        return kept, producers

    def listlookup(self, request: Request) -> object:
        """The one lookupd, as leader and only member."""
        view = self.view
        port = str(view.lookupd_port)
        node = {
            "ID": f"{view.host}:{port}:{port}:nsqlookup",
            "NodeIP": view.host,
            "TcpPort": port,
            "HttpPort": port,
            "RpcPort": port,
            "Epoch": 0,
        }
        return {"lookupdleader": node, "lookupdnodes": [dict(node)]}

    def topics(self, request: Request) -> object:
        """``{"topics": [...]}``, with ``meta_info`` for ``metaInfo=true``."""
        names = sorted(self.view.topics)
        if request.query.get("metaInfo") != "true":
            return {"topics": names}
        infos = [
            {
                "topic_name": name,
                "extend_support": topic.ext,
                "ordered": topic.ordered,
                "multi_part": topic.multi_part,
                "disable_channel_auto_create": topic.disable_channel_auto_create,
                # the real handler never fills this field in
                "registered_channels": None,
            }
            for name, topic in ((n, self.view.topics[n]) for n in names)
        ]
        return {"meta_info": infos or None, "topics": names}

    def channels(self, request: Request) -> object:
        """``{"channels": [...]}`` of a topic (one partition or all)."""
        name = request.query.get("topic", "")
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        partition = request.query.get("partition") or "*"
        topic = self.view.topics.get(name)
        if topic is None:
            return {"channels": []}
        numbers = [p.number for p in topic.partitions if partition in ("*", str(p.number))]
        return {"channels": topic.channel_names(numbers)}

    def nodes(self, request: Request) -> object:
        """Every live node with the topic partitions it leads (its registrations)."""
        producers = []
        for node in self.view.nodes:
            if node.state == NodeState.STOPPED:
                continue
            led: dict[str, list[str]] = {}
            for topic in self.view.topics.values():
                for part in topic.partitions:
                    if part.led_by(node):
                        led.setdefault(topic.name, []).append(str(part.number))
            names = sorted(led)
            address = f"{node.host}:{node.http_port}"
            obj = node.node_object()
            producers.append(
                {
                    "remote_address": obj["remote_address"],
                    "hostname": obj["hostname"],
                    "broadcast_address": obj["broadcast_address"],
                    "tcp_port": node.tcp_port,
                    "http_port": node.http_port,
                    "version": FORK_VERSION,
                    "tombstones": [(name, address) in self.tombstones for name in names],
                    "topics": names,
                    "partitions": {name: led[name] for name in names},
                }
            )
        return {"producers": producers}

    def cluster_stats(self, request: Request) -> object:
        """Always stable; node load factors 0."""
        stats = [
            {
                "hostname": node.node_object()["hostname"],
                "broadcast_address": node.host,
                "tcp_port": node.tcp_port,
                "http_port": node.http_port,
                "leader_load_factor": 0,
                "node_load_factor": 0,
            }
            for node in self.view.nodes
            if node.state != NodeState.STOPPED
        ]
        return {"stable": True, "node_stat_list": stats, "topn_topics": []}

    # -- admin endpoints --------------------------------------------------------------------

    def topic_create(self, request: Request) -> object:
        """``/topic/create``: checks as nsqlookupd, then :meth:`DevCluster.create_topic`."""
        query = request.query
        name = query.get("topic", "")
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        partitions = _ranged(query, "partition_num", 1, _MAX_PARTITION_NUM, "TOPIC_PARTITION_NUM")
        replicas = _ranged(query, "replicator", 1, 5, "TOPIC_REPLICATOR")
        _int_param(query, "suggestload", "INVALID_ARG_TOPIC_LOAD_FACTOR", _MAX_LOAD_FACTOR)
        sync_every = _int_param(query, "syncdisk", "INVALID_ARG_TOPIC_SYNC_DISK")
        retention = _int_param(query, "retention", None)
        try:
            self.view.create_topic(
                name,
                partitions,
                replicas,
                ordered=query.get("orderedmulti") == "true",
                ext=query.get("extend") == "true",
                multi_part=query.get("multipart") == "true",
                disable_channel_auto_create=query.get("disable_channel_auto_create") == "true",
                sync_every=sync_every,
                retention_days=retention,
            )
        except ServerError as exc:
            raise ApiError(400, exc.code) from None
        return None

    def partition_expand(self, request: Request) -> object:
        """``/topic/partition/expand?topic=T&partition_num=N``: argument errors are 400, the
        cluster's refusals 500 (unknown topic, fewer partitions), as on the fork."""
        query = request.query
        name = query.get("topic", "")
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        partitions = _ranged(query, "partition_num", 1, _MAX_PARTITION_NUM, "TOPIC_PARTITION_NUM")
        try:
            self.view.expand_topic(name, partitions)
        except ServerError as exc:
            raise ApiError(500, exc.code) from None
        return None

    def topic_delete(self, request: Request) -> object:
        """``/topic/delete?topic=T&partition=**``."""
        name = request.query.get("topic", "")
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        partition = request.query.get("partition", "")
        if not partition:
            raise ApiError(400, "MISSING_ARG_TOPIC_PARTITION")
        if partition != "**":
            raise ApiError(400, "REMOVE_SINGLE_PARTITION_NOT_ALLOWED")
        if name not in self.view.topics:
            raise ApiError(500, "Key not found")
        self.view.delete_topic(name)
        self.tombstones = {t for t in self.tombstones if t[0] != name}
        return None

    def partition_move(self, request: Request) -> object:
        """``/topic/partition/move``: move a leader (or a replica) between nodes."""
        query = request.query
        name = query.get("topic", "")
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        raw = query.get("partition", "")
        if not raw:
            raise ApiError(400, "MISSING_ARG_TOPIC_PARTITION")
        try:
            number = go_atoi(raw)
        except ValueError:
            raise ApiError(400, "INVALID_ARG_TOPIC_PARTITION_NUM") from None
        if not (0 <= number < _MAX_PARTITION_NUM or number == _OLD_VERSION_PID):
            raise ApiError(400, "INVALID_ARG_TOPIC_PARTITION_NUM")
        move_leader = query.get("move_leader") == "true"
        source, target = query.get("move_from", ""), query.get("move_to", "")
        if source == target:
            raise ApiError(400, "move to and from node can not be the same")
        topic = self.view.topics.get(name)
        if topic is None or not 0 <= number < len(topic.partitions):
            raise ApiError(400, "Key not found")
        part = topic.partitions[number]
        to_node = self._live_node(target)
        if move_leader:
            if source != part.leader.distributed_id:
                raise ApiError(400, "move from not the topic leader")
            if target and to_node is None:
                raise ApiError(400, "the move destination is not found in cluster")
            try:
                self.view.move_leader(name, number, to=to_node)
            except ServerError as exc:
                raise ApiError(400, exc.code) from None
            return None
        self._move_replica(part, source, to_node)
        return None

    def _live_node(self, distributed_id: str) -> DevNode | None:
        return next(
            (
                n
                for n in self.view.nodes
                if n.distributed_id == distributed_id and n.state != NodeState.STOPPED
            ),
            None,
        )

    def _move_replica(self, part: DevPartition, source: str, to_node: DevNode | None) -> None:
        if source == part.leader.distributed_id:
            raise ApiError(400, "can not move leader without moveleader param")
        from_node = next((n for n in part.replicas if n.distributed_id == source), None)
        if from_node is None:
            raise ApiError(400, "the move source node has no replica for the topic")
        if to_node is not None and to_node in part.replicas:
            raise ApiError(400, "the move destination has the topic data already")
        if to_node is None:
            raise ApiError(400, "the move destination is not found in cluster")
        part.replicas[part.replicas.index(from_node)] = to_node
        self.view.record(
            EventKind.REPLICA_MOVED,
            topic=part.topic.name,
            partition=part.number,
            old=from_node.index,
            new=to_node.index,
        )

    def _registration_topic(self, request: Request) -> tuple[DevTopic, str]:
        """Topic and channel of ``/channel/create|delete`` (``GetTopicChannelArgs`` + meta)."""
        name = request.query.get("topic", "")
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        channel = request.query.get("channel", "")
        if not channel:
            raise ApiError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel):
            raise ApiError(400, "INVALID_ARG_CHANNEL")
        topic = self.view.topics.get(name)
        if topic is None:
            raise ApiError(400, "Key not found")
        return topic, channel

    def channel_create(self, request: Request) -> object:
        """Register a channel of a ``disable_channel_auto_create`` topic; the nodes then
        create it on every partition (as the coordinator's sync does)."""
        topic, channel = self._registration_topic(request)
        if not topic.disable_channel_auto_create:
            raise ApiError(400, f"channel auto create NOT disabled in topic {topic.name}")
        if channel in topic.registered_channels:
            raise ApiError(400, f"channel {channel} already registered")
        topic.registered_channels.add(channel)
        for part in topic.partitions:
            part.hub(channel)
        self.view.record(EventKind.CHANNEL_REGISTERED, topic=topic.name, channel=channel)
        return None

    def channel_delete(self, request: Request) -> object:
        """Unregister a channel; the nodes delete it (its subscribers are disconnected).
        A no-op for topics that create channels automatically, as on the real lookupd."""
        topic, channel = self._registration_topic(request)
        if not topic.disable_channel_auto_create:
            return None
        if channel not in topic.registered_channels:
            raise ApiError(400, f"channel {channel} not registered")
        topic.registered_channels.discard(channel)
        for part in topic.partitions:
            part.drop_channel(channel, "channel unregistered")
        self.view.record(EventKind.CHANNEL_UNREGISTERED, topic=topic.name, channel=channel)
        return None

    def topic_tombstone(self, request: Request) -> object:
        """Hide (or with ``restore=true`` show again) a node's partitions of a topic from
        writers; ``node`` is ``<broadcast_address>:<http_port>``."""
        name = request.query.get("topic", "")
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        node = request.query.get("node", "")
        if not node:
            raise ApiError(400, "MISSING_ARG_NODE")
        restore = request.query.get("restore") == "true"
        if restore:
            self.tombstones.discard((name, node))
        else:
            self.tombstones.add((name, node))
        self.view.record(EventKind.TOPIC_TOMBSTONED, topic=name, node=node, restore=restore)
        return None

    def disable_write(self, request: Request) -> object:
        """``type=all`` / ``type=ordered`` disable writes in lookups; anything else enables."""
        kind = request.query.get("type", "")
        self.write_disabled = kind if kind in ("all", "ordered") else ""
        self.view.record(EventKind.CLUSTER_WRITE_DISABLED, type=self.write_disabled or "none")
        return None

    def loglevel_set(self, request: Request) -> object:
        """Accepted and remembered; the emulator has no log levels of its own."""
        raw = request.query.get("loglevel", "")
        if not raw:
            raise ApiError(400, "MISSING_ARG_LEVEL")
        try:
            self.log_level = go_atoi(raw)
        except ValueError:
            raise ApiError(400, "BAD_LEVEL_STRING") from None
        self.view.record(EventKind.LOOKUPD_LOGLEVEL_SET, level=self.log_level)
        return None


def _ranged(query: dict[str, str], key: str, low: int, high: int, suffix: str) -> int:
    """A required integer parameter in ``low..high`` (``MISSING_ARG_*`` / ``INVALID_ARG_*``)."""
    raw = query.get(key, "")
    if not raw:
        raise ApiError(400, f"MISSING_ARG_{suffix}")
    try:
        value = go_atoi(raw)
    except ValueError:
        raise ApiError(400, f"INVALID_ARG_{suffix}") from None
    if not low <= value <= high:
        raise ApiError(400, f"INVALID_ARG_{suffix}")
    return value


def _int_param(query: dict[str, str], key: str, code: str | None, high: int | None = None) -> int:
    """An optional integer parameter (``0..high`` when ``high`` is set; 0 when absent);
    ``code`` None answers Go's strconv error text, as ``retention`` does on the real server."""
    try:
        value = go_atoi(query.get(key) or "0")
    except ValueError as exc:
        raise ApiError(400, code or str(exc)) from None
    if code is not None and high is not None and not 0 <= value <= high:
        raise ApiError(400, code)
    return value
