"""The end-to-end stories in ``scenarios/`` pass, run as a user runs them.

Each script runs as a subprocess (``python scenarios/<name>.py --lookupd URL --messages N``)
against two backends: the embedded cluster (one ``DevClusterThread`` started in this process
for the module) and the real fork cluster (the plugin's session ``fork_cluster``, skipped with
its reason when the fork is not available). Each script also runs once without ``--lookupd``,
starting its own embedded cluster. A run passes when it exits 0 with a last line ``PASSED``;
a failure shows the script's stdout and stderr.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsq_ha.devcluster import DevClusterThread

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"

#: scenario -> (--messages, timeout on the embedded cluster, timeout on the fork) in seconds
SCENARIOS: dict[str, tuple[int, float, float]] = {
    # a leader move on the fork waits for lookupd's /cluster/stats to be stable (up to 240 s)
    "ordered_failover": (400, 120.0, 400.0),
    "sharded_consumers": (600, 120.0, 200.0),
    "trace_pipeline": (200, 120.0, 200.0),
    # Spark local[2]: a streaming read and a batch write, about a minute on the embedded cluster
    "spark_pipeline": (1000, 400.0, 600.0),
}


def _names() -> list[object]:
    """The scenarios as parameters; the Spark ones carry the ``spark`` marker."""
    return [
        pytest.param(n, marks=pytest.mark.spark) if n.startswith("spark_") else n
        for n in sorted(SCENARIOS)
    ]


def _needs(name: str) -> None:
    """Skip a scenario whose extra is not installed (make test installs it)."""
    if name.startswith("spark_"):
        pytest.importorskip("pyspark", reason="pyspark is not installed: pip install -e '.[spark]'")
        from nsq_ha.spark.compat import REPLAYABLE_STREAM_READ, pyspark_version, supports

        if not supports(REPLAYABLE_STREAM_READ):
            pytest.skip(
                f"PySpark {pyspark_version()}: the scenario's replayable streaming read needs "
                "4.2+ (test_spark_versions.py checks the refusal)"
            )


def run_scenario(name: str, timeout: float, *args: str) -> str:
    """Run ``scenarios/<name>.py`` with ``args``; assert it passed; return its stdout."""
    messages = SCENARIOS[name][0]
    argv = [sys.executable, str(SCENARIOS_DIR / f"{name}.py"), "--messages", str(messages), *args]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=SCENARIOS_DIR.parent
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{name} did not finish within {timeout:.0f}s\n"
            f"--- stdout ---\n{_text(exc.stdout)}\n--- stderr ---\n{_text(exc.stderr)}"
        )
    output = f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{output}"
    assert lines, f"{name} printed nothing\n{output}"
    assert lines[-1] == "PASSED", f"{name}: last line {lines[-1]!r}\n{output}"
    return done.stdout


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


@pytest.fixture(scope="module")
def embedded_lookupd() -> Iterator[str]:
    """One embedded 3-node cluster for the module's devcluster runs (topics are unique)."""
    with DevClusterThread(nodes=3) as dev:
        yield dev.lookupd_http


@pytest.fixture(params=["devcluster", pytest.param("fork", marks=pytest.mark.fork)])
def backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(backend id, lookupd HTTP URL); the fork skips with the plugin's reason if unavailable."""
    if request.param == "devcluster":
        return "devcluster", request.getfixturevalue("embedded_lookupd")
    fork = request.getfixturevalue("fork_cluster")
    return "fork", fork.lookupd_http


@pytest.mark.parametrize("name", _names())
def test_scenario(name: str, backend: tuple[str, str]) -> None:
    kind, lookupd = backend
    _, embedded_timeout, fork_timeout = SCENARIOS[name]
    timeout = fork_timeout if kind == "fork" else embedded_timeout
    _needs(name)
    stdout = run_scenario(name, timeout, "--lookupd", lookupd)
    assert f"cluster: {lookupd} (given)" in stdout


@pytest.mark.parametrize("name", _names())
def test_scenario_own_cluster(name: str) -> None:
    _needs(name)
    stdout = run_scenario(name, SCENARIOS[name][1])
    assert "cluster: embedded" in stdout
