"""Real NSQ clusters on loopback for tests: vanilla (nsqlookupd + 2 nsqd) and the fork.

The fork cluster is etcd (v2 API) + one nsqlookupd + three nsqd in cluster mode, with the admin
helpers tests need: create a topic and wait until it is writable, look it up, stop and start a
node, move a partition's leader.  Every process listens on free loopback ports and keeps its
data and logs in one temporary directory that :meth:`stop` removes.

Use them as context managers::

    with ForkCluster(ensure_built(FORK)) as cluster:
        cluster.create_topic("orders", partitions=4, replicas=1)
        print(cluster.lookup("orders", access="w")["partitions"])
"""

from __future__ import annotations

import contextlib
import logging
import resource
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from nsq_ha.admin import TopicSpec
from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.process import ManagedProcess, ServerStartError, free_ports, http_ok

__all__ = ["ClusterError", "ForkCluster", "NsqdNode", "TopicSpec", "VanillaCluster"]

log = logging.getLogger(__name__)

#: ``Accept`` header asking nsqd/nsqlookupd for unwrapped v1 JSON answers (PROTOCOL.md §5.1).
V1_ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}

#: Re-POSTing an identical ``/topic/create`` makes lookupd re-check the topic (PROTOCOL.md §11),
#: but only once this long has passed since the previous request.
RECREATE_AFTER = 6.5
#: seconds between two nudges of an unstable fork cluster (:meth:`ForkCluster.wait_stable`)
_NUDGE_EVERY = 7.0


class ClusterError(RuntimeError):
    """An admin request to a test cluster failed (the message has the server's answer)."""


@dataclass
class NsqdNode:
    """One nsqd of a test cluster."""

    index: int
    tcp_port: int
    http_port: int
    process: ManagedProcess
    data_dir: Path
    rpc_port: int | None = None
    worker_id: int | None = None

    @property
    def tcp_address(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def distributed_id(self) -> str:
        """The fork's cluster node id, ``ip:rpc_port:tcp_port:worker_id``."""
        if self.rpc_port is None:
            raise ClusterError("vanilla nodes have no distributed id")
        return f"127.0.0.1:{self.rpc_port}:{self.tcp_port}:{self.worker_id}"


@dataclass
class _Cluster:
    """What both clusters share: a temp dir, processes, teardown, HTTP helpers."""

    binaries: ServerBinaries
    #: extra command-line flags for every nsqd (e.g. ``--tls-cert=...``, ``--auth-http-address``)
    nsqd_args: list[str] = field(default_factory=list)
    nodes: list[NsqdNode] = field(default_factory=list)
    base_dir: Path = field(init=False)
    _procs: list[ManagedProcess] = field(default_factory=list, init=False)
    _http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix=f"nsq_ha-{self.binaries.recipe.name}-"))
        self._http = httpx.Client(timeout=10.0)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    @property
    def processes(self) -> tuple[ManagedProcess, ...]:
        """Every process the cluster started (etcd, nsqlookupd, nsqd), in start order."""
        return tuple(self._procs)

    def _process(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.base_dir / name)
        self._procs.append(proc)
        return proc

    def stop(self) -> None:
        """Stop every process (newest first) and remove the temporary directory."""
        for proc in reversed(self._procs):
            try:
                proc.stop()
            except Exception:  # keep tearing down the rest
                log.exception("failed to stop %s", proc.name)
        self._http.close()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def request(
        self, method: str, url: str, params: dict[str, str] | None = None
    ) -> httpx.Response:
        return self._http.request(method, url, params=params, headers=V1_ACCEPT)

    def stop_node(self, index: int, kill: bool = False) -> None:
        """Stop nsqd ``index``: SIGTERM and wait, or ``kill=True`` for SIGKILL."""
        self.nodes[index].process.stop(kill=kill)

    def start_node(self, index: int) -> None:
        """Start a stopped nsqd again with the same ports and data, and wait for its /ping."""
        self._start_node(self.nodes[index])

    @staticmethod
    def _start_node(node: NsqdNode) -> None:
        node.process.start()
        node.process.wait_until(lambda: http_ok(f"{node.http_url}/ping", expect="OK"), "/ping")


def _raise_nofile_limit() -> None:
    """Lift the soft open-files limit to the hard one (the fork's nsqd checks it at start)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class VanillaCluster(_Cluster):
    """nsqlookupd + ``node_count`` nsqd of vanilla NSQ (1.3.0)."""

    node_count: int = 2
    lookupd_tcp_port: int = 0
    lookupd_http_port: int = 0

    @property
    def lookupd_http(self) -> str:
        return f"http://127.0.0.1:{self.lookupd_http_port}"

    def __repr__(self) -> str:
        return f"<VanillaCluster lookupd={self.lookupd_http} nodes={len(self.nodes)}>"

    def start(self) -> None:
        ports = free_ports(2 + 3 * self.node_count)
        self.lookupd_tcp_port, self.lookupd_http_port = ports[0], ports[1]
        lookupd = self._process(
            "nsqlookupd",
            [
                str(self.binaries.nsqlookupd),
                f"--tcp-address=127.0.0.1:{self.lookupd_tcp_port}",
                f"--http-address=127.0.0.1:{self.lookupd_http_port}",
                "--broadcast-address=127.0.0.1",
            ],
        )
        lookupd.start()
        lookupd.wait_until(lambda: http_ok(f"{self.lookupd_http}/ping", expect="OK"), "HTTP /ping")
        for i in range(self.node_count):
            tcp, http, https = ports[2 + 3 * i : 5 + 3 * i]
            data = self.base_dir / f"nsqd{i}" / "data"
            data.mkdir(parents=True)
            proc = self._process(
                f"nsqd{i}",
                [
                    str(self.binaries.nsqd),
                    f"--node-id={i + 1}",
                    f"--tcp-address=127.0.0.1:{tcp}",
                    f"--http-address=127.0.0.1:{http}",
                    f"--https-address=127.0.0.1:{https}",
                    f"--data-path={data}",
                    "--broadcast-address=127.0.0.1",
                    f"--lookupd-tcp-address=127.0.0.1:{self.lookupd_tcp_port}",
                    *self.nsqd_args,
                ],
            )
            node = NsqdNode(i, tcp, http, proc, data)
            self.nodes.append(node)
            self._start_node(node)
        lookupd.wait_until(
            lambda: self._registered_nodes() >= self.node_count,
            f"all {self.node_count} nsqd registered in nsqlookupd /nodes",
        )

    def _registered_nodes(self) -> int:
        try:
            resp = self.request("GET", f"{self.lookupd_http}/nodes")
        except httpx.HTTPError:
            return 0
        return len(resp.json().get("producers") or []) if resp.status_code == 200 else 0

    def create_topic(self, name: str) -> None:
        """Create ``name`` on every nsqd (vanilla nsqd creates topics on demand too)."""
        for node in self.nodes:
            resp = self.request("POST", f"{node.http_url}/topic/create", {"topic": name})
            if resp.status_code != 200:
                raise ClusterError(
                    f"topic/create on nsqd{node.index}: {resp.status_code} {resp.text}"
                )

    def lookup(self, topic: str) -> dict[str, Any]:
        """``GET /lookup?topic=`` (v1 JSON); 404 for unknown topics becomes a ClusterError."""
        resp = self.request("GET", f"{self.lookupd_http}/lookup", {"topic": topic})
        if resp.status_code != 200:
            raise ClusterError(f"lookup {topic}: {resp.status_code} {resp.text}")
        result: dict[str, Any] = resp.json()
        return result


@dataclass
class ForkCluster(_Cluster):
    """etcd + nsqlookupd + ``node_count`` nsqd of the fork, in cluster mode."""

    node_count: int = 3
    cluster_id: str = field(default_factory=lambda: f"nsqha-test-{uuid.uuid4().hex[:8]}")
    etcd_binary: str = "etcd"
    lookupd_tcp_port: int = 0
    lookupd_http_port: int = 0
    lookupd_rpc_port: int = 0
    etcd_client_port: int = 0
    topics: dict[str, TopicSpec] = field(default_factory=dict)
    _created_at: dict[str, float] = field(default_factory=dict, init=False)

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"

    @property
    def lookupd_http(self) -> str:
        return f"http://127.0.0.1:{self.lookupd_http_port}"

    def __repr__(self) -> str:
        return (
            f"<ForkCluster {self.cluster_id} lookupd={self.lookupd_http} nodes={len(self.nodes)}>"
        )

    # -- start-up ---------------------------------------------------------------------------

    def start(self) -> None:
        etcd_bin = shutil.which(self.etcd_binary)
        if etcd_bin is None:
            raise ServerStartError(
                "etcd is not on PATH: install Debian's etcd-server (apt-get install etcd-server)"
            )
        _raise_nofile_limit()
        ports = free_ports(6 + 5 * self.node_count)
        self.etcd_client_port, etcd_peer = ports[0], ports[1]
        self.lookupd_tcp_port, self.lookupd_http_port, self.lookupd_rpc_port = ports[2:5]
        lookupd_metric = ports[5]
        self._start_etcd(etcd_bin, etcd_peer)
        lookupd = self._process(
            "nsqlookupd",
            [
                str(self.binaries.nsqlookupd),
                f"--tcp-address=127.0.0.1:{self.lookupd_tcp_port}",
                f"--http-address=127.0.0.1:{self.lookupd_http_port}",
                f"--metric-address=127.0.0.1:{lookupd_metric}",
                f"--rpc-port={self.lookupd_rpc_port}",
                "--broadcast-address=127.0.0.1",
                f"--cluster-id={self.cluster_id}",
                f"--cluster-leadership-addresses={self.etcd_url}",
                "--allow-write-with-nochannels=true",
                "--logtostderr=true",
            ],
        )
        lookupd.start()
        lookupd.wait_until(lambda: http_ok(f"{self.lookupd_http}/ping", expect="OK"), "/ping")
        lookupd.wait_until(self.lookupd_is_leader, "nsqlookupd elected leader (/listlookup)")
        for i in range(self.node_count):
            tcp, http, https, rpc, metric = ports[6 + 5 * i : 11 + 5 * i]
            data = self.base_dir / f"nsqd{i}" / "data"
            data.mkdir(parents=True)
            proc = self._process(
                f"nsqd{i}",
                [
                    str(self.binaries.nsqd),
                    f"--worker-id={i + 1}",
                    f"--tcp-address=127.0.0.1:{tcp}",
                    f"--http-address=127.0.0.1:{http}",
                    f"--https-address=127.0.0.1:{https}",
                    f"--metric-address=127.0.0.1:{metric}",
                    f"--rpc-port={rpc}",
                    "--broadcast-address=127.0.0.1",
                    "--broadcast-interface=lo",
                    f"--cluster-id={self.cluster_id}",
                    f"--cluster-leadership-addresses={self.etcd_url}",
                    f"--data-path={data}",
                    "--logtostderr=true",
                    *self.nsqd_args,
                ],
            )
            self.nodes.append(NsqdNode(i, tcp, http, proc, data, rpc_port=rpc, worker_id=i + 1))
        for node in self.nodes:
            self._start_node(node)
        lookupd.wait_until(
            lambda: self._registered_nodes() >= self.node_count,
            f"all {self.node_count} nsqd registered in nsqlookupd /nodes",
            timeout=60,
        )

    def _start_etcd(self, etcd_bin: str, peer_port: int) -> None:
        peer = f"http://127.0.0.1:{peer_port}"
        etcd = self._process(
            "etcd",
            [
                etcd_bin,
                "--name=nsqha",
                f"--data-dir={self.base_dir / 'etcd' / 'data'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=nsqha={peer}",
                "--initial-cluster-state=new",
                "--enable-v2=true",
                "--log-level=warn",
                "--logger=zap",
            ],
        )
        etcd.start()
        etcd.wait_until(lambda: http_ok(f"{self.etcd_url}/v2/keys/"), "etcd v2 API")

    def lookupd_is_leader(self) -> bool:
        """Whether the cluster's nsqlookupd names itself leader in ``/listlookup`` (etcd
        elected it); False while it cannot say."""
        try:
            data = self._v1_json("GET", "/listlookup")
        except (httpx.HTTPError, ClusterError, ValueError):
            return False
        leader = (data or {}).get("lookupdleader") or {}
        return str(leader.get("HttpPort")) == str(self.lookupd_http_port)

    def _registered_nodes(self) -> int:
        try:
            data = self._v1_json("GET", "/nodes")
        except (httpx.HTTPError, ClusterError, ValueError):
            return 0
        return len((data or {}).get("producers") or [])

    def _v1_json(self, method: str, path: str, params: dict[str, str] | None = None) -> Any:
        resp = self.request(method, f"{self.lookupd_http}{path}", params)
        if resp.status_code != 200:
            raise ClusterError(f"{method} {path} {params or ''}: {resp.status_code} {resp.text}")
        return resp.json() if resp.content else None

    # -- admin helpers ----------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        replicas: int,
        ordered: bool = False,
        ext: bool = False,
        *,
        durable: bool = False,
        sync_every: int | None = None,
        retention_days: int | None = None,
        channel_auto_create: bool = True,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> TopicSpec:
        """Create a topic through lookupd's admin API; by default wait until it is writable.

        Every topic is created multi-part, so several partitions may share a node.  ``durable``
        is ``sync_every=1``: nsqd fsyncs each write before acknowledging it (see
        :class:`nsq_ha.admin.TopicSpec`).  Coordinator errors right after start-up (nodes not yet
        known to it) are retried until ``timeout``; other refusals raise :class:`ClusterError`
        with lookupd's message.
        """
        spec = TopicSpec.with_durability(
            name,
            partitions,
            replicas,
            ordered,
            ext,
            True,
            durable=durable,
            sync_every=sync_every,
            retention_days=retention_days,
            channel_auto_create=channel_auto_create,
        )
        deadline = time.monotonic() + timeout
        while True:
            resp = self.request("POST", f"{self.lookupd_http}/topic/create", spec.query())
            if resp.status_code == 200:
                break
            transient = "No node is available" in resp.text or "unstable" in resp.text
            if not transient or time.monotonic() > deadline:
                raise ClusterError(f"topic/create {spec}: {resp.status_code} {resp.text}")
            time.sleep(1.0)
        self.topics[name] = spec
        self._created_at[name] = time.monotonic()
        if wait:
            self.wait_writable(name, timeout=max(1.0, deadline - time.monotonic()))
        return spec

    def wait_writable(self, topic: str, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until an ``access=w`` lookup lists every partition of ``topic``; return it.

        lookupd registers a new topic only after its periodic topic check; re-posting the same
        create request (more than ~6 s after the last one) triggers that check sooner.
        """
        spec = self.topics.get(topic)
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                last = self.lookup(topic, access="w")
            except ClusterError:
                last = {}
            want = spec.partitions if spec else (last.get("meta") or {}).get("partition_num", 0)
            if want and len(last.get("partitions") or {}) >= want:
                return last
            created = self._created_at.get(topic, 0.0)
            if spec is not None and time.monotonic() - created > RECREATE_AFTER:
                self.request("POST", f"{self.lookupd_http}/topic/create", spec.query())
                self._created_at[topic] = time.monotonic()
            time.sleep(0.5)
        raise ClusterError(
            f"topic {topic!r} not writable after {timeout:.0f}s; last lookup: {last}"
        )

    def lookup(self, topic: str, access: Literal["r", "w"] = "r") -> dict[str, Any]:
        """``GET /lookup?topic=T&access=..&metainfo=true`` with the v1 header; the JSON object."""
        data = self._v1_json(
            "GET", "/lookup", {"topic": topic, "access": access, "metainfo": "true"}
        )
        if not isinstance(data, dict):
            raise ClusterError(f"lookup {topic}: unexpected answer {data!r}")
        return data

    def node_for(self, distributed_id: str) -> NsqdNode:
        """The node with this cluster id (``ip:rpc_port:tcp_port:worker_id``)."""
        for node in self.nodes:
            if node.distributed_id == distributed_id:
                return node
        raise ClusterError(f"no node has distributed id {distributed_id!r}")

    def leader_of(self, topic: str, partition: int) -> NsqdNode:
        """The node an ``access=w`` lookup names as leader of ``topic`` partition ``partition``."""
        parts = self.lookup(topic, access="w").get("partitions") or {}
        entry = parts.get(str(partition))
        if entry is None:
            raise ClusterError(f"{topic}/{partition} has no writable leader now: {parts}")
        return self.node_for(entry["distributed_id"])

    def wait_stable(self, timeout: float = 180.0, *, nudge: bool = True) -> None:
        """Wait until lookupd's ``/cluster/stats`` reports ``"stable": true``.

        lookupd sets the flag only in its full topic check, which runs once a minute: on a new
        cluster with a new topic that took 108 s here.  With ``nudge`` (the default), at once
        and then every 7 s that it stays unstable, this asks for a full check the way an
        operator can: ``POST /cluster/upgrade/begin`` then ``/cluster/upgrade/done``.  Ending an
        upgrade triggers a full check a second later when the last one is over 6 s old; the
        same cluster was stable after 8.5 s.  Besides that check, the pair only pauses partition
        migration between the two calls and re-sends each partition's leader session to its
        nodes, which already hold it.
        """
        deadline = time.monotonic() + timeout
        nudged = time.monotonic() - _NUDGE_EVERY  # the first check that finds it unstable nudges
        while True:
            with contextlib.suppress(httpx.HTTPError, ClusterError, ValueError):
                if (self._v1_json("GET", "/cluster/stats") or {}).get("stable") is True:
                    return
                if nudge and time.monotonic() - nudged > _NUDGE_EVERY:
                    nudged = time.monotonic()
                    self._v1_json("POST", "/cluster/upgrade/begin")
                    self._v1_json("POST", "/cluster/upgrade/done")
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster not stable after {timeout:.0f}s")
            time.sleep(0.5)

    def move_leader(self, topic: str, partition: int, timeout: float = 180.0) -> NsqdNode:
        """Move the leadership of ``topic``/``partition`` away from its current node.

        Waits for a stable cluster (the API refuses otherwise), asks lookupd to move, then waits
        until ``access=w`` names a different leader, which it returns.  lookupd picks the new
        leader from the in-sync replicas itself (not necessarily ``move_to``).
        """
        deadline = time.monotonic() + timeout
        self.wait_stable(timeout)
        old = self.leader_of(topic, partition)
        target = next(n for n in self.nodes if n is not old and n.process.running)
        params = {
            "topic": topic,
            "partition": str(partition),
            "move_leader": "true",
            "move_from": old.distributed_id,
            "move_to": target.distributed_id,
        }
        self._v1_json("POST", "/topic/partition/move", params)
        while time.monotonic() < deadline:
            with contextlib.suppress(ClusterError):
                new = self.leader_of(topic, partition)
                if new is not old:
                    return new
            time.sleep(0.2)
        raise ClusterError(f"leader of {topic}/{partition} still {old.distributed_id}")
