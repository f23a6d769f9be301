"""Shared test configuration; the real-server fixtures come from the nsq_ha.testing plugin."""

from __future__ import annotations

import os

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


class _EmbeddedOnly:
    """Skip a test that reaches a real server: ``make test``'s extra interpreters' runs.

    Those runs are the embedded cluster's only and deselect ``fork`` and ``vanilla``; a server
    requested at run time (a fixture parameter without its marker) still gets here.  A plugin
    rather than a conftest hook: the real servers are session fixtures, whose setup hooks are
    the rootdir's, above this directory.
    """

    @pytest.hookimpl(tryfirst=True)  # before the plugin's fixture reaches for the server
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
    ) -> None:
        marker = _SERVER_MARKERS.get(fixturedef.argname)
        if marker is not None:
            pytest.skip(
                f"NSQ_HA_EMBEDDED_ONLY: this run uses only the embedded cluster, and this test "
                f"reached the real {marker} servers ({fixturedef.argname}); give the parameter "
                f"that selects them pytest.mark.{marker} so that -m 'not {marker}' deselects it"
            )


def pytest_configure(config: pytest.Config) -> None:
    """Under ``NSQ_HA_EMBEDDED_ONLY=1`` (set by ``make test-3.12`` etc.), no real server runs."""
    if os.environ.get("NSQ_HA_EMBEDDED_ONLY", "") not in ("", "0"):
        config.pluginmanager.register(_EmbeddedOnly(), "nsq_ha_embedded_only")


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
