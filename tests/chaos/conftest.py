"""The chaos suite's fixtures, and its reports in pytest's terminal summary.

Every run's report (tallies, events, seed) is printed at the end of the session and written as
JSON to ``$NSQ_HA_CHAOS_REPORT_DIR`` (default ``.chaos-reports/``), whether it passed or not.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.plugin import unavailable
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

from .history import Report
from .runner import seed_from_env

_REPORTS: list[tuple[str, Report]] = []
#: pairs of report names to print side by side (durable vs default fork topics)
_COMPARISONS: list[tuple[str, str]] = []


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


def keep_comparison(left: str, right: str) -> None:
    """Print the reports named ``left`` and ``right`` side by side in the summary."""
    _COMPARISONS.append((left, right))


def side_by_side(left: tuple[str, Report], right: tuple[str, Report]) -> list[str]:
    """Two reports' main figures as a table, one row a figure."""
    rows: list[tuple[str, str, str]] = [("", left[0], right[0])]

    def row(label: str, get: Callable[[Report], object]) -> None:
        rows.append((label, str(get(left[1])), str(get(right[1]))))

    def kinds(r: Report) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(r.fault_counts.items()))

    row("seed", lambda r: r.seed)
    row("nemesis events", lambda r: r.events)
    row("events by kind", kinds)
    row("acknowledged", lambda r: r.messages)
    row("lost", lambda r: r.lost)
    row("  overwritten by the server", lambda r: r.overwritten)
    row("order violations", lambda r: r.order_violations)
    row("duplicates", lambda r: sum(t.duplicates for t in r.topics))
    row("max recovery (s)", lambda r: "n/a" if r.max_recovery is None else f"{r.max_recovery:.1f}")
    row("unrecovered faults", lambda r: len(r.unrecovered))
    width = [max(len(cells[i]) for cells in rows) for i in range(3)]
    return ["  ".join(c.ljust(w) for c, w in zip(cells, width, strict=True)) for cells in rows]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print every chaos report of the session, and the comparisons side by side."""
    if not _REPORTS:
        return
    terminalreporter.section("chaos reports")
    for name, report in _REPORTS:
        terminalreporter.write_line(report.render(name))
    by_name = dict(_REPORTS)
    for left, right in _COMPARISONS:
        if left in by_name and right in by_name:
            terminalreporter.section(f"side by side: {left} vs {right}")
            for line in side_by_side((left, by_name[left]), (right, by_name[right])):
                terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def fork_seed() -> int:
    """One fault schedule for the module's fork runs, so durable and default compare."""
    return seed_from_env()


@pytest.fixture(scope="module")
def chaos_vanilla(vanilla_binaries: ServerBinaries) -> Iterator[VanillaCluster]:
    """Two vanilla nsqd of the suite's own (the run restarts and pauses them)."""
    with VanillaCluster(vanilla_binaries, node_count=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def chaos_fork(fork_binaries: ServerBinaries) -> Iterator[ForkCluster]:
    """A fork cluster of the suite's own (the run kills its nodes; others share nothing)."""
    if shutil.which("etcd") is None:
        unavailable("fork", "etcd is not on PATH: apt-get install etcd-server")
    with ForkCluster(fork_binaries) as cluster:
        yield cluster
