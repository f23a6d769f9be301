"""Growing a fork topic's partition count: ``POST /topic/partition/expand`` on the leader
nsqlookupd, then waiting until every partition is writable.

What the fork does (0.3.7-HA.1.13.0, checked on a real cluster): the answer is 200 with an empty
body, and ``meta.partition_num`` grows at once. An ``access=r`` lookup lists the new partitions
a moment later; ``access=w`` lists them only once lookupd's periodic topic check has given them
leaders (about 90 s if nothing nudges the check, about 6 s when the topic's ``/topic/create``
is posted again every 2 s, which is what :func:`expand_topic` does). Meanwhile a PUB to a new
partition's nsqd gets ``E_FAILED_ON_NOT_LEADER``. Asking for the count the topic already has is
a 200 that changes nothing; fewer is ``the partition number can not be reduced``, an unknown
topic ``topic is not created``, while the cluster settles ``the cluster is unstable`` (retried
here until the deadline). Ordered topics grow the same way; the fork's operations guide warns
that they lose their order during an expansion (a key that moves is read from its new partition
while older messages may still wait in the old one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from nsq_ha.errors import ConfigError, NsqError, TopicNotFoundError, UnsupportedByServerError
from nsq_ha.lookup import LookupClient
from nsq_ha.lookup.wire import PartitionMap, TopicMeta
from nsq_ha.protocol.names import validate_topic

from .nsqd import AdminError
from .spec import TopicSpec

__all__ = ["MAX_PARTITIONS", "PartitionsNotReducibleError", "expand_topic"]

log = logging.getLogger(__name__)

#: the most partitions a fork topic may have (as for :class:`TopicSpec`)
MAX_PARTITIONS = 254
#: how often the topic's ``/topic/create`` is posted again while new partitions wait for leaders
NUDGE_INTERVAL = 2.0
_POLL = 0.2


class Admin(Protocol):
    """What an expansion asks of :class:`~nsq_ha.admin.LookupdAdmin`."""

    @property
    def lookup(self) -> LookupClient: ...

    @property
    def vanilla(self) -> bool | None: ...

    async def leader(self) -> str: ...

    async def post(self, path: str, params: dict[str, str]) -> object: ...


class PartitionsNotReducibleError(AdminError):
    """The topic already has more partitions than asked: the fork cannot take any away."""


def _partitions(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"partitions must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_PARTITIONS:
        raise ConfigError(f"partitions must be between 1 and {MAX_PARTITIONS}, got {value}")
    return value


def _nudge_spec(name: str, partitions: int, meta: TopicMeta) -> TopicSpec:
    """The topic's own ``/topic/create`` with the new count: posting it again starts lookupd's
    topic check at once instead of at its next period."""
    return TopicSpec(
        name,
        partitions,
        max(meta.replica, 1),
        ordered=meta.ordered,
        ext=meta.extend_support,
        multi_part=meta.multi_part,
        channel_auto_create=not meta.disable_channel_auto_create,
    )


async def expand_topic(
    admin: Admin, name: str, partitions: int, *, wait: bool, deadline: float
) -> PartitionMap | None:
    """See :meth:`LookupdAdmin.expand_topic` (``deadline``: a :func:`time.monotonic` time)."""
    validate_topic(name)
    partitions = _partitions(partitions)
    await admin.leader()
    if admin.vanilla:
        raise UnsupportedByServerError(
            "vanilla NSQ topics have no partitions to add: every nsqd holds the whole topic "
            "(add nsqd nodes instead)"
        )
    unknown = AdminError(
        f"topic {name!r} is not known to nsqlookupd: create it first "
        "(LookupdAdmin.create_topic, nsq-ha topic create)"
    )
    try:
        meta = (await admin.lookup.lookup(name, "r", force=True)).meta
    except TopicNotFoundError as exc:
        raise unknown from exc
    if meta is None or meta.partition_num < 1:
        raise unknown
    if partitions < meta.partition_num:
        raise PartitionsNotReducibleError(
            f"topic {name!r} has {meta.partition_num} partitions; the fork can add partitions "
            f"but not take them away (asked for {partitions}): ask for {meta.partition_num} or "
            "more"
        )
    if partitions > meta.partition_num:
        await _post_expand(admin, name, partitions, deadline)
        log.info("topic %s: %d -> %d partitions", name, meta.partition_num, partitions)
    if not wait:
        return None
    return await _wait_writable(admin, _nudge_spec(name, partitions, meta), deadline)


async def _post_expand(admin: Admin, name: str, partitions: int, deadline: float) -> None:
    params = {"topic": name, "partition_num": str(partitions)}
    while True:
        try:
            await admin.post("/topic/partition/expand", params)
            return
        except AdminError as exc:
            if "unstable" not in str(exc) or time.monotonic() + 1.0 > deadline:
                raise
            log.info("topic %s: expand refused (%s); retrying", name, exc)
        await asyncio.sleep(1.0)


async def _wait_writable(admin: Admin, spec: TopicSpec, deadline: float) -> PartitionMap:
    next_nudge = time.monotonic() + NUDGE_INTERVAL
    while True:
        pmap = await admin.lookup.lookup(spec.name, "w", force=True)
        if len(pmap.partitions) >= spec.partitions:
            return pmap
        now = time.monotonic()
        if now + _POLL > deadline:
            raise AdminError(
                f"topic {spec.name!r} now has {spec.partitions} partitions, but only "
                f"{len(pmap.partitions)} became writable in time: the others wait for lookupd "
                "to give them leaders; wait longer (timeout=, nsq-ha --timeout) and check "
                "`nsq-ha topic list --json`"
            )
        if now >= next_nudge:
            next_nudge = now + NUDGE_INTERVAL
            try:
                await admin.post("/topic/create", spec.query())
            except NsqError as exc:  # a nudge only: its refusal changes nothing
                log.debug("topic %s: nudge refused: %s", spec.name, exc)
        await asyncio.sleep(_POLL)
