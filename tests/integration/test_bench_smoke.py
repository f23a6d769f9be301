"""``nsq-ha bench --smoke`` runs every workload for every client, so the harness cannot rot.

Tiny sizes and no thresholds: speed is never asserted here (the table of ``--quick``/``--full``
is the measurement). What is asserted is that each run produced its figure: nsq_ha, the three
peers in their own virtualenv, and the Go tools, on vanilla nsqd and (when it is built) the
fork's cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nsq_ha.bench.runner import FORK_WORKLOADS, VANILLA_WORKLOADS
from nsq_ha.testing.build import FORK, find_built

pytestmark = [pytest.mark.bench, pytest.mark.vanilla]


def test_bench_smoke_measures_every_client_and_workload(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    fork = find_built(FORK) is not None
    argv = [sys.executable, "-m", "nsq_ha.bench", "--smoke", "--json", str(out)]
    if not fork:
        argv.append("--no-fork")
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=900, check=False, env=dict(os.environ)
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    report = json.loads(out.read_text())
    results = report["results"]
    workloads = list(VANILLA_WORKLOADS) + (list(FORK_WORKLOADS) if fork else [])
    for workload in workloads:
        clients = list(workload.clients) + (["go"] if workload.go else [])
        for client in clients:
            cell = results.get(f"{workload.id}/{client}")
            assert cell is not None, f"{workload.id}/{client} was not run"
            figure = {"hold": "median_rss_mb", "latency": "median_p99_ms"}.get(
                workload.kind, "median_rate"
            )
            assert (cell[figure] or 0) > 0, (workload.id, client, cell)
    assert "| target |" in proc.stdout  # the table was printed
    assert {t["name"] for t in report["targets"]} >= {"consumer RSS, 10k in flight"}


def test_bench_cpu_mode_counts_instructions_per_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CPU mode on one workload (nsq_ha consuming from vanilla nsqd) at a tenth of its
    counts: a positive figure and its table line; the figure itself is not judged."""
    from nsq_ha.bench.cpu import run_cpu

    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (apt-get install valgrind) for `bench --cpu`")
    out = tmp_path / "cpu.json"
    code = run_cpu(
        "smoke", fork=False, peers=False, only=["consume"], clients=["nsq_ha"], json_path=out
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err[-4000:]
    cell = json.loads(out.read_text())["results"]["consume/nsq_ha"]
    assert cell["counts"] == [200, 600]
    assert cell["ir"][1] > cell["ir"][0] > 0
    assert cell["instructions_per_message"] > 0
    row = next(line for line in printed.out.splitlines() if line.startswith("| consume,"))
    assert row.startswith("| consume, FIN each (RDY 2500) | 200, 600 | "), row
