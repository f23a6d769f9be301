"""The embedded broker: an in-process emulation of a fork cluster (nsqlookupd + N nsqd).

For demos, for testing consumers and producers without Go or etcd, and for faults a real
cluster cannot produce on cue::

    async with DevCluster(nodes=3) as cluster:
        cluster.create_topic("orders", partitions=4, replicas=2, ordered=True)
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await producer.publish("orders", b"...", sharding_key="customer-7")
        cluster.move_leader("orders", 1)          # the next PUB there: E_FAILED_ON_NOT_LEADER
        print(*cluster.events, sep="\\n")

Pieces: :mod:`.store` (a partition's log and channels), :mod:`.cluster` (placement, leaders,
lookup answers, faults, events), :mod:`.nsqd` (the TCP protocol), :mod:`.nsqd_http` and
:mod:`.lookupd` (the HTTP APIs), :mod:`.threaded` (the same cluster driven from sync code).
"""

from .cluster import DevCluster, DevNode, DevPartition, DevTopic, Event, ServerError
from .threaded import DevClusterThread

__all__ = [
    "DevCluster",
    "DevClusterThread",
    "DevNode",
    "DevPartition",
    "DevTopic",
    "Event",
    "ServerError",
]
