"""Which nsqd hold each partition of a fork topic, for ``nsq-ha lookup``.

nsqlookupd's ``/lookup`` and ``/nodes`` name only each partition's leader: replicas register
nothing with it. The fork names them in nsqd's own answers: ``/coordinator/stats?topic=T`` (the
in-sync replicas by node id, on the real fork only) and ``/stats?topic=T``, where every node
holding a copy lists the partition, ``is_leader`` on the leader's. :func:`find_replicas` asks the
second (the embedded broker answers it too) of every node nsqlookupd knows, within a share of the
command's deadline; a node that does not answer leaves a note, not a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nsq_ha.admin import LookupdAdmin, NsqdAdmin
from nsq_ha.admin.lag import stat_int
from nsq_ha.errors import NsqError

__all__ = ["Replicas", "find_replicas"]


@dataclass(frozen=True, slots=True)
class Replicas:
    """partition -> the TCP addresses of the nodes holding a copy, leader first."""

    holders: dict[int, list[tuple[str, bool]]] = field(default_factory=dict)
    #: why some holders may be missing (a node that did not answer)
    unknown: list[str] = field(default_factory=list)

    def cell(self, partition: int) -> str:
        """The table's cell: the addresses, leader first (``?`` when none is known)."""
        return ", ".join(a for a, _ in self.holders.get(partition, ())) or "?"

    def to_json(self) -> dict[str, Any]:
        """``replicas`` and ``replicas_unknown`` of ``nsq-ha lookup --json``."""
        return {
            "replicas": {
                str(p): [{"address": a, "leader": lead} for a, lead in found]
                for p, found in sorted(self.holders.items())
            },
            "replicas_unknown": list(self.unknown),
        }


async def find_replicas(lookupd: Sequence[str], topic: str, limit: float) -> Replicas:
    """The holders of each partition of ``topic``, from every node's ``/stats``, all asked at
    once within ``limit`` seconds."""
    holders: dict[int, list[tuple[str, bool]]] = {}
    unknown: list[str] = []
    try:
        async with asyncio.timeout(limit), LookupdAdmin(list(lookupd), timeout=limit) as admin:
            nodes = await admin.nodes()

            async def one(http_url: str) -> list[dict[str, Any]]:
                async with NsqdAdmin(http_url, timeout=limit) as nsqd:
                    return await nsqd.stats(topic, clients=False)

            answers = await asyncio.gather(
                *(one(n.http_url) for n in nodes), return_exceptions=True
            )
    except (NsqError, TimeoutError) as exc:
        reason = str(exc) or f"no answer within {limit:g} s"
        return Replicas(unknown=[f"the nodes: {' '.join(reason.split())}"])
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, NsqError):
            unknown.append(f"nsqd {node.address}: {' '.join(str(answer).split())}")
            continue
        if isinstance(answer, BaseException):
            raise answer
        for entry in answer:
            partition = stat_int(entry.get("topic_partition"))
            if entry.get("topic_name") != topic or partition is None:
                continue
            holders.setdefault(partition, []).append((node.address, bool(entry.get("is_leader"))))
    for found in holders.values():
        found.sort(key=lambda pair: (not pair[1], pair[0]))
    return Replicas(holders, unknown)
