"""The embedded broker: an in-process emulation of a fork cluster (nsqlookupd + N nsqd).

For demos, for testing consumers and producers without Go or etcd, and for faults a real
cluster cannot produce on cue::

    async with DevCluster(nodes=3) as cluster:
        cluster.create_topic("orders", partitions=4, replicas=2, ordered=True)
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await producer.publish("orders", b"...", sharding_key="customer-7")
        cluster.move_leader("orders", 1)          # the next PUB there: E_FAILED_ON_NOT_LEADER
        print(*cluster.events, sep="\\n")

Tests wait for what the cluster does instead of sleeping::

        await cluster.stop_node(0, kill=True)
        await cluster.wait_for(EventKind.LEADER_MOVED, reason="failover", timeout=5)

Pieces, each importing only those listed before it: :mod:`.store` (a partition's log and
channels), :mod:`.model` (nodes, topics, partitions, channel hubs, faults, events),
:mod:`.topology` (placement, leaders, lookup answers), :mod:`.faults` (the fault switches),
:mod:`.view` (the :class:`~.view.ClusterView` protocol the servers are given), the servers
(the package :mod:`.nsqd`, which uses :mod:`.ext_filter`; :mod:`.lookupd`; all on
:mod:`.http`), :mod:`.cluster` (starts the servers around the model),
:mod:`.threaded` (the same cluster driven from sync code) and :mod:`.cli`.
"""

from .cluster import DevCluster
from .model import DevNode, DevPartition, DevTopic, Event, EventKind, NodeState, ServerError
from .threaded import DevClusterThread

__all__ = [
    "DevCluster",
    "DevClusterThread",
    "DevNode",
    "DevPartition",
    "DevTopic",
    "Event",
    "EventKind",
    "NodeState",
    "ServerError",
]
