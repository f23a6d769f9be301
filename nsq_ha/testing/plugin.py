"""pytest plugin (entry point ``nsq_ha_servers``): session-wide real clusters.

Fixtures:

* ``vanilla_binaries`` / ``fork_binaries``: the built servers (:class:`ServerBinaries`).
* ``vanilla_cluster``: nsqlookupd + 2 nsqd of vanilla NSQ 1.3.0.
* ``fork_cluster``: etcd + nsqlookupd + 3 nsqd of the fork.
* ``devcluster``: the embedded broker (:class:`nsq_ha.devcluster.DevClusterThread`, 3 nodes;
  the ``devcluster`` extra, imported only by this fixture), fresh for each test and started in
  well under a second: for testing your own producers and consumers without Go or etcd.  It
  runs on its own loop thread, so sync and async tests can both use it;
  ``@pytest.mark.devcluster(nodes=1, msg_timeout=2.0)`` passes options.

A server that is not available (not built, no Go, no etcd) *skips* the tests that need it, with
a reason saying how to get it, unless ``NSQ_HA_REQUIRE_SERVERS`` asks for it: ``1``/``all``
requires every server, or a comma list such as ``vanilla,fork`` names them; a required server that
is missing *fails* those tests.  A server that is available but does not start always fails, with
its log tail.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import pytest

from nsq_ha.testing.build import (
    FORK,
    VANILLA,
    ServerBinaries,
    ServerRecipe,
    find_built,
    how_to_get,
    last_failure,
)
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

if TYPE_CHECKING:
    from nsq_ha.devcluster import DevClusterThread

__all__ = [
    "devcluster",
    "fork_binaries",
    "fork_cluster",
    "required_servers",
    "unavailable",
    "vanilla_binaries",
    "vanilla_cluster",
]

ALL_SERVERS = frozenset({"vanilla", "fork"})


def required_servers() -> frozenset[str]:
    """The servers ``NSQ_HA_REQUIRE_SERVERS`` makes mandatory."""
    raw = os.environ.get("NSQ_HA_REQUIRE_SERVERS", "").strip().lower()
    if raw in ("", "0", "false", "no", "none"):
        return frozenset()
    if raw in ("1", "true", "yes", "all"):
        return ALL_SERVERS
    names = frozenset(part.strip() for part in raw.split(",") if part.strip())
    unknown = names - ALL_SERVERS
    if unknown:
        raise pytest.UsageError(
            f"NSQ_HA_REQUIRE_SERVERS names unknown servers {sorted(unknown)}; "
            f"use 1, all, or a comma list of {sorted(ALL_SERVERS)}"
        )
    return names


def unavailable(name: str, reason: str) -> NoReturn:
    """Skip (or fail, when required) the current test because server ``name`` is missing."""
    if name in required_servers():
        pytest.fail(f"{reason} [NSQ_HA_REQUIRE_SERVERS requires {name!r}]", pytrace=False)
    pytest.skip(reason)


def _binaries(recipe: ServerRecipe) -> ServerBinaries:
    found = find_built(recipe)
    if found is not None:
        return found
    why = last_failure(recipe) or "no build found in the cache"
    unavailable(
        recipe.name,
        f"{recipe.name} NSQ servers ({recipe.module} {recipe.version}) are not built: "
        f"{why.strip()} -- {how_to_get(recipe)}",
    )


@pytest.fixture(scope="session")
def vanilla_binaries() -> ServerBinaries:
    """Vanilla nsqd/nsqlookupd 1.3.0 (+ bench tools), built by ``make servers``."""
    return _binaries(VANILLA)


@pytest.fixture(scope="session")
def fork_binaries() -> ServerBinaries:
    """The fork's nsqd/nsqlookupd, built by ``make servers``."""
    return _binaries(FORK)


@pytest.fixture(scope="session")
def vanilla_cluster(vanilla_binaries: ServerBinaries) -> Iterator[VanillaCluster]:
    """A running vanilla cluster shared by the whole session."""
    with VanillaCluster(vanilla_binaries) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def fork_cluster(fork_binaries: ServerBinaries) -> Iterator[ForkCluster]:
    """A running fork cluster (etcd + nsqlookupd + 3 nsqd) shared by the whole session."""
    if shutil.which("etcd") is None:
        unavailable(
            "fork",
            "etcd is not on PATH (the fork's cluster needs it): apt-get install etcd-server",
        )
    with ForkCluster(fork_binaries) as cluster:
        yield cluster


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``devcluster`` marker (options for the ``devcluster`` fixture)."""
    config.addinivalue_line(
        "markers",
        "devcluster(**options): options for the devcluster fixture (nodes=, msg_timeout=, ...)",
    )


@pytest.fixture
def devcluster(request: pytest.FixtureRequest) -> Iterator[DevClusterThread]:
    """A fresh embedded fork cluster for this test (3 nodes unless the marker says).

    The embedded broker is imported here, not when pytest loads the plugin: every session of
    every user with nsq-ha installed loads the plugin; only this fixture needs the broker (the
    ``devcluster`` extra: ``pip install 'nsq-ha[test,devcluster]'``).
    """
    from nsq_ha.devcluster import DevClusterThread

    marker = request.node.get_closest_marker("devcluster")
    options = dict(marker.kwargs) if marker is not None else {}
    with DevClusterThread(**options) as cluster:
        yield cluster
