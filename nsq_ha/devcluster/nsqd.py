"""The emulated nsqd's TCP protocol (V2 as the fork speaks it), one node of a DevCluster.

Built on the project's server-role codec (:mod:`nsq_ha.protocol.command_decoder`) and frame
and message encoders.  What it reproduces (PROTOCOL.md §1-§4, checklist §9):

* the magic (``E_BAD_PROTOCOL`` and close on a wrong one), sequential command handling, the
  connection states of §1.7 and, per command, the fork's exact error texts and whether they
  close the connection (§2.19);
* IDENTIFY validation and its JSON answer with the fork's key order and defaults, then the TLS
  (when the cluster has a TLS context), snappy or deflate upgrade with its ``OK`` frame;
* heartbeats every interval to every connection and the 3 x interval read deadline;
* SUB / SUB_ORDERED / SUB_ADVANCED with the check order of §2.3 (including the partition-token
  and 5-token quirks), RDY gating, FIN/REQ/TOUCH parsed by position, CLS and ``CLOSE_WAIT``;
* every publish command (no DPUB: the fork has none) with the 30-byte traced answers, the
  structural MPUB parsing, and the MPUB_EXT stream desynchronisation after a non-fatal header
  error (the rest of the body is parsed as commands, as nsqd does);
* message frames with the ext and detail parts exactly per subscription (§4.2), sample rate and
  ``ext_filter`` (non-matching messages are acknowledged for the channel).

Deliberately not reproduced: nsqd's output buffering (frames are written at once, so the
emulator has no 50 ms round trip), AUTH (there is no auth server: ``E_AUTH_DISABLED``),
``desired_tag`` dispatch (the tag is echoed in IDENTIFY but every subscriber gets every message),
the connection-count limit and the idle-consumer reaper of §1.4.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import random
import re
import ssl
import struct
import time
from typing import TYPE_CHECKING, Any

from nsq_ha.errors import RemoteProtocolError
from nsq_ha.protocol.command_decoder import BODY_COMMANDS, ClientCommand, CommandDecoder, Magic
from nsq_ha.protocol.compression import DeflateCodec, SnappyCodec, StreamCodec
from nsq_ha.protocol.frames import FrameType, encode_frame
from nsq_ha.protocol.message import DecodedMessage, MessageFormat, encode_message
from nsq_ha.protocol.names import is_valid_name
from nsq_ha.protocol.trace import TracedResponse, encode_traced_response

from .cluster import FORK_VERSION, ServerError, check_ext_header
from .http import go_atoi

if TYPE_CHECKING:
    from .cluster import ChannelHub, DevCluster, DevNode, DevPartition
    from .store import InFlight, StoredMessage

__all__ = ["ClientConnection", "NsqdServer"]

log = logging.getLogger("nsq_ha.devcluster.nsqd")

MAGIC_V2 = b"  V2"
STATE_INIT, STATE_SUBSCRIBED, STATE_CLOSING = 0, 3, 4
MAX_HEARTBEAT_MS = 60_000
MAX_OUTPUT_BUFFER_SIZE = 65536
MAX_OUTPUT_BUFFER_TIMEOUT_MS = 1000
MAX_DEFLATE_LEVEL = 6
MAX_TAG_LENGTH = 100
_FORK_BODY_COMMANDS = BODY_COMMANDS - {b"DPUB"}
_PUBLISH = frozenset({b"PUB", b"PUB_TRACE", b"PUB_EXT", b"MPUB", b"MPUB_TRACE", b"MPUB_EXT"})
_SUBSCRIBE = frozenset({b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED"})
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_HEARTBEAT = b"_heartbeat_"


def go_bytes(data: bytes) -> str:
    """``data`` as Go prints a byte slice: ``[70 79 79]``."""
    return "[" + " ".join(str(b) for b in data) + "]"


def parse_atoi(token: bytes) -> int:
    """Go ``strconv.Atoi`` of a command token; ValueError with Go's message on failure."""
    return go_atoi(token.decode("latin-1"))


def _publish_body_wanted(name: bytes, params: tuple[bytes, ...]) -> bool:
    """nsqd answers a publish without a topic, or with a malformed partition token, before
    reading its body."""
    if name not in _PUBLISH:
        return True
    if not params:
        return False
    if len(params) == 2:
        try:
            parse_atoi(params[1])
        except ValueError:
            return False
    return True


def _partition_token(params: tuple[bytes, ...], count: int) -> int:
    """The partition argument: parsed only when the line has exactly ``count`` tokens."""
    if len(params) + 1 != count:
        return -1
    try:
        return parse_atoi(params[count - 2])
    except ValueError as exc:
        raise ServerError("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None


class NsqdServer:
    """The TCP listener of one emulated node and its open connections."""

    def __init__(self, cluster: DevCluster, node: DevNode) -> None:
        self.cluster = cluster
        self.node = node
        self.clients: set[ClientConnection] = set()
        self._server: asyncio.Server | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()

    async def start(self, port: int = 0) -> int:
        """Listen on ``port`` (0: a free one); return the port."""
        self._server = await asyncio.start_server(self._accept, self.node.host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self, *, abort: bool = False) -> None:
        """Stop listening and close every connection (``abort``: reset them)."""
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            client.drop("node stopped" if not abort else "node killed", abort=abort)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    def paused(self) -> bool:
        """True while the node is paused (connections frozen)."""
        return self.node.state == "paused"

    async def wait_resumed(self) -> None:
        """Return once the node is not paused."""
        while self.paused():
            self._resumed.clear()
            await self._resumed.wait()

    def resume(self) -> None:
        """Wake the frozen connections and deliver what piled up."""
        self._resumed.set()
        now = self.cluster.now()
        for client in list(self.clients):
            if client.hub is not None:
                client.hub.dispatch(now)

    def arm_cut(self) -> None:
        """Apply a new ``cut_after`` budget to every open connection."""
        for client in self.clients:
            client.arm_cut()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = ClientConnection(self, reader, writer)
        self.clients.add(client)
        try:
            await client.run()
        finally:
            self.clients.discard(client)


class ClientConnection:
    """One client's TCP connection to an emulated nsqd."""

    def __init__(
        self, server: NsqdServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.cluster = server.cluster
        self.node = server.node
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.remote_address = f"{peer[0]}:{peer[1]}"
        self.client_id = self.remote_address.split(":")[0]
        self.hostname = self.client_id
        self.user_agent = ""
        self.state = STATE_INIT
        self.connect_ts = int(time.time())
        cluster = self.cluster
        self.decoder = CommandDecoder(
            max_body_size=cluster.max_body_size,
            body_limits={
                b"PUB": cluster.max_msg_size,
                b"PUB_TRACE": cluster.max_msg_size,
                b"PUB_EXT": cluster.max_msg_size,
            },
            max_message_size=cluster.max_msg_size,
            body_commands=_FORK_BODY_COMMANDS,
            body_wanted=_publish_body_wanted,
        )
        # negotiated settings
        self.heartbeat_interval: float | None = cluster.client_timeout / 2
        self.msg_timeout = cluster.msg_timeout
        self.output_buffer_size = 100
        self.output_buffer_size_set = False
        self.output_buffer_timeout_ms = 50
        self.sample_rate = 0
        self.desired_tag = ""
        self.extend_support = False
        self.ext_filter: dict[str, Any] | None = None
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.codec: StreamCodec | None = None
        # subscription
        self.hub: ChannelHub | None = None
        self.format = MessageFormat()
        self.rdy = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.closed = False
        self._cut_budget: int | None = None
        self._cut_epoch = -1
        self.arm_cut()
        self._heartbeat: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<ClientConnection node{self.node.index} {self.remote_address} state={self.state}>"

    # -- life cycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until either side closes it."""
        try:
            await self._serve()
        except (ConnectionError, OSError, asyncio.IncompleteReadError, RemoteProtocolError) as exc:
            log.debug("node%d %s: %s", self.node.index, self.remote_address, exc)
        except TimeoutError:
            self.cluster.record("client_timed_out", node=self.node.index, peer=self.remote_address)
        finally:
            self._finish(abort=False)

    async def _serve(self) -> None:
        first = True
        while not self.closed:
            await self.server.wait_resumed()
            deadline = None if first else self._read_deadline()
            async with asyncio.timeout(deadline if not first else self.cluster.client_timeout):
                data = await self.reader.read(65536)
            if not data:
                return
            await self.server.wait_resumed()
            if self.codec is not None:
                data = self.codec.decompress(data)
            self.decoder.receive(data)
            while not self.closed and (event := self.decoder.pop()) is not None:
                if isinstance(event, Magic):
                    if event.data != MAGIC_V2:
                        await self._error(ServerError("E_BAD_PROTOCOL", None))
                        return
                    first = False
                    self._start_heartbeats()
                    continue
                await self._command(event)

    def _read_deadline(self) -> float | None:
        if self.heartbeat_interval is None:
            return None
        return 3 * self.heartbeat_interval

    def _start_heartbeats(self) -> None:
        if self._heartbeat is None and self.heartbeat_interval is not None:
            self._heartbeat = asyncio.get_running_loop().create_task(
                self._heartbeats(), name=f"heartbeat-{self.remote_address}"
            )

    async def _heartbeats(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while not self.closed and self.heartbeat_interval is not None:
            due += self.heartbeat_interval  # a fixed beat: no drift from the writes
            await asyncio.sleep(max(0.0, due - loop.time()))
            if self.server.paused() or self.closed:
                continue
            self._write(encode_frame(FrameType.RESPONSE, _HEARTBEAT))

    def drop(self, reason: str, *, abort: bool = False) -> None:
        """Close the connection without an error frame (leader moved, node stopped ...)."""
        if self.closed:
            return
        self.cluster.record(
            "connection_dropped", node=self.node.index, peer=self.remote_address, reason=reason
        )
        self._finish(abort=abort)

    def _finish(self, *, abort: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self.hub is not None:
            self.hub.remove(self, self.cluster.now())
            self.hub.dispatch(self.cluster.now())
        self.in_flight_count = 0
        transport = self.writer.transport
        if abort:
            transport.abort()
        else:
            transport.close()
        self.server.clients.discard(self)

    # -- output -----------------------------------------------------------------------------

    def arm_cut(self) -> None:
        """Take the node's current ``cut_after`` setting."""
        faults = self.node.faults
        if faults.cut_epoch != self._cut_epoch:
            self._cut_epoch = faults.cut_epoch
            self._cut_budget = faults.cut_after

    def _write(self, frame: bytes) -> None:
        if self.closed:
            return
        data = self.codec.compress(frame) if self.codec is not None else frame
        if self._cut_budget is not None:
            if len(data) >= self._cut_budget:
                self.writer.write(data[: self._cut_budget])
                self.cluster.record(
                    "connection_cut",
                    node=self.node.index,
                    peer=self.remote_address,
                    bytes=self._cut_budget,
                )
                self._cut_budget = 0
                self._finish(abort=False)
                return
            self._cut_budget -= len(data)
        self.writer.write(data)

    async def _respond(self, command: bytes, data: bytes, frame_type: FrameType) -> None:
        """Write a response or error frame, through the delay/drop faults."""
        faults = self.node.faults
        name = command.decode("latin-1")
        if faults.applies_to(name):
            if faults.drop:
                if faults.drop > 0:
                    faults.drop -= 1
                self.cluster.record(
                    "response_dropped", node=self.node.index, command=name, frame=data[:40]
                )
                return
            if faults.delay > 0:
                await asyncio.sleep(faults.delay)
        self._write(encode_frame(frame_type, data))

    async def _ok(self, command: bytes, data: bytes = b"OK") -> None:
        await self._respond(command, data, FrameType.RESPONSE)

    async def _error(self, error: ServerError, command: bytes = b"") -> None:
        await self._respond(command, error.text.encode("utf-8", "surrogateescape"), FrameType.ERROR)
        if error.fatal:
            with contextlib.suppress(Exception):
                await self.writer.drain()
            self._finish(abort=False)

    # -- commands -----------------------------------------------------------------------------

    async def _command(self, command: ClientCommand) -> None:
        handler = _HANDLERS.get(command.name)
        try:
            if handler is None:
                tokens = " ".join(go_bytes(t) for t in (command.name, *command.params))
                raise ServerError("E_INVALID", f"invalid command [{tokens}]")
            await handler(self, command)
        except ServerError as error:
            await self._error(error, command.name)

    async def _nop(self, command: ClientCommand) -> None:
        return

    async def _identify(self, command: ClientCommand) -> None:
        if self.state != STATE_INIT:
            raise ServerError("E_INVALID", "cannot IDENTIFY in current state")
        body = self._body_or_error(command, "IDENTIFY ")
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            data = None
        if not isinstance(data, dict) or not _identify_types_ok(data):
            raise ServerError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        self._apply_identify(data)
        negotiation = bool(data.get("feature_negotiation"))
        if not negotiation:
            await self._ok(command.name)
            return
        want_tls = bool(data.get("tls_v1")) and self.cluster.tls_context is not None
        snappy = bool(data.get("snappy"))
        deflate = bool(data.get("deflate"))
        if snappy and deflate:
            raise ServerError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
            )
        level = 0
        if deflate:
            level = min(int(data.get("deflate_level") or 0), MAX_DEFLATE_LEVEL)
        answer: dict[str, Any] = {
            "max_rdy_count": self.cluster.max_rdy_count,
            "version": FORK_VERSION,
            "max_msg_timeout": int(self.cluster.max_msg_timeout * 1000),
            "msg_timeout": int(self.msg_timeout * 1000),
            "tls_v1": want_tls,
            "deflate": deflate,
            "deflate_level": level,
            "max_deflate_level": MAX_DEFLATE_LEVEL,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": False,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": self.output_buffer_timeout_ms,
        }
        if self.desired_tag:
            answer["desired_tag"] = self.desired_tag
        await self._ok(command.name, json.dumps(answer, separators=(",", ":")).encode())
        if want_tls:
            context = self.cluster.tls_context
            assert isinstance(context, ssl.SSLContext)  # noqa: S101 - checked above
            await self.writer.drain()
            await self.writer.start_tls(context)
            self.tls = True
            await self._ok(command.name)
        if snappy:
            self.codec, self.snappy = SnappyCodec(), True
            await self._ok(command.name)
        elif deflate:
            self.codec, self.deflate, self.deflate_level = DeflateCodec(level), True, level
            await self._ok(command.name)

    def _apply_identify(self, data: dict[str, Any]) -> None:
        """Validate and take the IDENTIFY fields in nsqd's order (§3.1)."""

        def invalid(text: str) -> ServerError:
            return ServerError("E_BAD_BODY", f"IDENTIFY {text}")

        heartbeat = data.get("heartbeat_interval", 0)
        if heartbeat == -1:
            interval: float | None = None
        elif heartbeat == 0:
            interval = self.cluster.client_timeout / 2
        elif 1000 <= heartbeat <= MAX_HEARTBEAT_MS:
            interval = heartbeat / 1000
        else:
            raise invalid(f"heartbeat interval ({heartbeat}) is invalid")
        size = data.get("output_buffer_size", 0)
        if size == -1:
            size = 1
        elif size == 0:
            size = 100
        elif size < 64:
            raise invalid(f"output buffer size ({size}) is invalid")
        size = min(size, MAX_OUTPUT_BUFFER_SIZE)
        timeout = data.get("output_buffer_timeout", 0)
        if timeout == -1:
            timeout = 0
        elif timeout == 0:
            timeout = 50
        elif timeout < 10:
            timeout = 10
        elif timeout > MAX_OUTPUT_BUFFER_TIMEOUT_MS:
            raise invalid(f"output buffer timeout ({timeout}) is invalid")
        sample_rate = data.get("sample_rate", 0)
        if not 0 <= sample_rate <= 99:
            raise invalid(f"sample rate ({sample_rate}) is invalid")
        msg_timeout = data.get("msg_timeout", 0)
        if msg_timeout != 0 and not 1000 <= msg_timeout <= self.cluster.max_msg_timeout * 1000:
            raise invalid(f"msg timeout ({msg_timeout}) is invalid")
        tag = data.get("desired_tag", "")
        if len(tag) > MAX_TAG_LENGTH:
            raise invalid(f"invalid tag len {len(tag)}, exceed limit {MAX_TAG_LENGTH}")
        self.heartbeat_interval = interval
        self.output_buffer_size = size
        self.output_buffer_size_set = data.get("output_buffer_size", 0) != 0
        self.output_buffer_timeout_ms = timeout
        self.sample_rate = sample_rate
        if msg_timeout:
            self.msg_timeout = msg_timeout / 1000
        self.desired_tag = tag
        self.extend_support = bool(data.get("extend_support", False))
        ext_filter = data.get("ext_filter")
        self.ext_filter = ext_filter if isinstance(ext_filter, dict) else None
        self.client_id = data.get("client_id") or data.get("short_id") or self.client_id
        self.hostname = data.get("hostname") or data.get("long_id") or self.hostname
        self.user_agent = data.get("user_agent", "")
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        self._start_heartbeats()

    def _body_or_error(self, command: ClientCommand, prefix: str) -> bytes:
        """The body of IDENTIFY/AUTH, or their ``E_BAD_BODY`` for a refused size."""
        if command.body is not None:
            return command.body
        size = command.declared_size or 0
        if size <= 0:
            raise ServerError("E_BAD_BODY", f"{prefix}invalid body size {size}")
        raise ServerError(
            "E_BAD_BODY", f"{prefix}body too big {size} > {self.cluster.max_body_size}"
        )

    async def _auth(self, command: ClientCommand) -> None:
        if self.state != STATE_INIT:
            raise ServerError("E_INVALID", "cannot AUTH in current state")
        if command.params:
            raise ServerError("E_INVALID", "AUTH invalid number of parameters")
        self._body_or_error(command, "AUTH ")
        raise ServerError("E_AUTH_DISABLED", "AUTH Disabled")

    # -- subscribing ------------------------------------------------------------------------

    async def _sub(self, command: ClientCommand) -> None:
        name, params = command.name, command.params
        start: tuple[str, int] | None = None
        if name == b"SUB_ADVANCED" and len(params) >= 4 and params[3]:
            start = _parse_start(params[3])
        if self.state != STATE_INIT:
            raise ServerError("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval is None:
            raise ServerError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 2:
            raise ServerError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = params[0].decode("latin-1")
        channel_name = params[1].decode("latin-1")
        if not is_valid_name(topic_name):
            raise ServerError("E_BAD_TOPIC", f'SUB topic name "{topic_name}" is not valid')
        if not is_valid_name(channel_name):
            raise ServerError("E_BAD_CHANNEL", f'SUB channel name "{channel_name}" is not valid')
        partition = _partition_token(params, 4)
        cluster = self.cluster
        part = cluster.hosted_partition(self.node, topic_name, partition, for_write=False)
        topic = part.topic
        if topic.ordered and name != b"SUB_ORDERED":
            raise ServerError(
                "E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub"
            )
        if topic.ext and not self.extend_support:
            raise ServerError(
                "E_SUB_EXTEND_NEED",
                "this topic is extended and should identify as extend support.",
            )
        if not topic.ext and self.extend_support:
            raise ServerError(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.",
            )
        cluster.check_leader(self.node, part, fatal=True)
        if (
            topic.disable_channel_auto_create
            and channel_name not in part.hubs
            and channel_name not in topic.registered_channels
        ):
            raise ServerError(
                "E_SUB_CHANNEL_NOT_REGISTERED", "channel is not registered under topic."
            )
        if name == b"SUB_ORDERED" and self.sample_rate != 0:
            raise ServerError(
                "E_INVALID", "order consume is not allowed while sample rate is not 0"
            )
        hub = part.hub(channel_name)
        if name == b"SUB_ORDERED":
            hub.channel.ordered = True
        if start is not None and not hub.clients:
            _apply_start(hub, start)
        self.format = MessageFormat(
            fork_ids=True,
            ext=self.extend_support and topic.ext,
            detail=name in (b"SUB_ORDERED", b"SUB_ADVANCED"),
        )
        if not self.output_buffer_size_set and not (self.tls or self.codec):
            self.output_buffer_size = 4096
        self.state = STATE_SUBSCRIBED
        self.hub = hub
        hub.add(self)
        cluster.record(
            "subscribed",
            node=self.node.index,
            peer=self.remote_address,
            topic=topic.name,
            partition=part.number,
            channel=channel_name,
            command=name.decode(),
        )
        await self._ok(name)

    async def _rdy(self, command: ClientCommand) -> None:
        if self.state == STATE_CLOSING:
            return
        if self.state != STATE_SUBSCRIBED:
            raise ServerError("E_INVALID", "cannot RDY in current state")
        count = 1
        if command.params:
            raw = command.params[0].decode("latin-1")
            if not raw.isascii() or not raw.isdigit():
                raise ServerError("E_INVALID", f"RDY could not parse count {raw}")
            count = int(raw)
            if count > self.cluster.max_rdy_count:
                raise ServerError(
                    "E_INVALID", f"RDY count {count} out of range 0-{self.cluster.max_rdy_count}"
                )
        self.rdy = count
        if self.hub is not None:
            self.hub.dispatch(self.cluster.now())

    def _message_id(self, command: ClientCommand, what: str) -> tuple[ChannelHub, bytes, int]:
        if self.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise ServerError("E_INVALID", f"cannot {what} in current state")
        if not command.params:
            raise ServerError("E_INVALID", f"{what} insufficient number of params")
        message_id = command.params[0]
        internal_id = int.from_bytes(message_id[:8], "big", signed=True)
        # only FIN refuses a non-positive internal id; REQ/TOUCH just find nothing in flight
        if len(message_id) != 16 or (what == "FIN" and internal_id <= 0):
            raise ServerError("E_INVALID", "Invalid Message ID")
        if self.hub is None:
            raise ServerError("E_INVALID", "No channel")
        return self.hub, message_id, internal_id

    async def _fin(self, command: ClientCommand) -> None:
        hub, message_id, internal_id = self._message_id(command, "FIN")
        self.cluster.check_leader(self.node, hub.partition, fatal=True)
        try:
            hub.channel.finish(internal_id, self)
        except KeyError:
            raise ServerError(
                "E_FIN_FAILED",
                f"FIN {go_bytes(message_id)} failed ErrType:7 ErrCode:0 : Message ID not in flight",
                fatal=False,
            ) from None
        self.in_flight_count -= 1
        self.finish_count += 1
        hub.dispatch(self.cluster.now())

    async def _req(self, command: ClientCommand) -> None:
        hub, message_id, internal_id = self._message_id(command, "REQ")
        if len(command.params) < 2:
            raise ServerError("E_INVALID", "REQ insufficient number of params")
        raw = command.params[1].decode("latin-1")
        if not raw.isascii() or not raw.isdigit():
            # nsqd's text carries the raw id bytes, then the token
            raw_id = message_id.decode("utf-8", "surrogateescape")
            raise ServerError("E_INVALID", f"REQ could not parse timeout {raw_id}, {raw}")
        delay = min(int(raw) / 1000, self.cluster.max_req_timeout)
        now = self.cluster.now()
        try:
            requeued = hub.channel.requeue(internal_id, self, delay, now)
        except KeyError:
            raise ServerError(
                "E_REQ_FAILED",
                f"REQ {go_bytes(message_id)} failed Message ID not in flight",
                fatal=False,
            ) from None
        if requeued:
            self.in_flight_count -= 1
            self.requeue_count += 1
            hub.dispatch(now)

    async def _touch(self, command: ClientCommand) -> None:
        hub, message_id, internal_id = self._message_id(command, "TOUCH")
        try:
            hub.channel.touch(internal_id, self, self.msg_timeout, self.cluster.now())
        except KeyError:
            raise ServerError(
                "E_TOUCH_FAILED",
                f"TOUCH {go_bytes(message_id)} failed Message ID not in flight",
                fatal=False,
            ) from None

    async def _cls(self, command: ClientCommand) -> None:
        if self.state != STATE_SUBSCRIBED:
            raise ServerError("E_INVALID", "cannot CLS in current state")
        self.state = STATE_CLOSING
        self.rdy = 0
        await self._ok(command.name, b"CLOSE_WAIT")

    # -- delivery (called by the channel hub) -----------------------------------------------

    def has_room(self) -> bool:
        """True when this client may take one more message now."""
        return (
            self.state == STATE_SUBSCRIBED
            and not self.closed
            and not self.server.paused()
            and self.in_flight_count < self.rdy
        )

    def deliver(self, flight: InFlight) -> None:
        """Write one message frame (or acknowledge it for the channel when sampled out or
        filtered out)."""
        message = flight.message
        hub = self.hub
        if hub is None:
            return
        if (self.sample_rate and random.randrange(100) >= self.sample_rate) or (  # noqa: S311
            not self._filter_matches(message)
        ):
            hub.channel.finish(message.internal_id, self)
            return
        self.in_flight_count += 1
        self.message_count += 1
        data = encode_message(
            DecodedMessage(
                timestamp=message.timestamp,
                attempts=flight.attempts,
                id=message.id,
                body=message.body,
                ext_version=message.ext_version,
                ext_data=message.ext_data,
                offset=message.offset,
                raw_size=message.raw_size,
            ),
            self.format,
        )
        self._write(encode_frame(FrameType.MESSAGE, data))

    def on_timeout(self, flight: InFlight) -> None:
        """The cluster timed out a message this client held."""
        self.in_flight_count = max(0, self.in_flight_count - 1)
        self.timeout_count += 1

    def _filter_matches(self, message: StoredMessage) -> bool:
        ext_filter = self.ext_filter
        if not ext_filter or self.hub is None or not self.hub.partition.topic.ext:
            return True
        kind = ext_filter.get("type", 0)
        if kind not in (1, 2, 3, 4):
            return True
        if message.ext_version != 4:
            return False
        try:
            header = json.loads(message.ext_data)
        except ValueError:
            return False
        if not isinstance(header, dict):
            return False

        def one(key: object, pattern: object, how: int) -> bool:
            value = header.get(key) if isinstance(key, str) else None
            if not isinstance(value, str) or not isinstance(pattern, str):
                return False
            if how == 2:
                try:
                    return re.search(pattern, value) is not None
                except re.error:
                    return False
            if how == 3:
                return fnmatch.fnmatchcase(value, pattern)
            return value == pattern

        if kind == 4:
            terms = ext_filter.get("filter_data_list") or []
            results = [
                one(t.get("filter_ext_key"), t.get("filter_data"), 1)
                for t in terms
                if isinstance(t, dict)
            ]
            combine = all if ext_filter.get("filter_ext_key") == "all" else any
            matched = bool(results) and combine(results)
        else:
            matched = one(ext_filter.get("filter_ext_key"), ext_filter.get("filter_data"), kind)
        return matched != bool(ext_filter.get("inverse"))

    # -- publishing -------------------------------------------------------------------------

    async def _publish(self, command: ClientCommand) -> None:
        name, params = command.name, command.params
        batch = name.startswith(b"MPUB")
        if not params:
            raise ServerError("E_INVALID", "insufficient number of parameters")
        partition = _partition_token(params, 3)
        if command.body is None and command.refusal is None:
            self._refused_size(command, batch)
        topic_name = params[0].decode("latin-1")
        cluster = self.cluster
        part = cluster.hosted_partition(self.node, topic_name, partition, for_write=True)
        if command.refusal is not None:
            _refused_batch(command.refusal, cluster.max_msg_size)
        body = command.body
        assert body is not None  # noqa: S101 - a refused body raised above
        items = _split_batch(body) if batch else [(body, 0)]
        messages: list[tuple[bytes, int, bytes | None]] = []
        traced_ext = False
        for index, (data, end) in enumerate(items):
            if name in (b"PUB_TRACE", b"MPUB_TRACE"):
                if len(data) <= 8:
                    if batch:
                        raise ServerError(
                            "E_BAD_MESSAGE",
                            f"MPUB invalid message({index}) body size {len(data)} for tracing",
                        )
                    raise ServerError(
                        "E_BAD_BODY", f"invalid body size {len(data)} with trace id enabled"
                    )
                messages.append((data[8:], int.from_bytes(data[:8], "big"), None))
            elif name in (b"PUB_EXT", b"MPUB_EXT"):
                try:
                    message, has_trace = self._ext_message(part, data, batch)
                except ServerError as error:
                    if batch and not error.fatal:
                        # nsqd stops reading the body here and parses the rest as commands
                        self.decoder.unread(body[end:])
                    raise
                traced_ext = traced_ext or has_trace
                messages.append(message)
            else:
                messages.append((data, 0, None))
        cluster.check_leader(self.node, part, fatal=False)
        if cluster.unwritable(part):
            raise ServerError("E_FAILED_ON_NOT_WRITABLE", fatal=False)
        stored = cluster.append(part, messages)
        if name == b"PUB_TRACE" or (name == b"PUB_EXT" and traced_ext):
            first = stored[0]
            answer = TracedResponse(first.internal_id, first.trace_id, first.offset, first.raw_size)
            await self._ok(name, encode_traced_response(answer))
        elif name == b"MPUB_TRACE":
            first = stored[0]
            total = sum(m.raw_size for m in stored)
            answer = TracedResponse(first.internal_id, 0, first.offset, total)
            await self._ok(name, encode_traced_response(answer))
        else:
            await self._ok(name)

    def _refused_size(self, command: ClientCommand, batch: bool) -> None:
        size = command.declared_size or 0
        if size <= 0:
            raise ServerError("E_BAD_BODY", f"invalid body size {size}")
        if batch:
            raise ServerError("E_BAD_BODY", f"body too big {size} > {self.cluster.max_body_size}")
        raise ServerError("E_BAD_MESSAGE", f"message too big {size} > {self.cluster.max_msg_size}")

    def _ext_message(
        self, part: DevPartition, data: bytes, batch: bool
    ) -> tuple[tuple[bytes, int, bytes | None], bool]:
        if len(data) <= 2:
            raise ServerError(
                "E_BAD_BODY", f"invalid body size {len(data)} with ext json header enabled"
            )
        (length,) = _U16.unpack_from(data)
        if len(data) <= 2 + length:
            raise ServerError(
                "E_BAD_BODY", f"invalid body size {len(data)} in ext json header content length"
            )
        header, body = data[2 : 2 + length], data[2 + length :]
        if batch and not header:
            return (body, 0, None), False
        topic = part.topic
        try:
            trace_id = check_ext_header(header, ext_topic=topic.ext)
        except ServerError as error:
            if error.code == "E_EXT_NOT_SUPPORT":
                raise ServerError(
                    error.code, f"{error.description} {topic.name}", fatal=False
                ) from None
            raise
        return (body, trace_id or 0, header), trace_id is not None

    # -- standalone-only commands -------------------------------------------------------------

    async def _internal_create_topic(self, command: ClientCommand) -> None:
        if len(command.params) < 2:
            raise ServerError("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        raise ServerError(
            "E_CREATE_TOPIC_FAILED",
            "CREATE_TOPIC is not allowed here while cluster feature enabled.",
            fatal=False,
        )


def _identify_types_ok(data: dict[str, Any]) -> bool:
    """JSON types as strict as Go's decoder into nsqd's struct."""
    ints = (
        "heartbeat_interval",
        "output_buffer_size",
        "output_buffer_timeout",
        "sample_rate",
        "msg_timeout",
        "deflate_level",
    )
    strings = ("client_id", "short_id", "hostname", "long_id", "user_agent", "desired_tag")
    bools = ("feature_negotiation", "tls_v1", "snappy", "deflate", "extend_support")
    for key in ints:
        value = data.get(key, 0)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return False
    for key in strings:
        if data.get(key) is not None and not isinstance(data.get(key), str):
            return False
    return all(data.get(key) is None or isinstance(data.get(key), bool) for key in bools)


def _parse_start(token: bytes) -> tuple[str, int]:
    """A SUB_ADVANCED start position ``<type>:<int64>`` (§2.3.1), with nsqd's error texts."""
    text = token.decode("latin-1")
    kind, _, value = text.partition(":")
    if kind not in ("special", "virtual_queue", "timestamp", "msgcount"):
        raise ServerError("E_INVALID", f"invalid consume offset:{text}")
    try:
        number = go_atoi(value, "ParseInt")
    except ValueError as exc:
        raise ServerError("E_INVALID", str(exc)) from None
    if kind == "special" and number != -1:
        raise ServerError("E_INVALID", "not supported offset type")
    return kind, number


def _apply_start(hub: ChannelHub, start: tuple[str, int]) -> None:
    kind, value = start
    channel = hub.channel
    if kind == "special":
        channel.seek(end=True)
    elif kind == "virtual_queue":
        channel.seek(offset=value)
    elif kind == "msgcount":
        channel.seek(count=max(1, value))
    else:
        channel.seek(timestamp_ns=value * 1_000_000_000)


def _split_batch(body: bytes) -> list[tuple[bytes, int]]:
    """The messages of an MPUB* body (already validated structurally by the decoder), each
    with the body position where it ends."""
    (count,) = _U32.unpack_from(body)
    position = 4
    items: list[tuple[bytes, int]] = []
    for _ in range(count):
        (size,) = _U32.unpack_from(body, position)
        position += 4
        items.append((body[position : position + size], position + size))
        position += size
    return items


def _refused_batch(refusal: tuple[str, ...], max_msg_size: int) -> None:
    kind = refusal[0]
    if kind == "count":
        raise ServerError("E_BAD_BODY", f"MPUB invalid message count {refusal[1]}")
    index, size = refusal[1], refusal[2]
    if kind == "message_size":
        raise ServerError("E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size}")
    raise ServerError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")


_HANDLERS = {
    b"NOP": ClientConnection._nop,
    b"IDENTIFY": ClientConnection._identify,
    b"AUTH": ClientConnection._auth,
    b"SUB": ClientConnection._sub,
    b"SUB_ORDERED": ClientConnection._sub,
    b"SUB_ADVANCED": ClientConnection._sub,
    b"RDY": ClientConnection._rdy,
    b"FIN": ClientConnection._fin,
    b"REQ": ClientConnection._req,
    b"TOUCH": ClientConnection._touch,
    b"CLS": ClientConnection._cls,
    b"INTERNAL_CREATE_TOPIC": ClientConnection._internal_create_topic,
    **dict.fromkeys(_PUBLISH, ClientConnection._publish),
}
