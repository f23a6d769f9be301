"""Where a topic's messages can go: :class:`Routes` built from a partition map, the slot of
a key (:class:`SlotMemo`), and the refusals that follow from the server kind
(:func:`check_features`), decided before anything is sent (pure: no I/O). The
:class:`~nsq_ha.producer.topic.Topic` keeps a topic's routes and uses these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from nsq_ha.errors import (
    UnsupportedByServerError,
)
from nsq_ha.lookup import NodeInfo, PartitionMap
from nsq_ha.producer.message import OutgoingMessage
from nsq_ha.routing import ShardingKey, ShardingStrategy

__all__ = [
    "MEMO_KEY_LENGTH",
    "MEMO_SIZE",
    "ConnKey",
    "Routes",
    "SlotMemo",
    "check_features",
]

#: keys whose slot :class:`SlotMemo` remembers: str and bytes up to this length, and int keys
MEMO_KEY_LENGTH: Final = 128
#: the most keys :class:`SlotMemo` remembers (every partition count together)
MEMO_SIZE: Final = 16_384

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


class SlotMemo:
    """The slot of keys routed before, per partition count, so that a repeated key is not
    hashed (nor checked) again: a keyed publish's routing is then one dict lookup.

    Only exact ``int`` keys and exact ``str`` and ``bytes`` keys up to
    :data:`MEMO_KEY_LENGTH` are kept, and only once the strategy has accepted them; a key
    that merely compares equal to one (``True``, ``1.0``) is not of those types, so it is
    still checked. At most :data:`MEMO_SIZE` keys are kept; the memo starts over when full.
    The strategy must be a function of the key and the count (every built-in one is).
    """

    __slots__ = ("_by_count", "_size", "strategy")

    def __init__(self, strategy: ShardingStrategy) -> None:
        self.strategy = strategy
        self._by_count: dict[int, dict[ShardingKey, int]] = {}
        self._size = 0

    def slot(self, key: ShardingKey, count: int) -> int:
        """``strategy.partition(key, count)``, from the memo when the key was routed before."""
        if type(key) is str or type(key) is bytes:
            if len(key) > MEMO_KEY_LENGTH:
                return self.strategy.partition(key, count)
        elif type(key) is not int:  # bool, float, subclasses: the strategy checks them
            return self.strategy.partition(key, count)
        memo = self._by_count.get(count)
        if memo is None:
            memo = self._by_count[count] = {}
        slot = memo.get(key)
        if slot is None:
            slot = self.strategy.partition(key, count)
            if self._size >= MEMO_SIZE:
                self._by_count.clear()
                self._size = 0
                memo = self._by_count[count] = {}
            memo[key] = slot
            self._size += 1
        return slot


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
