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


#: PySpark 4.0 and 4.1 leave the local socket of ``DataFrame.collect()`` to the garbage
#: collector (4.2 closes it): with warnings as errors, that ResourceWarning would fail Spark
#: tests run on those versions (``/work/venvs``-style checks of the compat layer) for
#: something outside this project.
_PYSPARK_SOCKET_LEAK = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On PySpark older than 4.2, ignore its ``collect()`` socket leak in ``spark`` tests."""
    if not any(item.get_closest_marker("spark") for item in items):
        return
    try:
        from nsq_ha.spark.compat import parse_version, pyspark_version

        old = parse_version(pyspark_version()) < (4, 2)
    except ImportError:  # no pyspark: the spark modules skip themselves
        return
    if old:
        for item in items:
            if item.get_closest_marker("spark"):
                item.add_marker(_PYSPARK_SOCKET_LEAK)
