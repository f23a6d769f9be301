"""Shared test configuration; the real-server fixtures come from the nsq_ha.testing plugin."""

from __future__ import annotations

import pytest

from nsq_ha.testing.servers import ForkCluster

#: A 4-partition, replica-1 topic created once per session (a new fork topic needs seconds to
#: become writable, so tests share it instead of each creating their own).
FORK_TOPIC4 = "nsqha_t4"


@pytest.fixture(scope="session")
def fork_topic4(fork_cluster: ForkCluster) -> str:
    """A writable 4-partition (replica 1) topic on the session's fork cluster."""
    if FORK_TOPIC4 not in fork_cluster.topics:
        fork_cluster.create_topic(FORK_TOPIC4, partitions=4, replicas=1)
    return FORK_TOPIC4
