"""What the emulated servers may ask of their cluster: the :class:`ClusterView` protocol.

The TCP server (:mod:`.nsqd.server`), the nsqd HTTP API (:mod:`.nsqd.http`) and the lookupd API
(:mod:`.lookupd`) are given a ``ClusterView`` and nothing else of the cluster;
:class:`~nsq_ha.devcluster.cluster.DevCluster` implements it.  So the servers depend on the
model and on this protocol, the cluster on the servers, and no import goes the other way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .model import DevNode, DevPartition, DevTopic, Event, EventKind, Limits, LookupdFaults
from .store import StoredMessage

__all__ = ["ClusterView"]


class ClusterView(Protocol):
    """The cluster as its servers see it (all calls on the cluster's loop)."""

    @property
    def host(self) -> str:
        """The address every server listens on."""

    @property
    def lookupd_port(self) -> int:
        """lookupd's HTTP port."""

    @property
    def limits(self) -> Limits:
        """The settings every node shares."""

    @property
    def topics(self) -> Mapping[str, DevTopic]:
        """The topics by name (read-only use)."""

    @property
    def nodes(self) -> Sequence[DevNode]:
        """The nodes, by index (read-only use)."""

    @property
    def lookupd_faults(self) -> LookupdFaults:
        """lookupd's fault switches (lookupd counts ``fail_count`` down and fills ``stale``)."""

    def now(self) -> float:
        """The monotonic clock every deadline uses."""

    def record(self, kind: EventKind, **detail: Any) -> Event:
        """Append an event to the cluster's log."""

    def hosted_partition(
        self, node: DevNode, topic_name: str, partition: int, *, for_write: bool
    ) -> DevPartition:
        """The partition of a topic ``node`` holds, or the :class:`ServerError` nsqd answers."""

    def resolve_partition(
        self, node: DevNode, topic_name: str, partition: int, *, for_write: bool
    ) -> DevPartition:
        """:meth:`hosted_partition`, and ``node`` must lead it."""

    def check_leader(self, node: DevNode, part: DevPartition, *, fatal: bool) -> None:
        """``E_FAILED_ON_NOT_LEADER`` unless ``node`` leads ``part`` now."""

    def unwritable(self, part: DevPartition) -> bool:
        """True when publishes to ``part`` must fail with ``E_FAILED_ON_NOT_WRITABLE``."""

    def append(
        self, part: DevPartition, messages: list[tuple[bytes, int, bytes | None]]
    ) -> list[StoredMessage]:
        """Store ``(body, trace_id, header)`` messages and wake the channels."""

    def create_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """Create a channel on one partition (or all)."""

    def lookup_answer(
        self, topic_name: str, *, access: str = "r", partition: str = "*", metainfo: bool = False
    ) -> dict[str, Any]:
        """The ``/lookup`` result object before the HTTP envelope."""

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
        """Create a topic as lookupd's ``/topic/create`` does."""

    def expand_topic(self, name: str, partitions: int) -> None:
        """Grow a topic as lookupd's ``/topic/partition/expand`` does."""

    def delete_topic(self, name: str) -> None:
        """Remove a topic everywhere."""

    def move_leader(self, topic: str, partition: int, to: int | DevNode | None = None) -> DevNode:
        """Make another replica the leader of a partition now."""
