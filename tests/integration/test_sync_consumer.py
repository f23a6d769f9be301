"""The blocking consumer's iterator on the embedded cluster: what it promises beyond handing
messages out (ordered partitions stay in order while answers are written in batches)."""

from __future__ import annotations

from nsq_ha import sync
from nsq_ha.devcluster import DevClusterThread

CHANNEL = "c"


def test_the_blocking_iterator_keeps_each_ordered_partition_in_order(
    devcluster: DevClusterThread,
) -> None:
    """On an ordered topic the iterator hands out each partition's messages in order, a
    requeued one again before the ones after it, with the answers written in batches."""
    devcluster.create_topic("sequence", 2, 1, ordered=True)
    devcluster.call(devcluster.cluster.create_channel, "sequence", CHANNEL)
    per_partition = 30
    with sync.Producer(lookupd=devcluster.lookupd_http) as producer:
        for partition in (0, 1):
            bodies = [b"%d-%d" % (partition, i) for i in range(per_partition)]
            producer.publish_many("sequence", bodies, partition=partition, timeout=30)
    seen: dict[int, list[bytes]] = {0: [], 1: []}
    requeued = False
    with sync.Consumer("sequence", CHANNEL, lookupd=devcluster.lookupd_http) as consumer:
        for message in consumer:
            assert message.partition is not None
            seen[message.partition].append(message.body)
            if message.body == b"0-5" and not requeued:
                requeued = True
                message.requeue(0, backoff=False)
            else:
                message.finish()
            if sum(map(len, seen.values())) == 2 * per_partition + 1:
                break
    expected_0 = [b"0-%d" % i for i in range(per_partition)]
    assert seen[0] == [*expected_0[:6], *expected_0[5:]]
    assert seen[1] == [b"1-%d" % i for i in range(per_partition)]
