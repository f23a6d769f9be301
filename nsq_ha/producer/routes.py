"""Where a topic's messages can go: routes built from a partition map, and the refusals that
follow from them, decided before anything is sent (pure: no I/O).

A keyed message is routed by the topic's partition *count*, and that count is only ever taken
from lookupd's ``meta.partition_num``: a lookup without ``meta`` (or with a count of 0) lists
only the partitions that have a writable leader now, so "highest listed + 1" would be a guess
that re-hashes keys whenever the highest partition's leader is missing. The producer keeps the
last count ``meta`` gave (:class:`PartitionCounts`); until one is known, keyed publishes wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nsq_ha.errors import UnsupportedByServerError
from nsq_ha.lookup import NodeInfo, PartitionMap
from nsq_ha.producer.batch import OutgoingMessage

__all__ = ["ConnKey", "PartitionCounts", "Routes", "check_features"]

#: A connection's identity: nsqd address, and on the fork the topic and partition it serves.
ConnKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class Routes:
    """Where one topic's messages can go now; a *slot* is a partition (fork) or a node."""

    topic: str
    #: True: fork partitions; False: vanilla nodes; None: static nsqd= nodes of unknown kind.
    fork: bool | None
    nodes: Mapping[int, NodeInfo]
    #: how many slots keys are spread over; 0 on the fork while the count is not known
    count: int
    ext: bool | None = None
    #: slots that have a writable node now, in order (round-robin walks these)
    writable: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "writable", tuple(sorted(self.nodes)))

    @classmethod
    def from_map(cls, pmap: PartitionMap, known_count: int = 0) -> Routes:
        """Routes of ``pmap``; a fork map without a usable ``meta`` count uses ``known_count``
        (the last count ``meta`` gave, 0 when none did), never the listed partitions."""
        if pmap.fork:
            count = pmap.meta.partition_num if pmap.meta is not None else 0
            ext = pmap.extend_support if pmap.meta is not None else None
            return cls(pmap.topic, True, dict(pmap.partitions), count or known_count, ext)
        nodes = dict(enumerate(pmap.producers))
        return cls(pmap.topic, False, nodes, len(nodes))

    def wire_partition(self, slot: int) -> int | None:
        """The partition a command names for ``slot`` (None on vanilla and static nodes)."""
        return slot if self.fork else None

    def key(self, slot: int, node: NodeInfo) -> ConnKey:
        """The connection that serves ``slot`` on ``node``."""
        return (node.address, self.topic, slot) if self.fork else (node.address, "", -1)


class PartitionCounts:
    """The last partition count lookupd's ``meta`` gave per topic, and routes built with it."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def routes(self, pmap: PartitionMap) -> Routes:
        """Remember ``pmap``'s count if it has one, and build its routes."""
        if pmap.fork and pmap.meta is not None and pmap.meta.partition_num > 0:
            self.counts[pmap.topic] = pmap.meta.partition_num
        return Routes.from_map(pmap, self.counts.get(pmap.topic, 0))

    def forget(self, topic: str) -> None:
        """Drop what is known of ``topic`` (it expired)."""
        self.counts.pop(topic, None)


def check_features(
    fork: bool | None,
    topic: str,
    messages: Sequence[OutgoingMessage],
    *,
    defer: float | None,
    partition: int | None,
    ext_topic: bool | None = None,
) -> None:
    """Refuse what the server kind (or the topic, as lookup described it) cannot take, before
    anything is sent. ``ext_topic`` False: lookup's ``meta`` says the topic has no ext headers."""
    if fork is True and defer is not None:
        raise UnsupportedByServerError(
            f"defer= (DPUB) is not available on the fork (topic {topic!r}): its nsqd has no "
            "DPUB; delay on the consumer side instead (REQ with a timeout)"
        )
    if fork is False:
        if partition is not None:
            raise UnsupportedByServerError(f"vanilla nsqd has no partitions (topic {topic!r})")
        if any(m.trace_id is not None for m in messages):
            raise UnsupportedByServerError("trace ids (PUB_TRACE) exist only on the fork")
        if any(m.ext is not None for m in messages):
            raise UnsupportedByServerError("ext headers (PUB_EXT) exist only on the fork")
    if ext_topic is False and any(m.ext is not None for m in messages):
        raise UnsupportedByServerError(
            f"topic {topic!r} is not an ext topic (lookup: extend_support=false), so nsqd "
            "would refuse ext headers (E_EXT_NOT_SUPPORT): publish without ext=, or use a "
            "topic created with ext support"
        )
