"""Benchmarks: nsq_ha against pynsq, gnsq, ansq and the Go reference tools, in one run.

``nsq-ha bench`` (or ``python -m nsq_ha.bench``) is the front door; ``bench/README.md`` in the
repository says what each workload does and how to read the table. The harness lives in the
package (not only in ``bench/``) so that the installed command can run it.

* :mod:`nsq_ha.bench.runner`: the peers' virtualenv, interleaved rounds (orchestration);
* :mod:`nsq_ha.bench.workloads`: the profiles and workloads, the spec of one run;
* :mod:`nsq_ha.bench.stage`: the servers and topics a run is placed on;
* :mod:`nsq_ha.bench.gotools`: the Go reference tools as one more client;
* :mod:`nsq_ha.bench.results`: samples, cells, the machine;
* :mod:`nsq_ha.bench.drivers`: nsq_ha's side of every workload (one process per run);
* :mod:`nsq_ha.bench.peers`: the peers' side, run by the peers' own Python;
* :mod:`nsq_ha.bench.report`: medians, ratios, targets, Markdown and JSON;
* :mod:`nsq_ha.bench.cpu`: the CPU mode, instructions per message under callgrind.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["run_bench"]


def run_bench(
    profile: str = "quick",
    *,
    fork: bool = True,
    peers: bool = True,
    only: Sequence[str] = (),
    json_path: Path | None = None,
    markdown_path: Path | None = None,
    pip_args: Sequence[str] = (),
    strict: bool = False,
    cpu: bool = False,
) -> int:
    """Run the benchmark ``profile`` (smoke, quick, full); print the table; return an exit code.

    ``strict`` (the smoke run of ``make test``): exit 1 if any run failed or any peer could not
    be installed, so that the harness cannot rot unseen. Targets never decide the exit code.
    ``cpu``: the CPU mode instead (:func:`nsq_ha.bench.cpu.run_cpu`, instructions per message
    under callgrind; the smoke profile divides its counts by 10).
    """
    if cpu:
        from nsq_ha.bench.cpu import run_cpu

        previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            return run_cpu(
                profile,
                fork=fork,
                peers=peers,
                only=only,
                json_path=json_path,
                markdown_path=markdown_path,
                pip_args=pip_args,
            )
        finally:
            signal.signal(signal.SIGTERM, previous)
    from nsq_ha.bench.report import Report
    from nsq_ha.bench.runner import PROFILES, Bench

    started = time.monotonic()
    bench = Bench(PROFILES[profile], use_fork=fork, use_peers=peers, only=tuple(only))

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)

    bench.progress = progress
    # a TERM (a CI timeout, kill) unwinds like Ctrl-C, so the servers are stopped, not orphaned
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        progress("installing the peers (pynsq, gnsq, ansq) into their virtualenv if needed")
        bench.prepare_peers(pip_args)
        progress("starting the servers")
        with bench.servers():
            for name, why in sorted(bench.unavailable.items()):
                progress(f"not measured: {name}: {why}")
            bench.run_rounds()
    finally:
        bench.close()
        signal.signal(signal.SIGTERM, previous)
    report = Report(bench)
    text = report.render()
    print(text)
    if json_path is not None:
        json_path.write_text(json.dumps(report.as_json(), indent=2) + "\n")
    if markdown_path is not None:
        markdown_path.write_text(text)
    progress(f"done in {time.monotonic() - started:.0f} s")
    if strict:
        failed = [f"{w}/{c}" for (w, c), cell in bench.cells.items() if cell.errors]
        missing = [p for p in ("pynsq", "gnsq", "ansq", "go") if p in bench.unavailable]
        if failed or missing:
            print(f"bench: failed runs {failed}, missing clients {missing}", file=sys.stderr)
            return 1
    return 0


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
