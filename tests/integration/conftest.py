"""The ``backend`` fixture: a fork test runs on the embedded broker and on the real fork.

The ``fork`` parameter carries the ``fork`` marker, so ``-m "not fork"`` still runs the
devcluster half; it uses the session's ``fork_cluster``, which skips (or, under
``NSQ_HA_REQUIRE_SERVERS``, fails) when the fork's servers or etcd are missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .backend import Backend, DevBackend, ForkBackend


@pytest.fixture(
    scope="module",
    params=["devcluster", pytest.param("fork", marks=pytest.mark.fork)],
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The module's cluster: a fresh 3-node devcluster, or the session's real fork cluster."""
    made: Backend
    if request.param == "fork":
        made = ForkBackend(request.getfixturevalue("fork_cluster"))
    else:
        made = DevBackend()
    try:
        yield made
    finally:
        made.close()
