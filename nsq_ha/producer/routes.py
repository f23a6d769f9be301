"""Where a topic's messages can go (:class:`Routes`, from a partition map) and what the server
kind refuses before anything is sent (:func:`check_features`); pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nsq_ha.errors import UnsupportedByServerError
from nsq_ha.lookup import NodeInfo, PartitionMap
from nsq_ha.protocol.publish import PublishMessage

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
    #: lookup's ``meta`` says the topic is ordered (per-partition order, SUB_ORDERED)
    ordered: bool = False
    #: slots that have a writable node now, in order (round-robin walks these)
    writable: tuple[int, ...] = field(init=False)
    #: every message kind and target goes here (a fork, or unknown, topic not known to lack
    #: ext headers): :func:`check_features` has nothing to refuse but a DPUB
    unrestricted: bool = field(init=False)
    #: slot -> the ``host:port`` of its node (read on every publish: a dict hit)
    addresses: Mapping[int, str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "writable", tuple(sorted(self.nodes)))
        object.__setattr__(self, "unrestricted", self.fork is not False and self.ext is not False)
        addresses = {slot: node.address for slot, node in self.nodes.items()}
        object.__setattr__(self, "addresses", addresses)

    @classmethod
    def from_map(cls, pmap: PartitionMap, known_count: int = 0) -> Routes:
        """Routes of ``pmap``; a fork map without a usable ``meta`` count uses ``known_count``
        (the last count ``meta`` gave, 0 when none did), never the listed partitions."""
        if pmap.fork:
            count = pmap.meta.partition_num if pmap.meta is not None else 0
            ext = pmap.extend_support if pmap.meta is not None else None
            nodes = dict(pmap.partitions)
            return cls(pmap.topic, True, nodes, count or known_count, ext, pmap.ordered)
        nodes = dict(enumerate(pmap.producers))
        return cls(pmap.topic, False, nodes, len(nodes))


def check_features(
    fork: bool | None,
    topic: str,
    messages: Sequence[PublishMessage],
    defer: float | None,
    partition: object,
    ext_topic: bool | None = None,
) -> None:
    """Refuse what the server kind (or the topic, as lookup described it) cannot take, before
    anything is sent. ``ext_topic`` False: lookup's ``meta`` says the topic has no ext headers."""
    if fork is True and defer is not None:
        raise UnsupportedByServerError(
            f"defer= (DPUB) is not available on the fork (topic {topic!r}): its nsqd has no "
            "DPUB; delay on the consumer side instead (REQ with a timeout)"
        )
    if fork is not False and ext_topic is not False:
        return  # nothing below applies: no per-message check
    if fork is False and partition is not None:
        raise UnsupportedByServerError(f"vanilla nsqd has no partitions (topic {topic!r})")
    for m in messages:
        if fork is False and m.trace_id is not None:
            raise UnsupportedByServerError("trace ids (PUB_TRACE) exist only on the fork")
        if m.ext is None:
            continue
        if fork is False:
            raise UnsupportedByServerError("ext headers (PUB_EXT) exist only on the fork")
        raise UnsupportedByServerError(
            f"topic {topic!r} is not an ext topic (lookup: extend_support=false), so nsqd "
            "would refuse ext headers (E_EXT_NOT_SUPPORT): publish without ext=, or use a "
            "topic created with ext support"
        )
