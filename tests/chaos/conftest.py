"""The chaos suite's fixtures, and its reports in pytest's terminal summary.

Every run's report (tallies, events, seed) is printed at the end of the session and written as
JSON to ``$NSQ_HA_CHAOS_REPORT_DIR`` (default ``.chaos-reports/``), whether it passed or not.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.plugin import _unavailable
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

from .history import Report

_REPORTS: list[tuple[str, Report]] = []


def report_dir() -> Path:
    """Where the JSON reports go."""
    return Path(os.environ.get("NSQ_HA_CHAOS_REPORT_DIR", ".chaos-reports"))


def keep_report(name: str, report: Report) -> str:
    """Remember ``report`` for the summary, write its JSON; return its text."""
    _REPORTS.append((name, report))
    out = report_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(report.dumps() + "\n")
    return report.render(name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print every chaos report of the session."""
    if not _REPORTS:
        return
    terminalreporter.section("chaos reports")
    for name, report in _REPORTS:
        terminalreporter.write_line(report.render(name))


@pytest.fixture(scope="module")
def chaos_vanilla(vanilla_binaries: ServerBinaries) -> Iterator[VanillaCluster]:
    """Two vanilla nsqd of the suite's own (the run restarts and pauses them)."""
    with VanillaCluster(vanilla_binaries, node_count=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def chaos_fork(fork_binaries: ServerBinaries) -> Iterator[ForkCluster]:
    """A fork cluster of the suite's own (the run kills its nodes; others share nothing)."""
    if shutil.which("etcd") is None:
        _unavailable("fork", "etcd is not on PATH: apt-get install etcd-server")
    with ForkCluster(fork_binaries) as cluster:
        yield cluster
