"""Where the embedded cluster's topics live: placement, leaders, failover and lookup answers.

:class:`Topology` owns the topics of a cluster and decides, from its nodes' states, which node
leads each partition, what a command sent to a node addresses (:meth:`Topology.hosted_partition`,
the errors nsqd answers) and what lookupd answers (:meth:`Topology.lookup_answer`).  It has no
servers: connections it must close (subscribers of a moved leader, of a deleted topic) are
:class:`~nsq_ha.devcluster.model.Subscriber` objects in the channel hubs.

Replication is perfect and synchronous: every replica of a partition shares one
:class:`~nsq_ha.devcluster.store.Partition`, so a new leader has every acknowledged message and
every channel cursor, as the fork's ISR replication promises.
"""

from __future__ import annotations

from typing import Any

from nsq_ha.errors import ConfigError
from nsq_ha.protocol.names import is_valid_name

from .model import (
    ChannelHub,
    DevNode,
    DevPartition,
    DevTopic,
    EventKind,
    EventLog,
    NodeState,
    ServerError,
    hubs_of,
    monotonic,
    wall_ns,
)
from .store import Partition, StoredMessage

__all__ = ["MAX_PARTITIONS", "MAX_REPLICAS", "MAX_SYNC_EVERY", "Topology"]

MAX_PARTITIONS = 254
MAX_REPLICAS = 5
#: nsqlookupd clamps a topic's ``syncdisk`` to this
MAX_SYNC_EVERY = 4000

_EMPTY_META = {
    "disable_channel_auto_create": False,
    "extend_support": False,
    "multi_part": False,
    "ordered": False,
    "partition_num": 0,
    "replica": 0,
}


class Topology:
    """The topics of a cluster of ``nodes``, their placement and leaders.

    Changes are recorded in ``events``.  ``allow_write_with_nochannels`` lists partitions
    without a channel for writers (as the test clusters run lookupd).
    """

    def __init__(
        self, nodes: list[DevNode], events: EventLog, *, allow_write_with_nochannels: bool = True
    ) -> None:
        self.nodes = nodes
        self.events = events
        self.allow_write_with_nochannels = allow_write_with_nochannels
        self.topics: dict[str, DevTopic] = {}
        self._placement_turn = 0

    def __repr__(self) -> str:
        return f"<Topology nodes={len(self.nodes)} topics={sorted(self.topics)}>"

    # -- topics -----------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replicas: int = 1,
        *,
        ordered: bool = False,
        ext: bool = False,
        multi_part: bool = True,
        disable_channel_auto_create: bool = False,
        sync_every: int = 0,
        retention_days: int = 0,
        placement: list[list[int]] | None = None,
    ) -> DevTopic:
        """Create a topic as lookupd's ``/topic/create`` does (same validation and errors,
        raised as :class:`ServerError` with the lookupd message as ``code``).

        Partition ``p``'s replicas are ``replicas`` consecutive nodes starting at a rotating
        node; the first is the leader (``placement`` gives each partition's node indexes
        instead, leader first).  Re-creating with identical parameters is a no-op; different
        parameters raise ``already exist``.  ``sync_every`` (the fork's ``syncdisk``, clamped
        to 4000 as nsqlookupd does) and ``retention_days`` are only remembered for that
        comparison: the emulator keeps every message in memory whatever they say.
        """
        if not name:
            raise ServerError("MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise ServerError("INVALID_ARG_TOPIC")
        if not 1 <= partitions <= 255:
            raise ServerError("INVALID_ARG_TOPIC_PARTITION_NUM")
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ServerError("INVALID_ARG_TOPIC_REPLICATOR")
        if partitions > MAX_PARTITIONS:
            raise ServerError("max partition allowed exceed")
        spread = ordered or multi_part
        if len(self.nodes) < replicas or (not spread and len(self.nodes) < partitions * replicas):
            # the coordinator's ErrNodeUnavailable (CoordTmpErr, RpcCommonErr) as text
            raise ServerError("ErrType:9 ErrCode:1 : No node is available for topic")
        sync_every = min(sync_every, MAX_SYNC_EVERY)
        topic = DevTopic(
            name,
            partitions,
            replicas,
            ordered=ordered,
            ext=ext,
            multi_part=multi_part,
            disable_channel_auto_create=disable_channel_auto_create,
            sync_every=sync_every,
            retention_days=retention_days,
        )
        existing = self.topics.get(name)
        if existing is not None:
            if _creation_args(existing) != _creation_args(topic):
                raise ServerError("already exist")
            return existing
        count = len(self.nodes)
        if placement is not None and (
            len(placement) != partitions
            or any(len(set(p)) != replicas or not set(p) <= set(range(count)) for p in placement)
        ):
            raise ConfigError(f"placement must list {replicas} distinct nodes per partition")
        for number in range(partitions):
            first = (self._placement_turn + number * replicas) % count
            indexes = (
                placement[number]
                if placement is not None
                else [(first + k) % count for k in range(replicas)]
            )
            nodes = [self.nodes[i] for i in indexes]
            store = Partition(
                name, number, ordered=ordered, ext=ext, clock=monotonic, wall_clock_ns=wall_ns
            )
            topic.partitions.append(DevPartition(topic, number, nodes, nodes[0], store))
        self._placement_turn = (self._placement_turn + 1) % count
        self.topics[name] = topic
        self.events.record(
            EventKind.TOPIC_CREATED,
            topic=name,
            partitions=partitions,
            replicas=replicas,
            ordered=ordered,
            ext=ext,
            leaders=[p.leader.index for p in topic.partitions],
        )
        return topic

    def expand_topic(
        self, name: str, partitions: int, *, listed_after: float
    ) -> list[DevPartition]:
        """Grow ``name`` to ``partitions`` as lookupd's ``/topic/partition/expand`` does: the
        count in the meta at once; the new partitions placed as :meth:`create_topic` places
        them, listed by ``access=r`` lookups from ``listed_after`` and leaderless (absent from
        ``access=w``, a PUB refused as not leader) until :meth:`settle_expansion`. The count
        the topic has changes nothing; the new ones are returned."""
        topic = self.topics.get(name)
        if topic is None:
            raise ServerError("topic is not created")
        if partitions > MAX_PARTITIONS:
            raise ServerError("max partition allowed exceed")
        if partitions < topic.partition_num:
            raise ServerError("the partition number can not be reduced")
        count = len(self.nodes)
        added: list[DevPartition] = []
        for number in range(topic.partition_num, partitions):
            first = (self._placement_turn + number * topic.replica) % count
            nodes = [self.nodes[(first + k) % count] for k in range(topic.replica)]
            store = Partition(
                name,
                number,
                ordered=topic.ordered,
                ext=topic.ext,
                clock=monotonic,
                wall_clock_ns=wall_ns,
            )
            part = DevPartition(topic, number, nodes, nodes[0], store)
            part.leaderless = part.expanding = True
            part.listed_after = listed_after
            topic.partitions.append(part)
            added.append(part)
        if added:
            topic.partition_num = partitions
            self.events.record(
                EventKind.TOPIC_EXPANDED,
                topic=name,
                partitions=partitions,
                added=[p.number for p in added],
            )
        return added

    def settle_expansion(self, topic: DevTopic) -> list[DevPartition]:
        """lookupd's topic check: the listed partitions of an expansion get their leaders
        (writable from now); the ones settled are returned."""
        now = monotonic()
        settled = [p for p in topic.partitions if p.expanding and p.listed_after <= now]
        for part in settled:
            part.expanding = part.leaderless = False
            self.events.record(
                EventKind.LEADER_MOVED,
                topic=topic.name,
                partition=part.number,
                old=part.leader.index,
                new=part.leader.index,
                reason="expansion",
            )
        return settled

    def delete_topic(self, name: str) -> None:
        """Remove a topic everywhere (its subscribers are disconnected)."""
        topic = self.topics.pop(name, None)
        if topic is None:
            raise ServerError("TOPIC_NOT_FOUND")
        for part in topic.partitions:
            for hub in part.hubs.values():
                hub.drop_all("topic deleted")
        self.events.record(EventKind.TOPIC_DELETED, topic=name)

    def partition(self, topic: str, partition: int) -> DevPartition:
        """One partition (KeyError when unknown)."""
        return self.topics[topic].partitions[partition]

    def hubs(self) -> list[ChannelHub]:
        """Every channel of every partition."""
        return hubs_of(list(self.topics.values()))

    def create_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """Create ``channel`` on one partition (or all), at the partition's end."""
        top = self.topics[topic]
        parts = top.partitions if partition is None else [top.partitions[partition]]
        for part in parts:
            part.hub(channel)
        self.events.record(
            EventKind.CHANNEL_CREATED, topic=topic, channel=channel, partition=partition
        )

    # -- what a node's command addresses ----------------------------------------------------

    def hosted_partition(
        self, node: DevNode, topic_name: str, partition: int, *, for_write: bool
    ) -> DevPartition:
        """The partition of ``topic_name`` held by ``node`` (leader or replica).

        ``partition`` -1 means the node's default partition: one it leads.  Raises
        ``E_TOPIC_NOT_EXIST`` when the node holds no such partition and, for writes to an
        ordered topic without a partition, the multi-partition ``E_BAD_PARTITION``.
        """
        topic = self.topics.get(topic_name)
        if topic is None:
            raise ServerError("E_TOPIC_NOT_EXIST")
        if partition == -1:
            if topic.ordered and for_write:
                raise ServerError(
                    "E_BAD_PARTITION", "topic partition is not valid for multi partition: -1"
                )
            led = topic.led_by(node)
            if not led:
                raise ServerError("E_TOPIC_NOT_EXIST")
            return led[0]
        if not 0 <= partition < len(topic.partitions):
            raise ServerError("E_TOPIC_NOT_EXIST")
        part = topic.partitions[partition]
        if node not in part.replicas:
            raise ServerError("E_TOPIC_NOT_EXIST")
        return part

    def resolve_partition(
        self, node: DevNode, topic_name: str, partition: int, *, for_write: bool
    ) -> DevPartition:
        """The partition a command on ``node`` addresses, or the error nsqd answers:
        :meth:`hosted_partition` then :meth:`check_leader`."""
        part = self.hosted_partition(node, topic_name, partition, for_write=for_write)
        self.check_leader(node, part, fatal=not for_write)
        return part

    @staticmethod
    def check_leader(node: DevNode, part: DevPartition, *, fatal: bool) -> None:
        """``E_FAILED_ON_NOT_LEADER`` unless ``node`` leads ``part`` now."""
        if not part.led_by(node):
            raise ServerError("E_FAILED_ON_NOT_LEADER", fatal=fatal)

    @staticmethod
    def append(
        part: DevPartition, messages: list[tuple[bytes, int, bytes | None]]
    ) -> list[StoredMessage]:
        """Store ``(body, trace_id, header)`` messages and wake the channels."""
        stored = [
            part.store.append(body, trace_id=trace, header=header)
            for body, trace, header in messages
        ]
        part.dispatch(monotonic())
        return stored

    # -- lookup -----------------------------------------------------------------------------

    def lookup_answer(
        self, topic_name: str, *, access: str = "r", partition: str = "*", metainfo: bool = False
    ) -> dict[str, Any]:
        """The ``/lookup`` result object (PROTOCOL.md §5.2), before the HTTP envelope.

        Raises :class:`ServerError` with the lookupd message as ``code`` for the 404 cases
        (``Key not found``) of ``access=w``.
        """
        topic = self.topics.get(topic_name)
        answer: dict[str, Any] = {"channels": []}
        if topic is None:
            if access == "w":
                raise ServerError("Key not found")
            if metainfo:
                answer["meta"] = dict(_EMPTY_META)
            answer["partitions"] = {}
            answer["producers"] = []
            return answer
        now = monotonic()
        parts = [
            p
            for p in topic.partitions
            if (partition in ("*", "") or str(p.number) == partition) and p.listed_after <= now
        ]
        listed: dict[str, dict[str, Any]] = {}
        for part in parts:
            leader = part.leader
            if access == "w":
                if part.leaderless or leader.state == NodeState.STOPPED:
                    continue
                if not part.hubs and not self.allow_write_with_nochannels:
                    continue
            listed[str(part.number)] = leader.node_object()
        answer["channels"] = topic.channel_names(p.number for p in parts)
        if metainfo:
            answer["meta"] = topic.meta()
        if access == "w" and parts and not listed and not self.allow_write_with_nochannels:
            raise ServerError("Topic has no channel, should init at least one for the new topic")
        producers: list[dict[str, Any]] = []
        for node_object in listed.values():
            if node_object not in producers:
                producers.append(node_object)
        answer["partitions"] = listed
        answer["producers"] = producers
        return answer

    # -- leaders ----------------------------------------------------------------------------

    def move_leader(self, part: DevPartition, to: DevNode | None = None) -> DevNode:
        """Make another replica (``to``, or the next running one) the leader; returns it.

        The old leader's subscribers of the partition are disconnected without an error frame
        and the new leader's next internal id skips one, as on the real cluster.  A ``to``
        outside the replicas is added to them first (as a real move copies the partition).
        """
        old = part.leader
        candidates = [n for n in part.replicas if n is not old and n.state != NodeState.STOPPED]
        if to is not None:
            if to not in part.replicas:
                part.replicas.append(to)
            candidates = [to]
        if not candidates:
            topic = part.topic.name
            raise ServerError(f"no replica of {topic}/{part.number} can take the leadership")
        new = candidates[0]
        self._set_leader(part, new, reason="move")
        return new

    def _set_leader(self, part: DevPartition, new: DevNode, *, reason: str) -> None:
        old = part.leader
        part.leader = new
        part.leaderless = False
        part.store.next_id += 1  # observed: the new leader's ids skip one
        moved = f"leader of {part.topic.name}/{part.number} moved"
        for hub in part.hubs.values():
            hub.drop_all(moved, where=lambda client: client.node is old)
        self.events.record(
            EventKind.LEADER_MOVED,
            topic=part.topic.name,
            partition=part.number,
            old=old.index,
            new=new.index,
            reason=reason,
        )

    def led_by(self, node: DevNode) -> list[DevPartition]:
        """Every partition ``node`` is the leader of (leaderless ones included)."""
        return [p for t in self.topics.values() for p in t.partitions if p.leader is node]

    def fail_over(self, part: DevPartition) -> None:
        """Hand ``part`` to a running replica, or leave it leaderless while its leader is
        stopped and no replica runs."""
        running = [
            n for n in part.replicas if n is not part.leader and n.state == NodeState.RUNNING
        ]
        if running:
            self._set_leader(part, running[0], reason="failover")
        else:
            part.leaderless = part.leader.state == NodeState.STOPPED

    def node_returned(self, node: DevNode) -> None:
        """A stopped node is back: the partitions it still leads have a leader again."""
        for part in self.led_by(node):
            part.leaderless = False


def _creation_args(topic: DevTopic) -> tuple[object, ...]:
    """What a re-create must repeat exactly (``multi_part`` is not compared, as on the fork)."""
    return (
        topic.partition_num,
        topic.replica,
        topic.ordered,
        topic.ext,
        topic.disable_channel_auto_create,
        topic.sync_every,
        topic.retention_days,
    )
