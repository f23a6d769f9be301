"""The benchmark run: servers, peers, interleaved rounds, medians, ratios, a table.

One invocation starts what it needs (one vanilla nsqd 1.3.0; the fork's 3-node cluster when its
binaries are there), installs the peer clients into their own virtualenv under the cache, and
runs every workload for nsq_ha, each peer and the Go reference tools. Rounds interleave the
clients (A/B/C, then B/C/A, ...) so that a slow minute of the machine lands on all of them;
each figure is the median of its rounds, and every ratio compares figures from the same run.

Every client run is a fresh process (:mod:`nsq_ha.bench.drivers`, :mod:`nsq_ha.bench.peers`, or
a Go tool), so the CPU and memory it reports are its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from nsq_ha._version import __version__
from nsq_ha.bench import measure
from nsq_ha.errors import NsqError
from nsq_ha.testing.build import (
    FORK,
    VANILLA,
    BuildError,
    ServerBinaries,
    cache_root,
    ensure_built,
    find_built,
    last_failure,
)
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

log = logging.getLogger(__name__)

#: the peer clients and the versions the issue's figures were taken with
PEERS = {"pynsq": "0.9.1", "gnsq": "1.0.2", "ansq": "0.3.0"}
RESULT_TAG = "NSQ_HA_BENCH_RESULT "
#: messages per second published in the latency workload
LATENCY_RATE = 10_000


_T = TypeVar("_T")


class BenchError(RuntimeError):
    """A run that could not be set up or measured."""


@dataclass(frozen=True, slots=True)
class Profile:
    """How big a run is. ``quick`` must stay under 5 minutes on a 2-core machine."""

    name: str
    n: int  # messages per publish/consume run on vanilla and fork replica 1
    n_slow: int  # messages per one-message run on fork replica 3 (a replication RTT each)
    n_ordered: int  # messages per ordered-consume run (one round trip each)
    hold: int  # messages held in flight for the memory figure
    rounds: int
    latency_seconds: float
    go_seconds: float  # bench_writer/bench_reader --runfor


PROFILES = {
    "smoke": Profile("smoke", 2000, 500, 300, 1000, 1, 0.5, 0.3),
    "quick": Profile("quick", 20000, 5000, 2000, 10000, 3, 1.5, 1.0),
    "full": Profile("full", 100000, 20000, 10000, 10000, 5, 5.0, 3.0),
}


@dataclass(frozen=True, slots=True)
class Workload:
    """One row group of the table: what is run, where, and by which clients."""

    id: str
    title: str
    server: str  # "vanilla" or a fork topic id
    kind: str  # the drivers' workload: pub1, pubmany, consume, latency, hold
    clients: tuple[str, ...]
    go: str | None = None  # "writer:<batch>" or "reader"
    batch: int = 1
    concurrency: int = 100
    rdy: int = 2500
    keyed: bool = False
    ordered: bool = False
    slow: bool = False


VANILLA_WORKLOADS = (
    Workload(
        "pub1",
        "publish, one message per call (100 concurrent)",
        "vanilla",
        "pub1",
        ("nsq_ha", "pynsq", "gnsq", "ansq"),
        go="writer:1",
    ),
    Workload(
        "pubmany",
        "publish_many, batches of 100 (4 concurrent)",
        "vanilla",
        "pubmany",
        ("nsq_ha", "pynsq", "gnsq", "ansq"),
        go="writer:100",
        batch=100,
        concurrency=4,
    ),
    Workload(
        "consume",
        "consume, FIN each (RDY 2500)",
        "vanilla",
        "consume",
        ("nsq_ha", "nsq_ha-batch", "nsq_ha-sync", "pynsq", "gnsq", "ansq"),
        go="reader",
    ),
    Workload(
        "latency",
        "publish->deliver latency at 10k msgs/s",
        "vanilla",
        "latency",
        ("nsq_ha", "pynsq", "gnsq", "ansq"),
    ),
    Workload(
        "hold",
        "consumer memory, 10k messages in flight",
        "vanilla",
        "hold",
        # not gnsq: it starts at RDY 1 and raises it only as messages are finished
        ("nsq_ha", "pynsq", "ansq"),
        rdy=10000,
    ),
)

#: fork topics: id -> (partitions, replicas, ordered, durable); a durable topic fsyncs every
#: write before acknowledging it (syncdisk=1: README, "Durability on the fork")
FORK_TOPICS = {
    "r1": (1, 1, False, False),
    "r3": (1, 3, False, False),
    "r3d": (1, 3, False, True),
    "k4": (4, 1, False, False),
    "ord": (1, 1, True, False),
}

FORK_WORKLOADS = (
    Workload(
        "fork-pub1-r1",
        "fork, replica 1: publish, one message per call (100 concurrent)",
        "r1",
        "pub1",
        ("nsq_ha", "nsq_ha-direct", "pynsq", "gnsq", "ansq"),
        go="writer:1",
    ),
    Workload(
        "fork-pub1-r3",
        "fork, replica 3: publish, one message per call (100 concurrent)",
        "r3",
        "pub1",
        ("nsq_ha", "nsq_ha-direct", "pynsq", "gnsq", "ansq"),
        go="writer:1",
        slow=True,
    ),
    Workload(
        "fork-pubmany-r1",
        "fork, replica 1: publish_many, batches of 100 (4 concurrent)",
        "r1",
        "pubmany",
        ("nsq_ha", "nsq_ha-direct", "pynsq", "gnsq", "ansq"),
        go="writer:100",
        batch=100,
        concurrency=4,
    ),
    Workload(
        "fork-pubmany-r3",
        "fork, replica 3: publish_many, batches of 100 (4 concurrent)",
        "r3",
        "pubmany",
        ("nsq_ha", "pynsq", "ansq"),
        go="writer:100",
        batch=100,
        concurrency=4,
    ),
    Workload(
        "fork-pub1-r3d",
        "fork, replica 3, durable: publish, one message per call (100 concurrent)",
        "r3d",
        "pub1",
        ("nsq_ha",),
        go="writer:1",
        slow=True,
    ),
    Workload(
        "fork-pubmany-r3d",
        "fork, replica 3, durable: publish_many, batches of 100 (4 concurrent)",
        "r3d",
        "pubmany",
        ("nsq_ha",),
        go="writer:100",
        batch=100,
        concurrency=4,
    ),
    Workload(
        "fork-keyed",
        "fork, 4 partitions: keyed publish, one message per call (100 concurrent)",
        "k4",
        "pub1",
        ("nsq_ha",),
        keyed=True,
    ),
    Workload(
        "fork-ordered",
        "fork: ordered consume of one partition (SUB_ORDERED)",
        "ord",
        "consume",
        ("nsq_ha", "raw"),
        ordered=True,
        slow=True,
    ),
)

_NSQ_HA_CLIENTS = {"nsq_ha", "nsq_ha-direct", "nsq_ha-batch", "nsq_ha-sync", "raw"}


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


# -- results ------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One client's run of one workload in one round."""

    rate: float | None = None  # messages per second
    cpu_per_100k: float | None = None
    rss_mb: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    error: str | None = None
    note: str | None = None


@dataclass
class Cell:
    """Everything one (workload, client) pair measured, over the rounds."""

    samples: list[Sample] = field(default_factory=list)

    def median(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.samples if getattr(s, name) is not None]
        return statistics.median(values) if values else None

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.samples if s.error]

    @property
    def notes(self) -> list[str]:
        return sorted({s.note for s in self.samples if s.note})


def _sample_from(result: dict[str, Any], kind: str) -> Sample:
    count, seconds = result.get("count", 0), result.get("seconds", 0.0)
    sample = Sample()
    if count and seconds > 0 and kind != "hold":
        sample.rate = count / seconds
    if count and "cpu" in result and kind not in ("hold", "latency"):
        sample.cpu_per_100k = result["cpu"] / count * 100_000
    if kind == "hold":
        sample.rss_mb = result.get("rss_mb")
    if kind == "latency":
        sample.p50_ms, sample.p99_ms = result.get("p50_ms"), result.get("p99_ms")
        notes = []
        if result.get("errors"):
            notes.append(f"{result['errors']} publish errors")
        if sample.rate is not None and sample.rate < 0.8 * LATENCY_RATE:
            # a client that cannot keep the pace is measured at a lighter load: say so
            notes.append(f"kept only {sample.rate / 1000:.1f}k of {LATENCY_RATE // 1000}k msgs/s")
        sample.note = "; ".join(notes) or None
    return sample


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Bench:
    """A benchmark invocation (see :func:`run`)."""

    profile: Profile
    use_fork: bool = True
    use_peers: bool = True
    only: tuple[str, ...] = ()
    progress: Callable[[str], None] = print
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    vanilla: VanillaCluster | None = None
    fork: ForkCluster | None = None
    fork_topics: dict[str, str] = field(default_factory=dict)
    peers_python: Path | None = None
    vanilla_bin: ServerBinaries | None = None
    machine: dict[str, str] = field(default_factory=lambda: machine())
    _seq: int = 0
    _http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30.0))

    # -- set-up -----------------------------------------------------------------------------

    def workloads(self) -> list[Workload]:
        chosen = list(VANILLA_WORKLOADS)
        if self.fork is not None:
            chosen += FORK_WORKLOADS
        if self.only:
            chosen = [w for w in chosen if any(w.id.startswith(o) for o in self.only)]
        return chosen

    def clients(self, workload: Workload) -> list[str]:
        names = [c for c in workload.clients if c in _NSQ_HA_CLIENTS or c not in self.unavailable]
        if workload.go and "go" not in self.unavailable:
            names.append("go")
        return names

    @contextlib.contextmanager
    def servers(self) -> Iterator[None]:
        self.vanilla_bin = ensure_built(VANILLA)
        self.versions["vanilla nsqd"] = VANILLA.version
        with VanillaCluster(
            self.vanilla_bin, node_count=1, nsqd_args=["--max-rdy-count=10000"]
        ) as vanilla:
            self.vanilla = vanilla
            with self._fork_cluster() as fork:
                self.fork = fork
                yield

    @contextlib.contextmanager
    def _fork_cluster(self) -> Iterator[ForkCluster | None]:
        binaries = find_built(FORK) if self.use_fork else None
        if binaries is None:
            why = "--no-fork" if not self.use_fork else (last_failure(FORK) or "not built")
            self.unavailable["fork"] = why.strip().splitlines()[-1][:300]
            yield None
            return
        if shutil.which("etcd") is None:
            self.unavailable["fork"] = "etcd is not on PATH"
            yield None
            return
        self.versions["fork nsqd"] = FORK.version
        with ForkCluster(binaries) as cluster:
            stamp = time.strftime("%H%M%S")
            for tid, (partitions, replicas, ordered, durable) in FORK_TOPICS.items():
                name = f"bench_{tid}_{stamp}"
                cluster.create_topic(
                    name, partitions, replicas, ordered, durable=durable, wait=False
                )
                self.fork_topics[tid] = name
            for name in self.fork_topics.values():
                cluster.wait_writable(name)
            yield cluster

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

    def _vanilla_nsqd(self) -> str:
        return _need(self.vanilla, "vanilla nsqd").nodes[0].tcp_address

    def _vanilla_http(self) -> str:
        return _need(self.vanilla, "vanilla nsqd").nodes[0].http_url

    def _fresh_name(self, workload: Workload, client: str) -> str:
        self._seq += 1
        return f"b{self._seq}_{workload.id.replace('-', '_')}_{client.replace('-', '_')}"

    def _post(self, url: str, params: dict[str, str]) -> None:
        resp = self._http.post(url, params=params)
        if resp.status_code != 200:
            raise BenchError(f"POST {url} {params}: {resp.status_code} {resp.text.strip()}")

    def _spec(self, workload: Workload, client: str) -> dict[str, Any]:
        """Where and how much: a vanilla topic per run, or the fork topic of the workload."""
        p = self.profile
        n = p.n_ordered if workload.ordered else (p.n_slow if workload.slow else p.n)
        if workload.kind == "hold":
            n = p.hold
        spec: dict[str, Any] = {
            "workload": workload.kind,
            "client": "nsq_ha" if client in ("nsq_ha", "nsq_ha-direct") else client,
            "n": n,
            "size": 100,
            "concurrency": workload.concurrency,
            "batch": workload.batch,
            "rdy": workload.rdy,
            "keyed": workload.keyed,
            "rate": LATENCY_RATE,
            "seconds": p.latency_seconds,
            # the latency run asks nsqd not to buffer deliveries (IDENTIFY output_buffer_size
            # -1; where a peer has the option): the default 16 KiB buffer fills in ~12 ms at
            # 10k msgs/s, a throughput-for-latency trade every client can make
            "unbuffered": workload.kind == "latency",
            "channel": "bench",
        }
        if workload.server == "vanilla":
            topic = self._fresh_name(workload, client)
            base = self._vanilla_http()
            self._post(f"{base}/topic/create", {"topic": topic})
            if workload.kind in ("consume", "latency", "hold"):
                self._post(f"{base}/channel/create", {"topic": topic, "channel": "bench"})
            spec.update(topic=topic, nsqd=self._vanilla_nsqd())
            return spec
        fork = _need(self.fork, "the fork's cluster")
        topic = self.fork_topics[workload.server]
        leader = fork.leader_of(topic, 0)
        spec.update(topic=topic, nsqd=leader.tcp_address, partition=0)
        if client not in ("nsq_ha-direct", "raw") and client in _NSQ_HA_CLIENTS:
            spec["lookupd"] = fork.lookupd_http
        if workload.kind == "consume":  # a channel of its own, created before the prefill
            channel = self._fresh_name(workload, client)
            params = {"topic": topic, "partition": "0", "channel": channel}
            self._post(f"{leader.http_url}/channel/create", params)
            spec["channel"] = channel
        return spec

    def _prefill(self, spec: dict[str, Any], count: int) -> None:
        from nsq_ha.producer import Producer

        fork = self.fork.lookupd_http if self.fork is not None and "partition" in spec else None

        async def fill() -> None:
            # the fork's partition goes by lookupd (its nsqd refuses a PUB without one on an
            # ordered topic); vanilla straight to the nsqd
            producer = Producer(lookupd=fork) if fork else Producer(nsqd=spec["nsqd"])
            async with producer:
                bodies = [measure.body(spec["size"])] * 500
                left = count
                while left > 0:
                    await producer.publish_many(
                        spec["topic"], bodies[: min(500, left)], partition=spec.get("partition")
                    )
                    left -= min(500, left)

        asyncio.run(fill())

    def _cleanup(self, workload: Workload, spec: dict[str, Any]) -> None:
        if workload.server == "vanilla":
            with contextlib.suppress(BenchError, httpx.HTTPError):
                self._post(f"{self._vanilla_http()}/topic/delete", {"topic": spec["topic"]})

    def _driver_argv(self, client: str, spec: dict[str, Any]) -> list[str]:
        if client in _NSQ_HA_CLIENTS:
            return [sys.executable, "-m", "nsq_ha.bench.drivers", json.dumps(spec)]
        python = _need(self.peers_python, "the peers' virtualenv")
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

    def _run_go(self, workload: Workload, spec: dict[str, Any]) -> dict[str, Any]:
        kind, _, batch = (workload.go or "").partition(":")
        runfor = f"{self.profile.go_seconds}s"
        common = [f"--nsqd-tcp-address={spec['nsqd']}", f"--topic={spec['topic']}", "--size=100"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        if kind == "writer":
            out = self._go("bench_writer", [*common, f"--batch-size={batch}", f"--runfor={runfor}"])
            result = _parse_go(out)
        else:
            # fill for twice the read time at the writer's speed, read, check it did not run dry
            filled = self._go(
                "bench_writer",
                [*common, "--batch-size=200", f"--runfor={2 * self.profile.go_seconds}s"],
            )
            self._post(
                f"{self._vanilla_http()}/channel/create",
                {"topic": spec["topic"], "channel": "ch"},
            )
            out = self._go(
                "bench_reader", [*common, "--channel=ch", "--rdy=2500", f"--runfor={runfor}"]
            )
            result = _parse_go(out)
            depth = self._vanilla_depth(spec["topic"], "ch")
            if depth == 0:
                result["note"] = "ran dry (a lower bound)"
            result["filled"] = _parse_go(filled)["count"]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if kind == "writer":
            result["cpu"] = cpu
        return result

    def _go(self, program: str, args: list[str]) -> str:
        argv = [str(_need(self.vanilla_bin, "the Go tools").path(program)), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise BenchError(f"{program} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return proc.stderr + proc.stdout

    def _vanilla_depth(self, topic: str, channel: str) -> int:
        resp = self._http.get(
            f"{self._vanilla_http()}/stats", params={"format": "json", "topic": topic}
        )
        for t in resp.json().get("topics", []):
            for c in t.get("channels", []):
                if c.get("channel_name") == channel:
                    return int(c.get("depth", 0))
        return 0

    def run_one(self, workload: Workload, client: str) -> Sample:
        spec = self._spec(workload, client)
        try:
            if client == "go":
                result = self._run_go(workload, spec)
                sample = _sample_from(result, "go")
                sample.note = result.get("note")
                return sample
            if workload.kind == "consume":
                # more than the run reads: after the channel's last message nsqd holds its
                # output buffer up to 250 ms before flushing, a wait that belongs to no client
                self._prefill(spec, spec["n"] + max(1000, spec["n"] // 10))
            elif workload.kind == "hold":
                self._prefill(spec, spec["n"])
            timeout = 60.0 + spec["n"] / 1000.0
            return _sample_from(self._run_driver(client, spec, timeout), workload.kind)
        finally:
            self._cleanup(workload, spec)

    # -- rounds -----------------------------------------------------------------------------

    def run_rounds(self) -> None:
        workloads = self.workloads()
        for round_no in range(self.profile.rounds):
            for workload in workloads:
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
                        f"{client:<13} {_describe(sample)} ({time.monotonic() - started:.1f} s)"
                    )

    def close(self) -> None:
        self._http.close()


def _need(value: _T | None, what: str) -> _T:
    if value is None:
        raise BenchError(f"{what} is not set up")
    return value


def _parse_go(output: str) -> dict[str, Any]:
    match = re.search(r"duration: (\S+) - \S+mb/s - ([\d.]+)ops/s", output)
    if match is None:
        raise BenchError(f"no figures in the Go tool's output: {output.strip()[-300:]}")
    rate = float(match.group(2))
    seconds = _go_duration(match.group(1))
    return {"count": round(rate * seconds), "seconds": seconds}


def _go_duration(text: str) -> float:
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(h|ms|m|s|µs|us|ns)", text):
        total += float(number) * units[unit]
    return total


def _describe(sample: Sample) -> str:
    if sample.error:
        return f"ERROR {sample.error}"
    parts = []
    if sample.rate is not None:
        parts.append(f"{sample.rate:,.0f} msgs/s")
    if sample.p99_ms is not None:
        parts.append(f"p50 {sample.p50_ms:.2f} ms p99 {sample.p99_ms:.2f} ms")
    if sample.rss_mb is not None:
        parts.append(f"RSS {sample.rss_mb:.1f} MiB")
    if sample.note:
        parts.append(f"({sample.note})")
    return " ".join(parts)


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "date": dt.date.today().isoformat(),
        "cpus": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "os": platform.platform(terse=True),
        "nsq_ha": __version__,
    }
