"""The embedded nsqd's HTTP API: what the fork's nsqd answers on its HTTP port (PROTOCOL.md §5.6).

Endpoints: ``/ping`` (plain), ``/info``, ``/pub``, ``/pub_ext``, ``/mpub``, ``/stats``
(negotiated), ``/pubtrace`` and the channel admin endpoints ``/channel/create``, ``delete``,
``empty``, ``pause``, ``unpause``, ``skip``, ``unskip``, ``setoffset``, ``setorder`` (v1).
Check order, status codes and error texts follow ``nsqdserver/http.go`` (youzan/nsq b16e68eb):

* publishing: ``Content-Length`` over ``max_msg_size`` → 413 ``MSG_TOO_BIG``, missing (chunked)
  or 0 → 406 ``MSG_EMPTY``; any topic problem → 404 ``E_TOPIC_NOT_EXIST``; a replica →
  400 ``E_FAILED_ON_NOT_LEADER``; then trace id / ext header checks (400 ``INVALID_TRACE_ID``,
  ``E_INVALID_JSON_HEADER``, ``E_EXT_NOT_SUPPORT``); an unwritable partition → 400
  ``E_FAILED_ON_NOT_WRITABLE``.  HTTP does not enforce "ordered topics need a partition";
* ``/pub_ext`` reads ``ext`` (query-unescaped a second time, as Go does), merges
  ``X-Nsqext-<Name>`` headers as lower-cased keys and stores the header **re-serialised** as Go's
  ``json.Marshal`` writes a ``map[string]interface{}`` (keys sorted, numbers as float64);
* ``/mpub``: ``Content-Length`` over ``max_body_size`` → 413 ``BODY_TOO_BIG``; topic errors as
  they are (400 ``MISSING_ARG_TOPIC``..., 404 ``E_TOPIC_NOT_EXIST``); text mode splits on
  ``\\n`` and skips empty lines, ``binary`` mode parses ``[u32 count]{[u32 len][bytes]}`` (413
  ``BAD_BODY`` / ``BAD_MESSAGE``); the leader check comes after the body.  An MPUB of no message
  answers 500 ``INTERNAL_ERROR`` at once (the real server waits for the partition's next
  publish, then divides by zero);
* ``/stats``: :mod:`.stats`.

Where the emulation deliberately differs: ``/channel/delete`` of an unknown channel answers 200
(as nsqd without a coordinator does); ``/channel/setoffset`` reads a chunked body (Go panics on
it).  While the node is paused (:meth:`DevCluster.pause_node`) every request **hangs**: the
handler polls every 50 ms and answers once the node resumes, or 503
``{"message":"NODE_PAUSED"}`` after :data:`PAUSE_LIMIT` seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any
from urllib.parse import unquote_plus

from nsq_ha.protocol.names import is_valid_name

from ..http import (
    JSON_TYPE,
    NSQ_CONTENT_TYPE,
    ApiError,
    Handler,
    Request,
    Response,
    Route,
    dispatch,
    go_atoi,
    go_marshal_decoded,
)
from ..model import (
    FORK_VERSION,
    ChannelHub,
    DevNode,
    DevPartition,
    EventKind,
    NodeState,
    ServerError,
)
from ..store import StoredMessage
from ..view import ClusterView
from .publish import check_ext_header
from .stats import stats_answer

__all__ = ["PAUSE_LIMIT", "NsqdHttpApi", "make_nsqd_handler"]

#: how long a request to a paused node waits before answering 503
PAUSE_LIMIT = 30.0
PAUSE_POLL = 0.05
_GET = frozenset({"GET"})
_POST = frozenset({"POST"})
_NOT_EXIST = "E_TOPIC_NOT_EXIST"
_NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
_EXT_PREFIX = "x-nsqext-"
_OFFSET_TYPES = ("timestamp", "special", "virtual_queue", "msgcount")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def make_nsqd_handler(view: ClusterView, node: DevNode) -> Handler:
    """The HTTP handler of one node (an :class:`NsqdHttpApi`, reachable as ``__self__``)."""
    return NsqdHttpApi(view, node).handle


class NsqdHttpApi:
    """The HTTP endpoints of one emulated nsqd."""

    def __init__(self, view: ClusterView, node: DevNode) -> None:
        self.view = view
        self.node = node
        self.routes: dict[str, Route] = {
            "/ping": Route(_GET, "plain", lambda _request: "OK"),
            "/info": Route(_GET, "negotiate", self.info),
            "/pub": Route(_POST, "negotiate", self.pub),
            "/pubtrace": Route(_POST, "v1", self.pubtrace),
            "/pub_ext": Route(_POST, "negotiate", self.pub_ext),
            "/mpub": Route(_POST, "negotiate", self.mpub),
            "/stats": Route(_GET, "negotiate", self.stats),
            "/channel/create": Route(_POST, "v1", self.channel_create),
            "/channel/delete": Route(_POST, "v1", self.channel_delete),
            "/channel/empty": Route(_POST, "v1", self.channel_empty),
            "/channel/pause": Route(_POST, "v1", lambda r: self._pause(r, paused=True)),
            "/channel/unpause": Route(_POST, "v1", lambda r: self._pause(r, paused=False)),
            "/channel/skip": Route(_POST, "v1", lambda r: self._skip(r, skipped=True)),
            "/channel/unskip": Route(_POST, "v1", lambda r: self._skip(r, skipped=False)),
            "/channel/setoffset": Route(_POST, "v1", self.channel_setoffset),
            "/channel/setorder": Route(_POST, "v1", self.channel_setorder),
        }

    def __repr__(self) -> str:
        return f"<NsqdHttpApi node={self.node.index} {self.node.http_url}>"

    async def handle(self, request: Request) -> Response:
        """Answer one request; hang while the node is paused."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PAUSE_LIMIT
        while self.node.state == NodeState.PAUSED:
            if loop.time() >= deadline:
                body = b'{"message":"NODE_PAUSED"}'
                return Response(503, body, [("Content-Type", JSON_TYPE), NSQ_CONTENT_TYPE])
            await asyncio.sleep(PAUSE_POLL)
        return dispatch(self.routes, request)

    # -- addressing -------------------------------------------------------------------------

    def _hosted(self, name: str, number: int) -> DevPartition:
        """The partition as ``getExistingTopic`` finds it on this node (-1: one it leads)."""
        topic = self.view.topics.get(name)
        if topic is None:
            raise ApiError(404, _NOT_EXIST)
        if number == -1:
            led = topic.led_by(self.node)
            if not led:
                raise ApiError(404, _NOT_EXIST)
            return led[0]
        if not 0 <= number < len(topic.partitions):
            raise ApiError(404, _NOT_EXIST)
        part = topic.partitions[number]
        if self.node not in part.replicas:
            raise ApiError(404, _NOT_EXIST)
        return part

    def _require_leader(self, part: DevPartition) -> None:
        if not part.led_by(self.node):
            raise ApiError(400, _NOT_LEADER)

    def _channel_target(self, request: Request) -> tuple[DevPartition, str]:
        """``getExistingTopicChannelFromQuery``: argument errors 400, unknown topic 404."""
        name, number = _topic_partition_args(request.query)
        channel = request.query.get("channel", "")
        if not channel:
            raise ApiError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel):
            raise ApiError(400, "INVALID_ARG_CHANNEL")
        return self._hosted(name, number), channel

    def _existing_hub(self, request: Request) -> ChannelHub:
        part, channel = self._channel_target(request)
        hub = part.hubs.get(channel)
        if hub is None:
            raise ApiError(404, "CHANNEL_NOT_FOUND")
        return hub

    # -- read endpoints ---------------------------------------------------------------------

    def info(self, request: Request) -> object:
        """``{"version","broadcast_address","hostname","http_port","tcp_port","start_time",
        "ha_support"}``."""
        return {
            "version": FORK_VERSION,
            "broadcast_address": self.node.host,
            "hostname": self.node.node_object()["hostname"],
            "http_port": self.node.http_port,
            "tcp_port": self.node.tcp_port,
            "start_time": int(self.node.started_at),
            "ha_support": True,
        }

    def stats(self, request: Request) -> object:
        """``/stats``: JSON with ``format=json``, else a short text summary."""
        return stats_answer(self.view.topics.values(), self.node, request.query)

    # -- publishing -------------------------------------------------------------------------

    def pub(self, request: Request) -> object:
        """``/pub``: one message, answer ``OK``."""
        return self._publish(request, trace=False, ext=False)

    def pubtrace(self, request: Request) -> object:
        """``/pubtrace?trace_id=N``: one message, answer the trace JSON."""
        return self._publish(request, trace=True, ext=False)

    def pub_ext(self, request: Request) -> object:
        """``/pub_ext?ext=<json>``: one message with a header; the trace JSON when it holds a
        ``##trace_id``, else ``OK``."""
        return self._publish(request, trace=False, ext=True)

    def _publish(self, request: Request, *, trace: bool, ext: bool) -> object:
        """``/pub``, ``/pubtrace`` and ``/pub_ext`` (``internalPUB``)."""
        length = _content_length(request)
        if length > self.view.limits.max_msg_size:
            raise ApiError(413, "MSG_TOO_BIG")
        if length <= 0:
            raise ApiError(406, "MSG_EMPTY")
        try:
            name, number = _topic_partition_args(request.query)
            part = self.view.resolve_partition(self.node, name, number, for_write=False)
        except ApiError:
            raise ApiError(404, _NOT_EXIST) from None
        except ServerError as exc:
            raise ApiError(400 if exc.code == _NOT_LEADER else 404, exc.code) from None
        body = request.body[:length]
        if not body:
            raise ApiError(406, "MSG_EMPTY")
        trace_text = request.query.get("trace_id", "")
        trace_id = _parse_u64(trace_text)
        if trace and trace_id is None:
            raise ApiError(400, "INVALID_TRACE_ID")
        header: bytes | None = None
        if ext:
            header, header_trace = _ext_header(request, ext_topic=part.topic.ext)
            if header_trace is not None:
                trace, (trace_text, trace_id) = True, header_trace
        if self.view.unwritable(part):
            raise ApiError(400, "E_FAILED_ON_NOT_WRITABLE")
        traced = trace_id if trace and trace_id is not None else 0
        stored = self.view.append(part, [(body, traced, header)])[0]
        if not trace:
            return "OK"
        return _trace_answer(stored, trace_text)

    def mpub(self, request: Request) -> object:
        """``/mpub``: text lines or ``binary`` framing."""
        if _content_length(request) > self.view.limits.max_body_size:
            raise ApiError(413, "BODY_TOO_BIG")
        name, number = _topic_partition_args(request.query)
        part = self._hosted(name, number)
        if "binary" in request.query:
            bodies = _binary_mpub(
                request.body, self.view.limits.max_msg_size, self.view.limits.max_body_size
            )
        else:
            bodies = self._text_mpub(request.body)
        self._require_leader(part)
        if not bodies:
            raise ApiError(500, "INTERNAL_ERROR")
        if self.view.unwritable(part):
            raise ApiError(400, "E_FAILED_ON_NOT_WRITABLE")
        self.view.append(part, [(body, 0, None) for body in bodies])
        return "OK"

    def _text_mpub(self, data: bytes) -> list[bytes]:
        if len(data) > self.view.limits.max_body_size:
            raise ApiError(413, "BODY_TOO_BIG")
        bodies = [line for line in data.split(b"\n") if line]
        if any(len(body) > self.view.limits.max_msg_size for body in bodies):
            raise ApiError(413, "MSG_TOO_BIG")
        return bodies

    # -- channel admin ----------------------------------------------------------------------

    def channel_create(self, request: Request) -> object:
        """Create a channel on one partition (its leader only)."""
        part, channel = self._channel_target(request)
        self._require_leader(part)
        if part.topic.disable_channel_auto_create:
            raise ApiError(
                403, f"channel {channel} not registered. channel should be initialized before use."
            )
        self.view.create_channel(part.topic.name, channel, partition=part.number)
        return None

    def channel_delete(self, request: Request) -> object:
        """Delete a channel of one partition; its subscribers are disconnected."""
        part, channel = self._channel_target(request)
        self._require_leader(part)
        topic = part.topic
        if topic.disable_channel_auto_create:
            raise ApiError(
                403,
                f"topic {topic.name} has channel auto create disabled. channel {channel} "
                "cuold not be deleted localy in nsqd.",
            )
        part.drop_channel(channel, "channel deleted")
        self.view.record(
            EventKind.CHANNEL_DELETED, topic=topic.name, partition=part.number, channel=channel
        )
        return None

    def channel_empty(self, request: Request) -> object:
        """Skip everything unread, requeued or deferred (in-flight messages stay out)."""
        hub = self._existing_hub(request)
        self._require_leader(hub.partition)
        hub.seek(self.view.now(), end=True)
        self._record(hub, EventKind.CHANNEL_EMPTIED)
        return None

    def _pause(self, request: Request, *, paused: bool) -> object:
        hub = self._existing_hub(request)
        hub.paused = paused
        hub.dispatch(self.view.now())
        kind = EventKind.CHANNEL_PAUSED if paused else EventKind.CHANNEL_UNPAUSED
        self._record(hub, kind)
        return None

    def _skip(self, request: Request, *, skipped: bool) -> object:
        """``/channel/skip`` and ``/channel/unskip`` (nsqd's doSkipChannel): set the state,
        then move the channel to the end, deferred messages dropped, as ``special:-1``."""
        hub = self._existing_hub(request)
        hub.skipped = skipped
        hub.seek(self.view.now(), end=True, read_ahead=False)
        kind = EventKind.CHANNEL_SKIPPED if skipped else EventKind.CHANNEL_UNSKIPPED
        self._record(hub, kind)
        return None

    def channel_setoffset(self, request: Request) -> object:
        """Move a channel's cursor: ``special:-1``, ``virtual_queue:N``, ``msgcount:N``,
        ``timestamp:S``."""
        hub = self._existing_hub(request)
        body = request.body
        if not body:
            raise ApiError(406, "MSG_EMPTY")
        text = body.decode("utf-8", "replace")
        kind, value = _consume_offset(text)
        self._require_leader(hub.partition)
        if kind != "special" and not hub.channel.partition.log:
            # observed: seeking into a commit log that never had a record
            raise ApiError(500, "commit log end of file")
        now = self.view.now()
        if kind == "special":
            if value != -1:
                raise ApiError(500, "not supported offset type")
            hub.seek(now, end=True)
        elif kind == "virtual_queue":
            hub.seek(now, offset=max(0, value))
        elif kind == "msgcount":
            hub.seek(now, count=max(1, value))
        else:
            hub.seek(now, timestamp_ns=value * 1_000_000_000)
        self._record(hub, EventKind.CHANNEL_OFFSET_SET, offset=text)
        return None

    def channel_setorder(self, request: Request) -> object:
        """Switch a channel's ordered mode (``order=true|false``); turning an ordered channel
        plain closes its consumers (no error frame), as nsqd's ``SetOrdered(false)`` does."""
        hub = self._existing_hub(request)
        order = request.query.get("order", "")
        if order not in ("true", "false"):
            raise ApiError(400, "INVALID_OPTION")
        if order == "false" and hub.channel.ordered:
            hub.drop_all("channel order turned off")
        hub.channel.require_order(order == "true")
        hub.dispatch(self.view.now())
        self._record(hub, EventKind.CHANNEL_ORDER_SET, ordered=hub.channel.ordered)
        return None

    def _record(self, hub: ChannelHub, kind: EventKind, **detail: Any) -> None:
        part = hub.partition
        self.view.record(
            kind,
            topic=part.topic.name,
            partition=part.number,
            channel=hub.channel.name,
            node=self.node.index,
            **detail,
        )


# -- request parsing --------------------------------------------------------------------------


def _topic_partition_args(query: dict[str, str]) -> tuple[str, int]:
    """``GetTopicPartitionArgs``: topic required and valid, partition optional (-1)."""
    name = query.get("topic", "")
    if not name:
        raise ApiError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(name):
        raise ApiError(400, "INVALID_ARG_TOPIC")
    raw = query.get("partition", "")
    if not raw:
        return name, -1
    try:
        return name, go_atoi(raw)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


def _content_length(request: Request) -> int:
    """The declared body length; -1 when absent (chunked), as Go's ``ContentLength``."""
    raw = request.headers.get("content-length", "")
    return int(raw) if raw.isascii() and raw.isdigit() else -1


def _parse_u64(text: str) -> int | None:
    """Go's ``strconv.ParseUint(text, 10, 0)``; None when it fails."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value < 1 << 64 else None


def _consume_offset(text: str) -> tuple[str, int]:
    """``ConsumeOffset.FromBytes``: ``<type>:<int64>``."""
    parts = text.split(":")
    if len(parts) != 2 or parts[0] not in _OFFSET_TYPES:
        raise ApiError(400, f"invalid consume offset:{text}")
    try:
        return parts[0], go_atoi(parts[1], "ParseInt")
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


def _binary_mpub(data: bytes, max_msg: int, max_body: int) -> list[bytes]:
    """``readMPUB``: errors are its codes without ``E_``, as HTTP 413."""

    def signed(at: int) -> int:
        return int.from_bytes(data[at : at + 4], "big", signed=True)

    if len(data) < 4:
        raise ApiError(413, "BAD_BODY")
    count = signed(0)
    if count <= 0 or count > (max_body - 4) // 5:
        raise ApiError(413, "BAD_BODY")
    bodies: list[bytes] = []
    pos = 4
    for _ in range(count):
        if pos + 4 > len(data):
            raise ApiError(413, "BAD_MESSAGE")
        size = signed(pos)
        pos += 4
        if size <= 0 or size > max_msg or pos + size > len(data):
            raise ApiError(413, "BAD_MESSAGE")
        bodies.append(data[pos : pos + size])
        pos += size
    return bodies


def _ext_header(request: Request, *, ext_topic: bool) -> tuple[bytes, tuple[str, int] | None]:
    """The ``/pub_ext`` header as nsqd stores it, and its ``##trace_id`` (text and value)."""
    raw = request.query.get("ext", "")
    if _BAD_ESCAPE.search(raw):
        raise ApiError(400, "E_INVALID_JSON_HEADER")
    text = unquote_plus(raw)
    if not text:
        raise ApiError(400, "E_INVALID_JSON_HEADER")
    try:
        value = json.loads(text, parse_int=float, parse_constant=_reject_constant)
    except ValueError:
        raise ApiError(400, "E_INVALID_JSON_HEADER") from None
    if not isinstance(value, dict):
        raise ApiError(400, "E_INVALID_JSON_HEADER")
    for name, header in request.headers.items():
        if name.startswith(_EXT_PREFIX):
            value[name[len(_EXT_PREFIX) :]] = header
    header_bytes = go_marshal_decoded(value).encode()
    try:  # the same header rules as PUB_EXT, trace id included
        trace_id = check_ext_header(header_bytes, ext_topic=ext_topic)
    except ServerError as exc:
        raise ApiError(400, exc.code) from None
    return header_bytes, None if trace_id is None else (value["##trace_id"], trace_id)


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


# -- answers ----------------------------------------------------------------------------------


def _trace_answer(stored: StoredMessage, trace_text: str) -> dict[str, Any]:
    return {
        "status": "OK",
        "id": stored.internal_id,
        "trace_id": trace_text,
        "queue_offset": stored.offset,
        "rawsize": stored.raw_size,
    }
