"""Smoke tests of the real-server harness, spoken to with raw sockets (no client code)."""

from __future__ import annotations

import pytest

from nsq_ha.testing.servers import ForkCluster, VanillaCluster

from .rawnsq import RawConn


def test_vanilla_pub_sub_round_trip(vanilla_cluster: VanillaCluster) -> None:
    topic = "smoke_vanilla"
    vanilla_cluster.create_topic(topic)
    node = vanilla_cluster.nodes[0]

    sub = RawConn(node.tcp_address)
    identify = sub.identify()
    assert identify == b"OK"  # no feature_negotiation -> plain OK
    sub.sub(topic, "smoke")
    sub.command("RDY 1")

    pub = RawConn(node.tcp_address)
    pub.pub(topic, b"hello vanilla")
    pub.close()

    msg = sub.read_message()
    assert msg.body == b"hello vanilla"
    assert msg.attempts == 1
    assert len(msg.id) == 16
    assert all(c in b"0123456789abcdef" for c in msg.id)  # vanilla ids are hex
    sub.fin(msg.id)
    sub.close_cleanly()

    lookup = vanilla_cluster.lookup(topic)
    ports = sorted(p["tcp_port"] for p in lookup["producers"])
    assert ports == sorted(n.tcp_port for n in vanilla_cluster.nodes)


@pytest.fixture
def smoke_topic(fork_topic4: str) -> str:
    return fork_topic4


def test_fork_lookup_lists_four_partitions(fork_cluster: ForkCluster, smoke_topic: str) -> None:
    lookup = fork_cluster.lookup(smoke_topic, access="w")
    assert lookup["meta"]["partition_num"] == 4
    assert lookup["meta"]["ordered"] is False
    assert sorted(lookup["partitions"]) == ["0", "1", "2", "3"]
    known = {n.distributed_id for n in fork_cluster.nodes}
    for entry in lookup["partitions"].values():
        assert entry["distributed_id"] in known
        assert entry["version"] == "0.3.7-HA.1.13.0"
    # readers see the same partitions
    assert sorted(fork_cluster.lookup(smoke_topic, access="r")["partitions"]) == [
        "0",
        "1",
        "2",
        "3",
    ]


def test_fork_pub_sub_fin_on_every_partition(fork_cluster: ForkCluster, smoke_topic: str) -> None:
    partitions = fork_cluster.lookup(smoke_topic, access="w")["partitions"]
    assert sorted(partitions) == ["0", "1", "2", "3"]  # the loops below check every one
    subs: dict[int, RawConn] = {}
    for pid_text, entry in sorted(partitions.items()):
        pid = int(pid_text)
        address = f"{entry['broadcast_address']}:{entry['tcp_port']}"
        sub = RawConn(address)
        sub.identify()
        sub.sub(smoke_topic, "smoke", pid)
        sub.command("RDY 1")
        subs[pid] = sub
        pub = RawConn(address)
        pub.identify()
        pub.pub(smoke_topic, f"to-partition-{pid}".encode(), pid)
        pub.close()

    for pid, sub in subs.items():
        msg = sub.read_message()
        assert msg.body == f"to-partition-{pid}".encode()
        assert msg.attempts == 1
        # fork ids are binary: internal id (u64) + trace id (u64); a fresh partition starts at 2
        assert int.from_bytes(msg.id[:8], "big") >= 2
        sub.fin(msg.id)
        sub.close_cleanly()  # an E_FIN_FAILED would arrive before CLOSE_WAIT
