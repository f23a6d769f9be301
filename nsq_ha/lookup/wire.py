"""nsqlookupd answers -> typed values (pure: no I/O).

Both response envelopes (PROTOCOL.md §5.1) are read: the v1 form (asked for by :data:`V1_ACCEPT`:
raw JSON, errors as ``{"message": ...}`` with the HTTP status) and the wrapped one
(``{"status_code", "status_txt", "data"}``, errors always 500). A lying lookupd cannot make these
functions slow or their errors big: an answer's JSON containers, partitions and lookupds are
bounded (the ``MAX_*`` constants), and error texts quote it shortened.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import re
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from nsq_ha.errors import DiscoveryError, RemoteProtocolError

Access = Literal["r", "w"]

#: Request header asking for the unwrapped v1 answers.
V1_ACCEPT: Mapping[str, str] = {"Accept": "application/vnd.nsq; version=1.0"}
_HOST_CHARS = re.compile(r"[A-Za-z0-9._%:-]+")
_HOSTNAME = re.compile(r"[A-Za-z0-9._-]+")
_IPV4_SHAPE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
_PARTITION_KEY = re.compile(r"0|[1-9][0-9]{0,2}")
_FLAGS = ("ordered", "extend_support", "multi_part", "disable_channel_auto_create")

#: Partitions a fork topic can have (nsqlookupd's MAX_PARTITION_NUM; ids are 0..254).
MAX_PARTITIONS = 255
#: nsqlookupds a ``/listlookup`` answer may name (each one is asked on every lookup).
MAX_LOOKUPDS = 64
#: JSON objects and arrays an answer may hold; parsing time grows with them, and a real answer
#: (255 partitions, a few hundred nodes) holds well under a thousand.
MAX_JSON_CONTAINERS = 10_000
#: Longest lookupd error message kept (the rest is cut).
MAX_MESSAGE = 512


class _BriefRepr(reprlib.Repr):
    """reprlib without sorting dicts (sorting a huge one is the slow part)."""

    def repr_dict(self, x: dict[Any, Any], level: int) -> str:
        if x and level <= 0:
            return "{...}"
        shown = itertools.islice(x.items(), self.maxdict)
        pieces = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in shown]
        return "{" + ", ".join(pieces + ["..."] * (len(x) > self.maxdict)) + "}"


_brief_repr = _BriefRepr()
_brief_repr.maxstring = _brief_repr.maxother = 120
_brief_repr.maxdict = _brief_repr.maxlist = 6
_brief_repr.maxlevel = 3
#: A short repr of part of an answer, for error texts (cheap even for a huge value).
_brief = _brief_repr.repr


def _is_host(host: object) -> bool:
    """An IP address or ASCII host name: anything else in a URL or ``host:port`` built from it would
    make httpx raise ``InvalidURL`` (not an NsqError) far from the lookup that brought it."""
    if not isinstance(host, str) or _HOST_CHARS.fullmatch(host) is None:
        return False
    if ":" not in host and _IPV4_SHAPE.fullmatch(host) is None:
        return _HOSTNAME.fullmatch(host) is not None
    try:
        return ipaddress.ip_address(host) is not None
    except ValueError:
        return False


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class LookupdError(DiscoveryError):
    """nsqlookupd answered with an error status (``.status``, ``.message``)."""

    def __init__(self, status: int, message: str, url: str = "") -> None:
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + f"... ({len(message)} characters)"
        super().__init__(f"nsqlookupd {url} answered {status}: {message}".replace("  ", " "))
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """An nsqd as lookupd describes it; connect to :attr:`address`."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str = ""
    distributed_id: str = ""

    @property
    def address(self) -> str:
        """``host:port`` of the node's TCP protocol endpoint."""
        return _host_port(self.broadcast_address, self.tcp_port)

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the node's HTTP API."""
        return f"http://{_host_port(self.broadcast_address, self.http_port)}"

    @property
    def is_fork(self) -> bool:
        """True for the HA fork's nsqd (its version carries ``-HA.``)."""
        return "-HA." in self.version

    @classmethod
    def from_wire(cls, raw: object) -> NodeInfo:
        """Build from a node object; raise :class:`RemoteProtocolError` if it is malformed."""
        if not isinstance(raw, dict):
            raise RemoteProtocolError(f"lookup node is not an object: {_brief(raw)}")
        try:
            host = raw["broadcast_address"]
            tcp, http = raw["tcp_port"], raw.get("http_port", 0)
        except KeyError as exc:
            raise RemoteProtocolError(f"lookup node lacks {exc.args[0]!r}: {_brief(raw)}") from None
        if not _is_host(host):
            raise RemoteProtocolError(f"lookup node has a bad broadcast_address: {_brief(raw)}")
        for port, low in ((tcp, 1), (http, 0)):  # http_port 0: not announced
            if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
                raise RemoteProtocolError(f"lookup node has a bad port: {_brief(raw)}")
        version, distributed_id = str(raw.get("version", "")), str(raw.get("distributed_id", ""))
        return cls(host, tcp, http, version, distributed_id)


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """The fork's topic metadata (``meta`` of a ``metainfo`` lookup)."""

    partition_num: int
    replica: int = 0
    ordered: bool = False
    extend_support: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False

    @classmethod
    def from_wire(cls, raw: object) -> TopicMeta:
        """Build from a ``meta`` object; raise :class:`RemoteProtocolError` if it is malformed."""
        if not isinstance(raw, dict):
            raise RemoteProtocolError(f"lookup meta is not an object: {_brief(raw)}")
        num, replica = raw.get("partition_num", 0), raw.get("replica", 0)
        if not isinstance(num, int) or isinstance(num, bool) or not 0 <= num <= MAX_PARTITIONS:
            raise RemoteProtocolError(f"lookup meta has a bad partition_num: {_brief(raw)}")
        if not isinstance(replica, int) or isinstance(replica, bool):
            raise RemoteProtocolError(f"lookup meta has a bad replica: {_brief(raw)}")
        return cls(num, replica, **{k: bool(raw.get(k, False)) for k in _FLAGS})


@dataclass(frozen=True, slots=True)
class Route:
    """Where to send: a node, and the partition to name (``None`` on vanilla)."""

    partition: int | None
    node: NodeInfo

    def __str__(self) -> str:
        return f"{'-' if self.partition is None else self.partition}@{self.node.address}"


@dataclass(frozen=True, slots=True)
class PartitionMap:
    """One topic's routes for one access mode, as lookupd(s) answered."""

    topic: str
    access: Access
    partitions: Mapping[int, NodeInfo] = field(default_factory=dict)
    producers: tuple[NodeInfo, ...] = ()
    channels: tuple[str, ...] = ()
    meta: TopicMeta | None = None
    #: the answer had a ``partitions`` key: a fork lookupd (even when the map is empty)
    fork: bool = False

    @property
    def partition_num(self) -> int:
        """Total partitions (``meta``), which may exceed the listed ones; 0 on vanilla."""
        if self.meta is not None:
            return self.meta.partition_num
        return max(self.partitions) + 1 if self.partitions else 0

    @property
    def ordered(self) -> bool:
        """The topic is ordered (``meta``)."""
        return self.meta is not None and self.meta.ordered

    @property
    def extend_support(self) -> bool:
        """The topic carries ext headers (``meta``)."""
        return self.meta is not None and self.meta.extend_support

    def routes(self) -> list[Route]:
        """Fork: one route per listed partition; vanilla: one unpartitioned route per producer."""
        if self.fork:
            return [Route(p, n) for p, n in sorted(self.partitions.items())]
        return [Route(None, n) for n in self.producers]

    def leader(self, partition: int) -> NodeInfo | None:
        """The node listed for ``partition`` (the leader for ``access=w``), if any."""
        return self.partitions.get(partition)


def unwrap(status: int, headers: Mapping[str, str], body: bytes, url: str = "") -> Any:
    """The result of a lookupd answer in either envelope; errors raise :class:`LookupdError`.
    An empty successful body (a null result) gives ``None``."""
    if body.count(b"{") + body.count(b"[") > MAX_JSON_CONTAINERS:
        raise RemoteProtocolError(
            f"nsqlookupd {url} answered {len(body)} bytes with more than "
            f"{MAX_JSON_CONTAINERS} JSON containers (objects and arrays): refused unparsed"
        )
    text = body.decode("utf-8", "replace").strip()
    data: Any = None
    if text:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):  # also too deep, or an int over 4300 digits
            if status == 200:
                return text  # a plain string result
            raise LookupdError(status, text, url) from None
    lowered = {k.lower(): v for k, v in headers.items()}
    v1 = "nsq; version=1.0" in lowered.get("x-nsq-content-type", "")
    if isinstance(data, dict) and "status_code" in data and "data" in data and not v1:
        code = data.get("status_code")
        if code != 200:
            code = code if isinstance(code, int) else status
            raise LookupdError(int(code), str(data.get("status_txt", "")), url)
        return data["data"]
    if status != 200:
        message = data.get("message", text) if isinstance(data, dict) else text
        raise LookupdError(status, str(message), url)
    return data


def parse_lookup(topic: str, access: Access, result: object) -> PartitionMap:
    """A ``/lookup`` result (already unwrapped) as a :class:`PartitionMap`."""
    result = {} if result is None else result
    if not isinstance(result, dict):
        raise RemoteProtocolError(f"lookup of {topic!r} is not an object: {_brief(result)}")
    partitions: dict[int, NodeInfo] = {}
    raw_parts = result.get("partitions")
    if not isinstance(raw_parts, dict | None):
        raise RemoteProtocolError(f"lookup partitions is not an object: {_brief(raw_parts)}")
    if raw_parts and len(raw_parts) > MAX_PARTITIONS:
        raise RemoteProtocolError(
            f"lookup of {topic!r} names {len(raw_parts)} partitions, over the limit "
            f"of {MAX_PARTITIONS}"
        )
    for key, node in (raw_parts or {}).items():
        # canonical decimals only: "1" and "01" naming one partition would be ambiguous
        if not isinstance(key, str) or _PARTITION_KEY.fullmatch(key) is None:
            raise RemoteProtocolError(f"lookup partition id {_brief(key)} is not a number")
        if int(key) >= MAX_PARTITIONS:
            raise RemoteProtocolError(f"lookup partition id {key} is out of range")
        partitions[int(key)] = NodeInfo.from_wire(node)
    producers, channels = result.get("producers"), result.get("channels") or None
    for name, value in (("producers", producers), ("channels", channels)):
        if not isinstance(value, list | None):
            raise RemoteProtocolError(f"lookup {name} is not a list: {_brief(value)}")
    # lookupd lists producers in any order; sorted, equal answers give equal maps
    nodes = tuple(sorted(map(NodeInfo.from_wire, producers or ()), key=lambda n: n.address))
    names = tuple(str(c) for c in channels or ())
    meta = TopicMeta.from_wire(raw) if (raw := result.get("meta")) is not None else None
    return PartitionMap(topic, access, partitions, nodes, names, meta, "partitions" in result)


def parse_listlookup(result: object) -> list[str]:
    """``/listlookup`` (unwrapped) -> lookupd HTTP base URLs, leader first; ``[]`` for null."""
    if result is None:
        return []
    if not isinstance(result, dict):
        raise RemoteProtocolError(f"listlookup is not an object: {_brief(result)}")
    more = result.get("lookupdnodes") or []
    if not isinstance(more, list):
        raise RemoteProtocolError(f"listlookup lookupdnodes is not a list: {_brief(more)}")
    nodes = [result["lookupdleader"], *more] if result.get("lookupdleader") else more
    if len(nodes) > MAX_LOOKUPDS + 1:  # the leader is listed again among the nodes
        raise RemoteProtocolError(
            f"listlookup names {len(nodes)} lookupds, over the limit of {MAX_LOOKUPDS}"
        )
    urls: list[str] = []
    for node in nodes:
        if not isinstance(node, dict) or not node.get("NodeIP") or not node.get("HttpPort"):
            raise RemoteProtocolError(f"listlookup node is malformed: {_brief(node)}")
        host, port = node["NodeIP"], node["HttpPort"]
        if not _is_host(host):
            raise RemoteProtocolError(f"listlookup node has a bad NodeIP: {_brief(node)}")
        # the fork sends the port as a decimal string; accept a JSON number too
        if isinstance(port, str) and port.isascii() and port.isdigit() and len(port) <= 5:
            port = int(port)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise RemoteProtocolError(f"listlookup node has a bad HttpPort: {_brief(node)}")
        if (url := f"http://{_host_port(host, port)}") not in urls:
            urls.append(url)
    if len(urls) > MAX_LOOKUPDS:
        raise RemoteProtocolError(
            f"listlookup names {len(urls)} lookupds, over the limit of {MAX_LOOKUPDS}"
        )
    return urls


def merge_maps(maps: Iterable[PartitionMap]) -> PartitionMap:
    """Merge answers of several lookupds for one topic/access (first answer wins a conflict):
    pass the leader lookupd's answer first so that it decides a partition named twice."""
    maps = list(maps)
    if not maps:
        raise ValueError("merge_maps needs at least one map")
    partitions: dict[int, NodeInfo] = {}
    producers: dict[str, NodeInfo] = {}
    meta = None
    for m in maps:
        for pid, node in m.partitions.items():
            partitions.setdefault(pid, node)
        for node in m.producers:
            producers.setdefault(node.address, node)
        if m.meta is not None and (meta is None or m.meta.partition_num > meta.partition_num):
            meta = m.meta
    channels = tuple(dict.fromkeys(c for m in maps for c in m.channels))
    fork = any(m.fork for m in maps)
    return PartitionMap(
        maps[0].topic, maps[0].access, partitions, tuple(producers.values()), channels, meta, fork
    )
