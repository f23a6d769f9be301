"""What the benchmark runs: the profiles (how big), the workloads (what, where, by whom) and the
spec a driver process gets for one run.

Pure data and one pure function (:func:`base_spec`); the servers a spec is placed on are
:mod:`nsq_ha.bench.stage`, the run itself :mod:`nsq_ha.bench.runner`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORK_TOPICS",
    "FORK_WORKLOADS",
    "LATENCY_RATE",
    "NSQ_HA_CLIENTS",
    "PEERS",
    "PROFILES",
    "SPARK_WORKLOADS",
    "VANILLA_WORKLOADS",
    "Profile",
    "Workload",
    "base_spec",
]

#: the peer clients and the versions the issue's figures were taken with
PEERS = {"pynsq": "0.9.1", "gnsq": "1.0.2", "ansq": "0.3.0"}
#: messages per second published in the latency workload
LATENCY_RATE = 10_000


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
    n_spark: int = 0  # rows per Spark run (0: no Spark workloads)


PROFILES = {
    "smoke": Profile("smoke", 2000, 500, 300, 1000, 1, 0.5, 0.3),
    "quick": Profile("quick", 20000, 5000, 2000, 10000, 3, 1.5, 1.0, n_spark=100_000),
    "full": Profile("full", 100000, 20000, 10000, 10000, 5, 5.0, 3.0, n_spark=300_000),
}


@dataclass(frozen=True, slots=True)
class Workload:
    """One row group of the table: what is run, where, and by which clients."""

    id: str
    title: str
    server: str  # "vanilla", a fork topic id, or "dev" (the driver starts an embedded cluster)
    kind: str  # the drivers' workload: pub1, pubmany, consume, latency, hold
    clients: tuple[str, ...]
    go: str | None = None  # "writer:<batch>" or "reader"
    batch: int = 1
    concurrency: int = 100
    rdy: int = 2500
    keyed: bool = False
    ordered: bool = False
    slow: bool = False
    #: at most this many rounds (None: the profile's), for workloads that start a JVM per run
    max_rounds: int | None = None
    #: how a Spark read reads: "stream", "batch", "fixed" (the fixed cost of one query), or
    #: "floor" / "floor-batch" (the same rows from memory, no NSQ: Spark's floor)
    mode: str = ""


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
        ("nsq_ha", "nsq_ha-batch", "nsq_ha-sync", "nsq_ha-uvloop", "pynsq", "gnsq", "ansq"),
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
    "o4": (4, 1, True, False),  # the Spark ordered read's
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
        "fork, 4 partitions: keyed publish, one message per call (100 concurrent), warm",
        "k4",
        "pub1",
        ("nsq_ha",),
        keyed=True,
    ),
    # from a fresh producer: the clock starts before its first publish (lookup, connections)
    *(
        Workload(
            f"fork-keyed-cold-{tasks}",
            f"fork, 4 partitions: keyed publish from a fresh producer ({tasks} concurrent), cold",
            "k4",
            "pub1-cold",
            ("nsq_ha",),
            concurrency=tasks,
            keyed=True,
            slow=tasks == 1,  # one call at a time: a round trip each
        )
        for tasks in (1, 100, 2000)
    ),
    Workload(
        "fork-ordered",
        "fork: ordered consume of one partition (SUB_ORDERED)",
        "ord",
        "consume",
        ("nsq_ha", "nsq_ha-uvloop", "floor", "floor-uvloop", "raw"),
        ordered=True,
        slow=True,
    ),
)

#: Spark local[2] against the fork's cluster, each beside the client's own figure on the same
#: topic (``k4``: 4 partitions, replica 1; ``o4``: the same, ordered); then against the
#: embedded 3-node cluster (issue 23's first setup)
SPARK_WORKLOADS = (
    Workload(
        "spark-fork-read",
        "Spark local[2], fork: stream read of 4 partitions (availableNow, noop)",
        "k4",
        "spark-read",
        ("nsq_ha",),
        max_rounds=2,
        mode="stream",
    ),
    Workload(
        "spark-fork-consume",
        "fork: async for over the same 4 partitions, FIN each (the Spark reads' reference)",
        "k4",
        "dev-consume",
        ("nsq_ha",),
        max_rounds=2,
    ),
    Workload(
        "spark-fork-batch",
        "Spark local[2], fork: bounded batch read of 4 partitions (offsets to latest, count)",
        "k4",
        "spark-read",
        ("nsq_ha",),
        max_rounds=2,
        mode="batch",
    ),
    Workload(
        "spark-fork-floor",
        "Spark local[2]: stream read of the same rows from memory, no NSQ (Spark's floor)",
        "k4",
        "spark-read",
        ("nsq_ha",),
        max_rounds=2,
        mode="floor",
    ),
    Workload(
        "spark-fork-floor-batch",
        "Spark local[2]: batch read of the same rows from memory, no NSQ (Spark's floor)",
        "k4",
        "spark-read",
        ("nsq_ha",),
        max_rounds=2,
        mode="floor-batch",
    ),
    Workload(
        "spark-fork-fixed",
        "Spark local[2], fork: one stream query of 4 rows (PySpark's fixed cost per query) "
        "[queries/s]",
        "k4",
        "spark-read",
        ("nsq_ha",),
        max_rounds=2,
        mode="fixed",
    ),
    Workload(
        "spark-fork-write",
        "Spark local[2], fork: keyed batch write to 4 partitions",
        "k4",
        "spark-write",
        ("nsq_ha",),
        max_rounds=2,
    ),
    Workload(
        "spark-fork-pubmany",
        "fork: keyed publish_many to the same 4 partitions (the Spark write's reference)",
        "k4",
        "dev-write",
        ("nsq_ha",),
        max_rounds=2,
    ),
    Workload(
        "spark-fork-read-ordered",
        "Spark local[2], fork: stream read of 4 ordered partitions (availableNow, noop)",
        "o4",
        "spark-read-ordered",
        ("nsq_ha",),
        ordered=True,
        max_rounds=2,
        mode="stream",
    ),
    Workload(
        "spark-fork-ordered",
        "fork: 4 ordered consumers, one per partition (the Spark ordered read's reference)",
        "o4",
        "dev-ordered",
        ("nsq_ha",),
        ordered=True,
        max_rounds=2,
    ),
    Workload(
        "spark-read",
        "Spark local[2], embedded cluster: stream read of 4 partitions (availableNow, noop)",
        "dev",
        "spark-read",
        ("nsq_ha",),
        max_rounds=2,
    ),
    Workload(
        "spark-read-ordered",
        "Spark local[2], embedded cluster: stream read of 4 ordered partitions (availableNow)",
        "dev",
        "spark-read-ordered",
        ("nsq_ha",),
        ordered=True,
        max_rounds=2,
    ),
    Workload(
        "spark-dev-ordered",
        "embedded cluster: ordered consume of one partition (the Spark ordered read's reference)",
        "dev",
        "dev-ordered",
        ("nsq_ha",),
        ordered=True,
        max_rounds=2,
    ),
    Workload(
        "spark-write",
        "Spark local[2], embedded cluster: keyed batch write to 4 partitions",
        "dev",
        "spark-write",
        ("nsq_ha",),
        max_rounds=2,
    ),
    Workload(
        "spark-dev-consume",
        "embedded cluster: async for consume of 4 partitions (the Spark read on its server)",
        "dev",
        "dev-consume",
        ("nsq_ha",),
        max_rounds=2,
    ),
    Workload(
        "spark-dev-write",
        "embedded cluster: keyed publish_many to 4 partitions (the Spark write on its server)",
        "dev",
        "dev-write",
        ("nsq_ha",),
        max_rounds=2,
    ),
)

#: the clients whose runs are nsq_ha's own drivers (``python -m nsq_ha.bench.drivers``)
NSQ_HA_CLIENTS = frozenset(
    {
        "nsq_ha",
        "nsq_ha-direct",
        "nsq_ha-batch",
        "nsq_ha-sync",
        "nsq_ha-uvloop",
        "raw",
        "floor",
        "floor-uvloop",
    }
)
#: the clients that run nsq_ha's asyncio driver (``nsq_ha-uvloop`` on uvloop's event loop)
_ASYNC_NSQ_HA = ("nsq_ha", "nsq_ha-direct", "nsq_ha-uvloop")


def base_spec(profile: Profile, workload: Workload, client: str) -> dict[str, Any]:
    """How much and how, for one run of ``client`` on ``workload``; the stage adds where."""
    n = profile.n_ordered if workload.ordered else (profile.n_slow if workload.slow else profile.n)
    if workload.kind == "hold":
        n = profile.hold
    if workload.kind.startswith("spark-") or workload.kind.startswith("dev-"):
        # an ordered read goes one round trip per message: half the rows
        n = profile.n_spark // 2 if workload.ordered else profile.n_spark
    if workload.kind == "dev-ordered" and workload.server == "dev":
        n = profile.n_ordered * 5  # the ordered read's reference, one partition: seconds' worth
    return {
        "workload": workload.kind,
        "client": "nsq_ha" if client in _ASYNC_NSQ_HA else client.removesuffix("-uvloop"),
        "loop": "uvloop" if client.endswith("-uvloop") else "asyncio",
        "n": n,
        "size": 100,
        "concurrency": workload.concurrency,
        "batch": workload.batch,
        "rdy": workload.rdy,
        "keyed": workload.keyed,
        "ordered": workload.ordered,
        "rate": LATENCY_RATE,
        "seconds": profile.latency_seconds,
        # the latency run asks nsqd not to buffer deliveries (IDENTIFY output_buffer_size
        # -1; where a peer has the option): the default 16 KiB buffer fills in ~12 ms at
        # 10k msgs/s, a throughput-for-latency trade every client can make
        "unbuffered": workload.kind == "latency",
        "channel": "bench",
        "spark_mode": workload.mode,
    }
