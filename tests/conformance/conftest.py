"""The ``backend`` fixture (every case runs on the devcluster and on the real fork) and a
terminal summary line counting the outcomes per backend."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from nsq_ha.testing.plugin import required_servers

from .backends import TOPICS, Backend, DevBackend, ForkBackend

BACKENDS = ("devcluster", "fork")
#: node id -> backend of every collected conformance case
_BACKEND_OF: dict[str, str] = {}
#: node id -> final outcome ("passed", "failed", "skipped")
_OUTCOMES: dict[str, str] = {}


@pytest.fixture(
    scope="module",
    params=["devcluster", pytest.param("fork", marks=pytest.mark.fork)],
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A running cluster with every topic of the module's ``TOPICS`` (default
    :data:`~.backends.TOPICS`) created and writable."""
    made: Backend
    if request.param == "fork":
        binaries = request.getfixturevalue("fork_binaries")
        if shutil.which("etcd") is None:
            reason = (
                "etcd is not on PATH (the fork's cluster needs it): apt-get install etcd-server"
            )
            if "fork" in required_servers():
                pytest.fail(reason, pytrace=False)
            pytest.skip(reason)
        made = ForkBackend(binaries)
    else:
        try:
            made = DevBackend()
        except ImportError as exc:  # the emulator is not there (yet)
            pytest.skip(f"nsq_ha.devcluster is not available: {exc}")
    try:
        made.create_topics(getattr(request.module, "TOPICS", TOPICS))
        yield made
    finally:
        made.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Remember which backend each conformance case runs on."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            "conformance" in item.nodeid
            and callspec is not None
            and callspec.params.get("backend") in BACKENDS
        ):
            _BACKEND_OF[item.nodeid] = callspec.params["backend"]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep each case's final outcome: failed beats skipped beats passed."""
    if report.nodeid not in _BACKEND_OF:
        return
    outcome = "failed" if report.failed else "skipped" if report.skipped else "passed"
    if report.when != "call" and outcome == "passed":
        return
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    previous = _OUTCOMES.get(report.nodeid)
    if previous is None or rank[outcome] > rank[previous]:
        _OUTCOMES[report.nodeid] = outcome


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """``conformance: devcluster 57 passed, 0 failed, 0 skipped | fork ...``"""
    if not _OUTCOMES:
        return
    parts = []
    for name in BACKENDS:
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        for nodeid, outcome in _OUTCOMES.items():
            if _BACKEND_OF.get(nodeid) == name:
                counts[outcome] += 1
        parts.append(
            f"{name} {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped"
        )
    terminalreporter.write_line("conformance: " + " | ".join(parts))
