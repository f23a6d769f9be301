"""Shared test configuration; the real-server fixtures come from the nsq_ha.testing plugin."""

from __future__ import annotations

import os

import pytest

from nsq_ha.testing.build import ServerBinaries
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


#: The plugin's real-server fixtures and the marker of the server each one needs.
_SERVER_MARKERS = {"fork_binaries": "fork", "vanilla_binaries": "vanilla"}


def _mark_real_server_tests(items: list[pytest.Item]) -> None:
    """Give a test that uses a real server's fixture (directly or through others) its marker.

    So ``-m "not fork and not vanilla"`` (``make test`` on the extra interpreters) runs only the
    embedded cluster whether or not the test's author wrote the marker.  A fixture requested at
    run time (``request.getfixturevalue``) is not seen here: its parameter carries the marker.
    """
    for item in items:
        used = getattr(item, "fixturenames", ())
        for fixture, marker in _SERVER_MARKERS.items():
            if fixture in used and item.get_closest_marker(marker) is None:
                item.add_marker(marker)


def _embedded_only(fixture: str) -> None:
    """Under ``NSQ_HA_EMBEDDED_ONLY=1``, skip: the run is the embedded cluster's only.

    ``make test`` sets it for the extra interpreters' runs, which deselect ``fork`` and
    ``vanilla``; a real server requested at run time (a fixture parameter without its marker,
    resolved with ``request.getfixturevalue``) still gets here.
    """
    if os.environ.get("NSQ_HA_EMBEDDED_ONLY", "") in ("", "0"):
        return
    marker = _SERVER_MARKERS[fixture]
    pytest.skip(
        f"NSQ_HA_EMBEDDED_ONLY: this run uses only the embedded cluster, and this test reached "
        f"the real {marker} servers ({fixture}); give the parameter that selects them "
        f"pytest.mark.{marker} so that -m 'not {marker}' deselects it"
    )


@pytest.fixture(scope="session", name="fork_binaries")
def _fork_binaries(fork_binaries: ServerBinaries) -> ServerBinaries:
    """The plugin's ``fork_binaries``, unless the run is the embedded cluster's only."""
    _embedded_only("fork_binaries")
    return fork_binaries


@pytest.fixture(scope="session", name="vanilla_binaries")
def _vanilla_binaries(vanilla_binaries: ServerBinaries) -> ServerBinaries:
    """The plugin's ``vanilla_binaries``, unless the run is the embedded cluster's only."""
    _embedded_only("vanilla_binaries")
    return vanilla_binaries


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark real-server tests; on PySpark < 4.2, ignore its socket leak in ``spark`` tests."""
    _mark_real_server_tests(items)
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
