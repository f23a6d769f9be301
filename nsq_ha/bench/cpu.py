"""The bench's CPU mode (``nsq-ha bench --cpu``): instructions per message under callgrind.

Wall-clock rates on a shared machine move with whatever else runs; the number of instructions a
program executes for the same input does not. Each (workload, client) driver process, the same
one the wall-clock mode runs, is run twice under ``valgrind --tool=callgrind`` (the servers stay
outside valgrind), for two message counts ``n1 < n2``; the figure is
``(Ir(n2) - Ir(n1)) / (n2 - n1)``, which cancels everything both runs do alike (interpreter
start, imports, connecting, the warm-up publish, closing).

So that both runs execute the same code: the drivers import a snapshot of ``nsq_ha`` copied and
byte-compiled once per invocation (an edit of the working tree, or another process writing a
fresher ``.pyc`` between the two runs, would otherwise add a compile to one of them), with
``PYTHONHASHSEED=0`` and no ``.pyc`` writing. Valgrind runs the virtualenv's ``python`` by the
path the virtualenv gives (resolving the symlink would lose the virtualenv) and does not
follow children.
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from nsq_ha.bench.results import BenchError
from nsq_ha.bench.runner import RESULT_TAG, Bench
from nsq_ha.bench.stage import need
from nsq_ha.bench.workloads import (
    FORK_WORKLOADS,
    NSQ_HA_CLIENTS,
    PEERS,
    PROFILES,
    VANILLA_WORKLOADS,
    Workload,
    base_spec,
)
from nsq_ha.errors import NsqError
from nsq_ha.testing.build import BuildError

__all__ = [
    "CPU_CLIENTS",
    "CPU_WORKLOADS",
    "CpuBench",
    "CpuCell",
    "CpuWorkload",
    "callgrind_argv",
    "read_ir",
    "run_cpu",
]

#: a folder to keep each run's callgrind output in (``<workload>.<client>.<n>.out``), to see
#: with ``callgrind_annotate`` where the instructions went (the difference of the two counts)
KEEP_ENV = "NSQ_HA_BENCH_KEEP_CALLGRIND"

#: a callgrind run of a few thousand messages takes a minute or two (more on a loaded
#: machine); this bounds a stuck one
RUN_TIMEOUT = 1800.0
#: the drivers' lookup deadline under valgrind (the default is 5 s)
LOOKUP_TIMEOUT = 120.0
#: the table's columns, in order
CPU_CLIENTS = (
    "nsq_ha",
    "nsq_ha-uvloop",
    "nsq_ha-batch",
    "nsq_ha-sync",
    *PEERS,
    "floor",
    "floor-uvloop",
    "raw",
)
_LABELS = {
    "nsq_ha-uvloop": "nsq_ha uvloop",
    "nsq_ha-batch": "nsq_ha batch",
    "nsq_ha-sync": "nsq_ha sync",
    "floor": "asyncio floor",
    "floor-uvloop": "uvloop floor",
    "raw": "raw socket",
}


@dataclass(frozen=True, slots=True)
class CpuWorkload:
    """A row of the CPU table: a wall-clock workload's drivers, at two message counts."""

    id: str
    title: str
    workload: Workload
    clients: tuple[str, ...]
    counts: tuple[int, int]

    def scaled(self, divisor: int) -> tuple[int, int]:
        """The counts divided by ``divisor`` (the smoke run), kept a multiple of the tasks."""
        step = max(self.workload.concurrency * self.workload.batch, 1)
        return (
            self.counts[0] // divisor // step * step,
            max(self.counts[1] // divisor // step * step, step),
        )


def _workload(wid: str) -> Workload:
    return next(w for w in VANILLA_WORKLOADS + FORK_WORKLOADS if w.id == wid)


_PUBLISHERS = ("nsq_ha", "nsq_ha-uvloop", *PEERS)
_TASKS = (1, 100, 2000)
_FORK_PUB = ((True, True), (True, False), (False, False))


def _fork_pub(tasks: int, *, keyed: bool, cold: bool) -> CpuWorkload:
    """A one-message-per-call row on the fork's 4-partition topic, through lookupd.

    Cold: both counts run from a fresh producer, the count starting before its first publish;
    their difference cancels the lookup and the connections, and keeps what the start leaves
    behind for the rest of the run (calls that took turns for ever sent one message per
    command). Warm: after one publish (keyed if the row is). Both counts are multiples of every
    task count, so every task publishes the same number of messages."""
    base = _workload("fork-keyed-cold-100" if cold else "fork-keyed")
    name = ("keyed" if keyed else "unkeyed") + (", cold" if cold else ", warm")
    wid = f"fork-{'keyed' if keyed else 'unkeyed'}{'-cold' if cold else ''}-{tasks}"
    return CpuWorkload(
        wid,
        f"fork, 4 partitions: {name} publish ({tasks} concurrent)",
        replace(base, id=wid, concurrency=tasks, keyed=keyed),
        ("nsq_ha", "nsq_ha-uvloop") if tasks == 100 else ("nsq_ha",),
        (2000, 6000),
    )


CPU_WORKLOADS = (
    CpuWorkload(
        "consume",
        "consume, FIN each (RDY 2500)",
        _workload("consume"),
        ("nsq_ha", "nsq_ha-uvloop", "nsq_ha-batch", "nsq_ha-sync", *PEERS),
        (2000, 6000),
    ),
    CpuWorkload(
        "pub1",
        "publish, one message per call (100 concurrent)",
        _workload("pub1"),
        _PUBLISHERS,
        (2000, 6000),
    ),
    CpuWorkload(
        "pubmany",
        "publish_many, batches of 100 (4 concurrent)",
        _workload("pubmany"),
        _PUBLISHERS,
        (10000, 50000),
    ),
    # one message per call on the fork's 4-partition topic through lookupd, at 1, 100 and 2000
    # tasks: keyed from a fresh producer (cold), keyed after one keyed publish (warm), unkeyed
    *(_fork_pub(tasks, keyed=keyed, cold=cold) for keyed, cold in _FORK_PUB for tasks in _TASKS),
    CpuWorkload(
        "fork-ordered",
        "fork: ordered consume of one partition (SUB_ORDERED), FIN each",
        _workload("fork-ordered"),
        ("nsq_ha", "nsq_ha-uvloop", "floor", "floor-uvloop", "raw"),
        (500, 1500),
    ),
)


# -- callgrind --------------------------------------------------------------------------------


def callgrind_argv(out_file: Path) -> list[str]:
    """The valgrind prefix of a driver's command line."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise BenchError(
            "valgrind is not on PATH: install it (apt-get install valgrind) to use --cpu"
        )
    return [
        valgrind,
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        "--trace-children=no",
    ]


_VALGRIND_LINE = re.compile(r"^==\d+==")
_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def read_ir(text: str) -> int:
    """The total instruction count (``Ir``) of a callgrind output file's text."""
    found = _TOTAL.search(text)
    if found is None:
        raise BenchError("callgrind wrote no summary:/totals: line (did the driver crash?)")
    return int(found.group(1))


@contextlib.contextmanager
def snapshot() -> Iterator[Path]:
    """A byte-compiled copy of the ``nsq_ha`` package the drivers import (see the module
    docstring), removed afterwards."""
    import nsq_ha

    with tempfile.TemporaryDirectory(prefix="nsq_ha-cpu-") as tmp:
        root = Path(tmp)
        shutil.copytree(
            Path(nsq_ha.__file__).parent,
            root / "nsq_ha",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        compileall.compile_dir(root / "nsq_ha", quiet=1)
        yield root


# -- the run ----------------------------------------------------------------------------------


@dataclass
class CpuCell:
    """One (workload, client): the instructions of its two runs."""

    counts: tuple[int, int]
    ir: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def per_message(self) -> float | None:
        if self.error or len(self.ir) != 2 or self.counts[1] <= self.counts[0]:
            return None
        return (self.ir[1] - self.ir[0]) / (self.counts[1] - self.counts[0])


@dataclass
class CpuBench:
    """A CPU-mode invocation: the wall-clock :class:`Bench` provides the servers, the peers'
    virtualenv and what is unavailable; this runs its drivers under callgrind."""

    bench: Bench
    divisor: int = 1
    clients_only: tuple[str, ...] = ()
    cells: dict[tuple[str, str], CpuCell] = field(default_factory=dict)
    progress: Callable[[str], None] = print
    root: Path | None = None  # the snapshot the drivers import

    def workloads(self) -> list[CpuWorkload]:
        stage = self.bench.stage
        fork = stage is not None and stage.fork is not None
        chosen = [w for w in CPU_WORKLOADS if fork or w.workload.server == "vanilla"]
        if self.bench.only:
            chosen = [w for w in chosen if any(w.id.startswith(o) for o in self.bench.only)]
        return chosen

    def clients(self, workload: CpuWorkload) -> list[str]:
        names = [c for c in workload.clients if c not in self.bench.unavailable]
        if self.clients_only:
            names = [c for c in names if c in self.clients_only]
        return names

    def _argv(self, client: str, spec: dict[str, Any], out_file: Path) -> list[str]:
        root = need(self.root, "the snapshot of nsq_ha")
        if client in NSQ_HA_CLIENTS:
            # the virtualenv's python by its own path (not resolved: that would lose the venv)
            driver = [sys.executable, "-m", "nsq_ha.bench.drivers"]
        else:
            python = need(self.bench.peers_python, "the peers' virtualenv")
            driver = [str(python), str(root / "nsq_ha" / "bench" / "peers.py")]
        return [*callgrind_argv(out_file), *driver, json.dumps(spec)]

    def _env(self) -> dict[str, str]:
        root = need(self.root, "the snapshot of nsq_ha")
        env = dict(os.environ)
        env.update(PYTHONPATH=str(root), PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
        return env

    def measure(self, cpu: CpuWorkload, client: str, n: int) -> int:
        """The instructions of one driver run of ``n`` messages."""
        stage = need(self.bench.stage, "the servers")
        workload = cpu.workload
        spec = base_spec(self.bench.profile, workload, client)
        spec["n"] = n
        stage.place(workload, client, spec)
        if "lookupd" in spec:
            # under valgrind the first /lookup (httpx's set-up included) outlasts the lookup
            # client's default 5 s, and a lookupd that never answered is not asked again
            spec["lookup_timeout"] = LOOKUP_TIMEOUT
        try:
            if workload.kind == "consume":
                # exactly what it reads: messages delivered beyond ``n`` would be decoded, or
                # not, as timing has it (the wall-clock mode's surplus saves nsqd's 250 ms
                # output-buffer flush, a wait that costs no instructions)
                stage.prefill(spec, n)
            with tempfile.TemporaryDirectory(prefix="nsq_ha-callgrind-") as tmp:
                out_file = Path(tmp) / "callgrind.out"
                argv = self._argv(client, spec, out_file)
                try:
                    proc = subprocess.run(
                        argv,
                        capture_output=True,
                        text=True,
                        timeout=RUN_TIMEOUT,
                        check=False,
                        env=self._env(),
                        # not the caller's directory: ``-m`` puts it first on sys.path, and a
                        # checkout there would be imported instead of the snapshot
                        cwd=need(self.root, "the snapshot of nsq_ha"),
                    )
                except subprocess.TimeoutExpired:
                    raise BenchError(f"timed out after {RUN_TIMEOUT:.0f} s") from None
                if proc.returncode != 0 or RESULT_TAG not in proc.stdout:
                    # the driver's last words, not valgrind's closing summary (``==pid== ...``)
                    mine = [
                        line
                        for line in (proc.stderr or proc.stdout).strip().splitlines()
                        if not _VALGRIND_LINE.match(line)
                    ]
                    tail = mine[-3:]
                    raise BenchError(
                        f"exit {proc.returncode}, no result: {' | '.join(tail)[-400:]}"
                    )
                keep = os.environ.get(KEEP_ENV)
                if keep:  # for callgrind_annotate: where the instructions went
                    Path(keep).mkdir(parents=True, exist_ok=True)
                    shutil.copy(out_file, Path(keep) / f"{cpu.id}.{client}.{n}.out")
                return read_ir(out_file.read_text(errors="replace"))
        finally:
            stage.cleanup(workload, spec)

    def run(self) -> None:
        with snapshot() as root:
            self.root = root
            try:
                for cpu in self.workloads():
                    for client in self.clients(cpu):
                        self._run_cell(cpu, client)
            finally:
                self.root = None

    def _run_cell(self, cpu: CpuWorkload, client: str) -> None:
        counts = cpu.scaled(self.divisor) if self.divisor > 1 else cpu.counts
        cell = self.cells.setdefault((cpu.id, client), CpuCell(counts))
        started = time.monotonic()
        try:
            for n in counts:
                cell.ir.append(self.measure(cpu, client, n))
        except (BenchError, BuildError, NsqError, httpx.HTTPError, OSError) as exc:
            cell.error = str(exc)
        figure = (
            f"ERROR {cell.error}"
            if cell.error
            else f"{_k(cell.per_message)}k instructions/message (Ir {cell.ir})"
        )
        self.progress(
            f"cpu {cpu.id:<16} {client:<13} n={counts[0]},{counts[1]}: {figure} "
            f"({time.monotonic() - started:.1f} s)"
        )

    # -- output -----------------------------------------------------------------------------

    def columns(self) -> list[str]:
        return [c for c in CPU_CLIENTS if any(k[1] == c for k in self.cells)]

    def markdown(self) -> str:
        """The table: workload x client, thousands of instructions per message."""
        columns = self.columns()
        lines = [
            "| workload (k instructions/message) | n1, n2 | "
            + " | ".join(_LABELS.get(c, c) for c in columns)
            + " |",
            "|---|---:|" + "---:|" * len(columns),
        ]
        for cpu in self.workloads():
            cells = [self.cells.get((cpu.id, c)) for c in columns]
            if not any(cells):
                continue
            counts = next(c.counts for c in cells if c is not None)
            shown = [_cell_text(c) for c in cells]
            lines.append(
                f"| {cpu.title} | {counts[0]:,}, {counts[1]:,} | " + " | ".join(shown) + " |"
            )
        return "\n".join(lines)

    def render(self) -> str:
        m = self.bench.machine
        versions = ", ".join(f"{k} {v}" for k, v in sorted(self.bench.versions.items()))
        missing = "; ".join(f"{k}: {v}" for k, v in sorted(self.bench.unavailable.items()))
        head = (
            f"Measured {m['date']} with `nsq-ha bench --cpu`: instructions per message under "
            f"valgrind --tool=callgrind, (Ir(n2) - Ir(n1)) / (n2 - n1), the servers outside "
            f"valgrind; Python {m['python']}, {m['os']}; {versions}."
        )
        if missing:
            head += f" Not measured: {missing}."
        errors = [
            f"- `{wid}` {client} failed: {cell.error}"
            for (wid, client), cell in sorted(self.cells.items())
            if cell.error
        ]
        parts = [head, "", self.markdown()]
        if errors:
            parts += ["", *errors]
        return "\n".join(parts) + "\n"

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": "cpu",
            "machine": self.bench.machine,
            "versions": self.bench.versions,
            "unavailable": self.bench.unavailable,
            "results": {
                f"{wid}/{client}": {
                    "counts": list(cell.counts),
                    "ir": cell.ir,
                    "instructions_per_message": cell.per_message,
                    "error": cell.error,
                }
                for (wid, client), cell in sorted(self.cells.items())
            },
        }


def _k(value: float | None) -> str:
    return "-" if value is None else f"{value / 1000:,.1f}"


def _cell_text(cell: CpuCell | None) -> str:
    if cell is None:
        return ""
    return "failed" if cell.error else _k(cell.per_message)


def run_cpu(
    profile: str = "quick",
    *,
    fork: bool = True,
    peers: bool = True,
    only: Sequence[str] = (),
    clients: Sequence[str] = (),
    json_path: Path | None = None,
    markdown_path: Path | None = None,
    pip_args: Sequence[str] = (),
) -> int:
    """The CPU mode: print the instructions table; exit 1 if a run failed (0 otherwise).

    ``profile`` ``smoke`` divides the counts by 10; ``clients`` keeps only those columns.
    """
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)

    bench = Bench(PROFILES[profile], use_fork=fork, use_peers=peers, only=tuple(only))
    bench.progress = progress
    cpu = CpuBench(bench, divisor=10 if profile == "smoke" else 1, clients_only=tuple(clients))
    cpu.progress = progress
    try:
        callgrind_argv(Path(os.devnull))  # no valgrind: say so before starting anything
        if peers:
            progress("installing the peers (pynsq, gnsq, ansq) into their virtualenv if needed")
        bench.prepare_peers(pip_args)
        progress("starting the servers")
        with bench.servers():
            for name, why in sorted(bench.unavailable.items()):
                progress(f"not measured: {name}: {why}")
            cpu.run()
    except BenchError as exc:
        print(f"bench --cpu: {exc}", file=sys.stderr)
        return 1
    finally:
        bench.close()
    text = cpu.render()
    print(text)
    if json_path is not None:
        json_path.write_text(json.dumps(cpu.as_json(), indent=2) + "\n")
    if markdown_path is not None:
        markdown_path.write_text(text)
    progress(f"done in {time.monotonic() - started:.0f} s")
    return 1 if any(cell.error for cell in cpu.cells.values()) else 0
