"""The benchmark run: servers, peers, interleaved rounds, medians, ratios, a table.

One invocation starts what it needs (one vanilla nsqd 1.3.0; the fork's 3-node cluster when its
binaries are there), installs the peer clients into their own virtualenv under the cache, and
runs every workload for nsq_ha, each peer and the Go reference tools. Rounds interleave the
clients (A/B/C, then B/C/A, ...) so that a slow minute of the machine lands on all of them;
each figure is the median of its rounds, and every ratio compares figures from the same run.

Every client run is a fresh process (:mod:`nsq_ha.bench.drivers`, :mod:`nsq_ha.bench.peers`, or
a Go tool), so the CPU and memory it reports are its own.

The parts: :mod:`~nsq_ha.bench.workloads` (what is run), :mod:`~nsq_ha.bench.stage` (the
servers and topics), :mod:`~nsq_ha.bench.gotools` (the Go tools), :mod:`~nsq_ha.bench.results`
(samples and cells); this module orchestrates them, :mod:`~nsq_ha.bench.report` renders.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from nsq_ha.bench.gotools import GoTools
from nsq_ha.bench.results import BenchError, Cell, Sample, machine
from nsq_ha.bench.stage import Stage, need, open_stage
from nsq_ha.bench.workloads import (
    FORK_WORKLOADS,
    NSQ_HA_CLIENTS,
    PEERS,
    PROFILES,
    SPARK_WORKLOADS,
    VANILLA_WORKLOADS,
    Profile,
    Workload,
    base_spec,
)
from nsq_ha.errors import NsqError
from nsq_ha.testing.build import FORK, VANILLA, BuildError, cache_root

__all__ = [
    "FORK_WORKLOADS",
    "PEERS",
    "PROFILES",
    "RESULT_TAG",
    "VANILLA_WORKLOADS",
    "Bench",
    "BenchError",
    "Cell",
    "Profile",
    "Sample",
    "Workload",
    "ensure_peers",
]

log = logging.getLogger(__name__)

#: how a driver's result line starts (:func:`nsq_ha.bench.measure.emit`)
RESULT_TAG = "NSQ_HA_BENCH_RESULT "


# -- peers' virtualenv ------------------------------------------------------------------------


def ensure_peers(pip_args: Sequence[str] = ()) -> Path:
    """The Python of a virtualenv holding the pinned peers, made on first use (cached)."""
    pins = sorted(f"{name}=={version}" for name, version in PEERS.items())
    tag = hashlib.sha256(
        json.dumps([pins, sys.version_info[:2], list(pip_args)]).encode()
    ).hexdigest()[:10]
    venv = cache_root().parent / f"bench-peers-{tag}"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", *pip_args, *pins],
    ]
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise BenchError(
                f"could not install the peers ({' '.join(pins)}): {' '.join(argv[:4])} "
                f"exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}"
            )
    stamp.write_text(" ".join(pins) + "\n")
    return python


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Bench:
    """A benchmark invocation (see :func:`nsq_ha.bench.run_bench`)."""

    profile: Profile
    use_fork: bool = True
    use_peers: bool = True
    only: tuple[str, ...] = ()
    progress: Callable[[str], None] = print
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    #: the servers, from :meth:`servers` on (kept after it, for the report's workload list)
    stage: Stage | None = None
    peers_python: Path | None = None
    machine: dict[str, str] = field(default_factory=lambda: machine())
    _http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30.0))

    def __post_init__(self) -> None:
        if importlib.util.find_spec("uvloop") is None:
            self.unavailable["nsq_ha-uvloop"] = "uvloop is not installed (the uvloop extra)"
            self.unavailable["floor-uvloop"] = "uvloop is not installed (the uvloop extra)"
        if not self.profile.n_spark:
            self.unavailable["spark"] = f"not in the {self.profile.name} profile"
        elif importlib.util.find_spec("pyspark") is None:
            self.unavailable["spark"] = "pyspark is not installed (the spark extra)"
        elif shutil.which("java") is None:
            self.unavailable["spark"] = "java is not on PATH (Spark needs a JVM)"

    # -- set-up -----------------------------------------------------------------------------

    def workloads(self) -> list[Workload]:
        chosen = list(VANILLA_WORKLOADS)
        if self.stage is not None and self.stage.fork is not None:
            chosen += FORK_WORKLOADS
        if "spark" not in self.unavailable:
            chosen += SPARK_WORKLOADS
        if self.only:
            chosen = [w for w in chosen if any(w.id.startswith(o) for o in self.only)]
        return chosen

    def clients(self, workload: Workload) -> list[str]:
        names = [c for c in workload.clients if c not in self.unavailable]
        if workload.go and "go" not in self.unavailable:
            names.append("go")
        return names

    @contextlib.contextmanager
    def servers(self) -> Iterator[None]:
        with open_stage(self._http, use_fork=self.use_fork) as stage:
            self.stage = stage
            self.versions["vanilla nsqd"] = VANILLA.version
            if stage.fork is None:
                self.unavailable["fork"] = stage.fork_missing
            else:
                self.versions["fork nsqd"] = FORK.version
            yield

    def prepare_peers(self, pip_args: Sequence[str]) -> None:
        if not self.use_peers:
            for name in PEERS:
                self.unavailable[name] = "--no-peers"
            return
        try:
            self.peers_python = ensure_peers(pip_args)
        except BenchError as exc:
            for name in PEERS:
                self.unavailable[name] = str(exc)
            return
        for name, version in PEERS.items():
            self.versions[name] = version

    # -- one run ----------------------------------------------------------------------------

    def _driver_argv(self, client: str, spec: dict[str, Any]) -> list[str]:
        if client in NSQ_HA_CLIENTS:
            return [sys.executable, "-m", "nsq_ha.bench.drivers", json.dumps(spec)]
        python = need(self.peers_python, "the peers' virtualenv")
        script = Path(__file__).with_name("peers.py")
        return [str(python), str(script), json.dumps(spec)]

    def _run_driver(self, client: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        argv = self._driver_argv(client, spec)
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise BenchError(f"timed out after {timeout:.0f} s") from None
        for line in proc.stdout.splitlines():
            if line.startswith(RESULT_TAG):
                result: dict[str, Any] = json.loads(line[len(RESULT_TAG) :])
                return result
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise BenchError(f"exit {proc.returncode}, no result: {' | '.join(tail)[-400:]}")

    def run_one(self, workload: Workload, client: str) -> Sample:
        stage = need(self.stage, "the servers")
        spec = base_spec(self.profile, workload, client)
        stage.place(workload, client, spec)
        try:
            if client == "go":
                result = GoTools(stage, self.profile.go_seconds).run(workload, spec)
                sample = Sample.from_result(result, "go")
                sample.note = result.get("note")
                return sample
            if workload.kind == "consume":
                # more than the run reads: after the channel's last message nsqd holds its
                # output buffer up to 250 ms before flushing, a wait that belongs to no client
                stage.prefill(spec, spec["n"] + max(1000, spec["n"] // 10))
            elif workload.kind == "hold":
                stage.prefill(spec, spec["n"])
            # a Spark run starts a JVM and pays a query's fixed cost (seconds, more under load)
            spark = workload.kind.startswith("spark-")
            timeout = (300.0 if spark else 60.0) + spec["n"] / 1000.0
            return Sample.from_result(self._run_driver(client, spec, timeout), workload.kind)
        finally:
            stage.cleanup(workload, spec)

    # -- rounds -----------------------------------------------------------------------------

    def run_rounds(self) -> None:
        workloads = self.workloads()
        for round_no in range(self.profile.rounds):
            for workload in workloads:
                if workload.max_rounds is not None and round_no >= workload.max_rounds:
                    continue  # (Spark: a JVM start and a warm-up per run; --quick stays < 5 min)
                clients = self.clients(workload)
                shift = round_no % len(clients)
                for client in clients[shift:] + clients[:shift]:
                    cell = self.cells.setdefault((workload.id, client), Cell())
                    started = time.monotonic()
                    try:
                        sample = self.run_one(workload, client)
                    except (BenchError, BuildError, NsqError, httpx.HTTPError, OSError) as exc:
                        sample = Sample(error=str(exc))
                    cell.samples.append(sample)
                    self.progress(
                        f"round {round_no + 1}/{self.profile.rounds} {workload.id:<16} "
                        f"{client:<13} {sample.describe()} ({time.monotonic() - started:.1f} s)"
                    )

    def close(self) -> None:
        self._http.close()
