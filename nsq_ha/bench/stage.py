"""Where the runs happen: one vanilla nsqd, the fork's cluster when it is built, their topics.

:func:`open_stage` starts the servers (and creates the fork topics up front);
:meth:`Stage.place` adds to a run's spec where it runs (a fresh vanilla topic per run, or the
workload's fork topic at its leader, with a channel of its own for a consume run);
:meth:`Stage.prefill` and :meth:`Stage.cleanup` go around a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from nsq_ha.bench import measure
from nsq_ha.bench.results import BenchError
from nsq_ha.bench.workloads import FORK_TOPICS, NSQ_HA_CLIENTS, Workload
from nsq_ha.producer import Producer
from nsq_ha.testing.build import (
    FORK,
    VANILLA,
    ServerBinaries,
    ensure_built,
    find_built,
    last_failure,
)
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

__all__ = ["Stage", "need", "open_stage"]

_T = TypeVar("_T")


def need(value: _T | None, what: str) -> _T:
    """``value``, or :class:`BenchError` saying ``what`` is not set up."""
    if value is None:
        raise BenchError(f"{what} is not set up")
    return value


@dataclass
class Stage:
    """The running servers of one benchmark invocation."""

    vanilla: VanillaCluster
    vanilla_bin: ServerBinaries
    http: httpx.Client
    fork: ForkCluster | None = None
    #: why the fork is not there ("" when it is)
    fork_missing: str = ""
    #: fork topic id (:data:`~nsq_ha.bench.workloads.FORK_TOPICS`) -> topic name
    fork_topics: dict[str, str] = field(default_factory=dict)
    _seq: int = 0

    @property
    def vanilla_nsqd(self) -> str:
        """TCP address of the vanilla nsqd."""
        return self.vanilla.nodes[0].tcp_address

    @property
    def vanilla_http(self) -> str:
        """HTTP URL of the vanilla nsqd."""
        return self.vanilla.nodes[0].http_url

    def post(self, url: str, params: dict[str, str]) -> None:
        """POST to an nsqd; anything but 200 is a :class:`BenchError`."""
        resp = self.http.post(url, params=params)
        if resp.status_code != 200:
            raise BenchError(f"POST {url} {params}: {resp.status_code} {resp.text.strip()}")

    def _fresh_name(self, workload: Workload, client: str) -> str:
        self._seq += 1
        return f"b{self._seq}_{workload.id.replace('-', '_')}_{client.replace('-', '_')}"

    def place(self, workload: Workload, client: str, spec: dict[str, Any]) -> None:
        """Where: a vanilla topic per run, or the fork topic of the workload (in ``spec``); a
        ``dev`` workload's driver starts its own embedded cluster."""
        if workload.server == "dev":
            return
        if workload.server == "vanilla":
            topic = self._fresh_name(workload, client)
            self.post(f"{self.vanilla_http}/topic/create", {"topic": topic})
            if workload.kind in ("consume", "latency", "hold"):
                self.post(
                    f"{self.vanilla_http}/channel/create", {"topic": topic, "channel": "bench"}
                )
            spec.update(topic=topic, nsqd=self.vanilla_nsqd)
            return
        fork = need(self.fork, "the fork's cluster")
        topic = self.fork_topics[workload.server]
        leader = fork.leader_of(topic, 0)
        spec.update(topic=topic, nsqd=leader.tcp_address, partition=0)
        if client in NSQ_HA_CLIENTS and client not in _DIRECT:
            spec["lookupd"] = fork.lookupd_http
        if workload.kind == "consume":  # a channel of its own, created before the prefill
            channel = self._fresh_name(workload, client)
            params = {"topic": topic, "partition": "0", "channel": channel}
            self.post(f"{leader.http_url}/channel/create", params)
            spec["channel"] = channel

    def prefill(self, spec: dict[str, Any], count: int) -> None:
        """Publish ``count`` messages of the spec's size to its topic (and partition)."""
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

    def cleanup(self, workload: Workload, spec: dict[str, Any]) -> None:
        """Delete a run's vanilla topic (the fork topics stay for the next run)."""
        if workload.server == "vanilla":
            with contextlib.suppress(BenchError, httpx.HTTPError):
                self.post(f"{self.vanilla_http}/topic/delete", {"topic": spec["topic"]})

    def vanilla_depth(self, topic: str, channel: str) -> int:
        """The depth of a vanilla channel (0 when it is not there)."""
        resp = self.http.get(
            f"{self.vanilla_http}/stats", params={"format": "json", "topic": topic}
        )
        for t in resp.json().get("topics") or []:
            for c in t.get("channels") or []:
                if c.get("channel_name") == channel:
                    return int(c.get("depth", 0))
        return 0


#: nsq_ha clients that go straight to the partition's leader, not through lookupd
_DIRECT = frozenset({"nsq_ha-direct", "raw", "floor", "floor-uvloop"})


@contextlib.contextmanager
def _fork_cluster(stage: Stage, use_fork: bool) -> Iterator[None]:
    binaries = find_built(FORK) if use_fork else None
    if binaries is None:
        why = "--no-fork" if not use_fork else (last_failure(FORK) or "not built")
        stage.fork_missing = why.strip().splitlines()[-1][:300]
        yield
        return
    if shutil.which("etcd") is None:
        stage.fork_missing = "etcd is not on PATH"
        yield
        return
    with ForkCluster(binaries) as cluster:
        stamp = time.strftime("%H%M%S")
        for tid, (partitions, replicas, ordered, durable) in FORK_TOPICS.items():
            name = f"bench_{tid}_{stamp}"
            cluster.create_topic(name, partitions, replicas, ordered, durable=durable, wait=False)
            stage.fork_topics[tid] = name
        for name in stage.fork_topics.values():
            cluster.wait_writable(name)
        stage.fork = cluster
        yield


@contextlib.contextmanager
def open_stage(http: httpx.Client, *, use_fork: bool) -> Iterator[Stage]:
    """Build (if needed) and start vanilla nsqd, then the fork's cluster when it can run."""
    vanilla_bin = ensure_built(VANILLA)
    with VanillaCluster(vanilla_bin, node_count=1, nsqd_args=["--max-rdy-count=10000"]) as vanilla:
        stage = Stage(vanilla, vanilla_bin, http)
        with _fork_cluster(stage, use_fork):
            yield stage
