"""The embedded cluster's fault switches: what the servers consult before they answer.

:class:`FaultSwitches` sets each node's :class:`~nsq_ha.devcluster.model.NodeFaults`, the
lookupd's :class:`~nsq_ha.devcluster.model.LookupdFaults` and the set of partitions whose
publishes fail, and records every change in the event log.  The servers read the switches on
every frame or request; nothing here touches a connection (a new ``cut_after`` budget reaches
open connections through the cluster, which owns the servers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .model import DevNode, DevPartition, EventKind, EventLog, LookupdFaults, NodeFaults

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["FaultSwitches"]


class FaultSwitches:
    """The fault switches of the nodes ``nodes`` and of lookupd."""

    def __init__(self, nodes: list[DevNode], events: EventLog) -> None:
        self.nodes = nodes
        self.events = events
        self.lookupd = LookupdFaults()
        self._unwritable: set[tuple[str, int]] = set()

    def __repr__(self) -> str:
        return f"<FaultSwitches unwritable={sorted(self._unwritable)} lookupd={self.lookupd}>"

    def unwritable(self, part: DevPartition) -> bool:
        """True when publishes to ``part`` must fail with ``E_FAILED_ON_NOT_WRITABLE``."""
        return part.key in self._unwritable

    def set_writable(self, part: DevPartition, writable: bool) -> None:
        """Make publishes to ``part`` fail with ``E_FAILED_ON_NOT_WRITABLE`` (or stop it)."""
        topic, partition = part.key
        if writable:
            self._unwritable.discard(part.key)
        else:
            self._unwritable.add(part.key)
        self.events.record(
            EventKind.WRITABLE_SET, topic=topic, partition=partition, writable=writable
        )

    def delay_responses(
        self, node: DevNode, seconds: float, *, commands: Iterable[str] | None = None
    ) -> None:
        """Hold each response/error frame of ``node`` ``seconds`` before writing it (0: off)."""
        node.faults.delay = seconds
        node.faults.commands = None if commands is None else frozenset(commands)
        self.events.record(
            EventKind.FAULT_SET,
            fault="delay",
            node=node.index,
            seconds=seconds,
            commands=sorted(node.faults.commands or []),
        )

    def drop_responses(
        self, node: DevNode, count: int = 1, *, commands: Iterable[str] | None = None
    ) -> None:
        """Swallow the next ``count`` response/error frames of ``node`` (-1: all, 0: off)."""
        node.faults.drop = count
        node.faults.commands = None if commands is None else frozenset(commands)
        self.events.record(
            EventKind.FAULT_SET,
            fault="drop",
            node=node.index,
            count=count,
            commands=sorted(node.faults.commands or []),
        )

    def cut_after(self, node: DevNode, nbytes: int | None) -> None:
        """A new ``cut_after`` budget of ``nbytes`` for ``node`` (``None``: off)."""
        node.faults.cut_after = nbytes
        node.faults.cut_epoch += 1
        self.events.record(EventKind.FAULT_SET, fault="cut_after", node=node.index, nbytes=nbytes)

    def lookupd_fail(self, status: int | None = 500, *, count: int | None = None) -> None:
        """Answer lookupd requests with HTTP ``status`` (``count`` times, or until cleared;
        ``None`` clears)."""
        self.lookupd.fail_status = status
        self.lookupd.fail_count = count
        self.events.record(EventKind.FAULT_SET, fault="lookupd_fail", status=status, count=count)

    def lookupd_stale(self, stale: bool = True) -> None:
        """Freeze ``/lookup`` answers as they are now (stale routing), or unfreeze."""
        self.lookupd.stale = {} if stale else None
        self.events.record(EventKind.FAULT_SET, fault="lookupd_stale", stale=stale)

    def clear(self) -> None:
        """Turn every fault off."""
        for node in self.nodes:
            node.faults = NodeFaults(cut_epoch=node.faults.cut_epoch + 1)
        self._unwritable.clear()
        self.lookupd = LookupdFaults()
        self.events.record(EventKind.FAULTS_CLEARED)
