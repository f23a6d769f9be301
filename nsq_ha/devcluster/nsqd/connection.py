"""One client's connection to the emulated nsqd: the TCP protocol (V2 as the fork speaks it).

Built on the project's server-role codec (:mod:`nsq_ha.protocol.command_decoder`) and frame
and message encoders.  What it reproduces (PROTOCOL.md §1-§4, checklist §9):

* the magic (``E_BAD_PROTOCOL`` and close on a wrong one), sequential command handling, the
  connection states of §1.7 and, per command, the fork's exact error texts and whether they
  close the connection (§2.19);
* IDENTIFY validation and its JSON answer (:mod:`.identify`), then the TLS (when the
  cluster has a TLS context), snappy or deflate upgrade with its ``OK`` frame;
* heartbeats every interval to every connection and the 3 x interval read deadline;
* SUB / SUB_ORDERED / SUB_ADVANCED with the check order of §2.3 (including the partition-token
  and 5-token quirks), RDY gating, FIN/REQ/TOUCH parsed by position, CLS and ``CLOSE_WAIT``;
* every publish command (:mod:`.publish`);
* message frames with the ext and detail parts exactly per subscription (§4.2), sample rate,
  ``ext_filter`` (:mod:`..ext_filter`; non-matching messages are acknowledged for the channel)
  and ``desired_tag`` routing (the channel hub's dispatch).

Deliberately not reproduced: nsqd's output buffering timeout (the frames of one loop turn are
written together at its end, so the emulator has no 50 ms round trip), AUTH (there is no auth
server: ``E_AUTH_DISABLED``), the connection-count limit and the idle-consumer reaper of §1.4.

The server sees its cluster only as a :class:`~nsq_ha.devcluster.view.ClusterView`; its
connections join channels as :class:`~nsq_ha.devcluster.model.Subscriber` objects.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from nsq_ha.errors import RemoteProtocolError
from nsq_ha.protocol.command_decoder import BODY_COMMANDS, ClientCommand, CommandDecoder, Magic
from nsq_ha.protocol.compression import DeflateCodec, SnappyCodec
from nsq_ha.protocol.frames import HEARTBEAT, FrameType, encode_frame
from nsq_ha.protocol.message import MessageFormat

from ..ext_filter import filter_matches
from ..model import ChannelHub, DevNode, EventKind, ServerError
from ..store import InFlight, Partition, StoredMessage
from ..view import ClusterView
from .args import (
    apply_start,
    go_bytes,
    parse_message_id,
    parse_req_delay,
    read_sub,
    refused,
)
from .identify import Identity, identify_answer, read_identify
from .output import FrameWriter, message_frame
from .publish import (
    PUBLISH,
    publish_answer,
    publish_body_wanted,
    publish_target,
    read_publish,
)

__all__ = ["ClientConnection", "ClientState", "Listener"]

log = logging.getLogger("nsq_ha.devcluster.nsqd")

MAGIC_V2 = b"  V2"
_FORK_BODY_COMMANDS = BODY_COMMANDS - {b"DPUB"}


class ClientState(enum.IntEnum):
    """A connection's state, numbered as nsqd numbers them (``/stats`` reports the number)."""

    INIT = 0
    SUBSCRIBED = 3
    CLOSING = 4


_SUBSCRIBED = ClientState.SUBSCRIBED


class Listener(Protocol):
    """What a connection needs of the node's listener (:class:`~.server.NsqdServer`)."""

    view: ClusterView
    node: DevNode

    @property
    def clients(self) -> set[ClientConnection]:
        """The node's open connections."""
        ...

    def paused(self) -> bool:
        """True while the node is paused."""
        ...

    async def wait_resumed(self) -> None:
        """Return once the node is not paused."""
        ...


class ClientConnection:
    """One client's TCP connection to an emulated nsqd."""

    def __init__(
        self, server: Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.view = server.view
        self.node = server.node
        self.node.client_sequence += 1
        self.number = self.node.client_sequence
        self.reader = reader
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.remote_address = f"{peer[0]}:{peer[1]}"
        self.client_id = self.remote_address.split(":")[0]
        self.hostname = self.client_id
        self.user_agent = ""
        self.published_to: set[Partition] = set()
        self.state = ClientState.INIT
        self.connect_ts = int(time.time())
        limits = self.view.limits
        self.decoder = CommandDecoder(
            max_body_size=limits.max_body_size,
            body_limits={
                b"PUB": limits.max_msg_size,
                b"PUB_TRACE": limits.max_msg_size,
                b"PUB_EXT": limits.max_msg_size,
            },
            max_message_size=limits.max_msg_size,
            body_commands=_FORK_BODY_COMMANDS,
            body_wanted=publish_body_wanted,
        )
        self.output = FrameWriter(
            writer,
            self.node,
            self.remote_address,
            record=self.view.record,
            on_cut=lambda: self._finish(abort=False),
        )
        # negotiated settings
        self.heartbeat_interval: float | None = limits.client_timeout / 2
        self.msg_timeout = limits.msg_timeout
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
        self._heartbeat: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return (
            f"<ClientConnection node{self.node.index} {self.remote_address} "
            f"state={self.state.name}>"
        )

    # -- life cycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until either side closes it."""
        try:
            await self._serve()
        except TimeoutError:  # first: TimeoutError is an OSError
            self.view.record(
                EventKind.CLIENT_TIMED_OUT, node=self.node.index, peer=self.remote_address
            )
        except (ConnectionError, OSError, asyncio.IncompleteReadError, RemoteProtocolError) as exc:
            log.debug("node%d %s: %s", self.node.index, self.remote_address, exc)
        finally:
            self._finish(abort=False)

    async def _serve(self) -> None:
        first = True
        while not self.closed:
            await self.server.wait_resumed()
            deadline = None if first else self._read_deadline()
            async with asyncio.timeout(deadline if not first else self.view.limits.client_timeout):
                data = await self.reader.read(65536)
            if not data:
                return
            await self.server.wait_resumed()
            if self.output.codec is not None:
                data = self.output.codec.decompress(data)
            self.decoder.receive(data)
            while not self.closed and (event := self.decoder.pop()) is not None:
                if isinstance(event, Magic):
                    if event.data != MAGIC_V2:
                        await self._error(ServerError("E_BAD_PROTOCOL", None))
                        return
                    first = False
                    self._start_heartbeats()
                    continue
                quick = _QUICK_HANDLERS.get(event.name)
                if quick is None:
                    await self._command(event)
                    continue
                try:  # the commands that never wait: called, no coroutine per command
                    quick(self, event)
                except ServerError as error:
                    await self._error(error, event.name)

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
            self.output.write(encode_frame(FrameType.RESPONSE, HEARTBEAT))

    def drop(self, reason: str, *, abort: bool = False) -> None:
        """Close the connection without an error frame (leader moved, node stopped ...)."""
        if self.closed:
            return
        self.view.record(
            EventKind.CONNECTION_DROPPED,
            node=self.node.index,
            peer=self.remote_address,
            reason=reason,
        )
        self._finish(abort=abort)

    def _finish(self, *, abort: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self.hub is not None:
            self.hub.remove(self, self.view.now())
            self.hub.dispatch(self.view.now())
        self.in_flight_count = 0
        for store in self.published_to:
            store.publishers.pop(self.remote_address, None)
        self.output.close(abort=abort)
        self.server.clients.discard(self)

    # -- answers ----------------------------------------------------------------------------

    async def _ok(self, command: bytes, data: bytes = b"OK") -> None:
        await self.output.respond(command, data, FrameType.RESPONSE)

    async def _error(self, error: ServerError, command: bytes = b"") -> None:
        data = error.text.encode("utf-8", "surrogateescape")
        await self.output.respond(command, data, FrameType.ERROR)
        if error.fatal:
            await self.output.flush()
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

    def _nop(self, command: ClientCommand) -> None:
        return

    async def _identify(self, command: ClientCommand) -> None:
        if self.state != ClientState.INIT:
            raise ServerError("E_INVALID", "cannot IDENTIFY in current state")
        limits = self.view.limits
        identity = read_identify(self._body_or_error(command, "IDENTIFY "), limits)
        self._take(identity)
        if not identity.feature_negotiation:
            await self._ok(command.name)
            return
        await self._ok(command.name, identify_answer(identity, limits, self.msg_timeout))
        if identity.tls:
            context = limits.tls_context
            assert isinstance(context, ssl.SSLContext)  # noqa: S101 - read_identify checked it
            await self.output.start_tls(context)
            self.tls = True
            await self._ok(command.name)
        if identity.snappy:
            self.output.codec, self.snappy = SnappyCodec(), True
            await self._ok(command.name)
        elif identity.deflate:
            level = identity.deflate_level
            self.output.codec, self.deflate, self.deflate_level = DeflateCodec(level), True, level
            await self._ok(command.name)

    def _take(self, identity: Identity) -> None:
        """Apply what IDENTIFY set, and restart the heartbeats at its interval."""
        self.heartbeat_interval = identity.heartbeat_interval
        self.output_buffer_size = identity.output_buffer_size
        self.output_buffer_size_set = identity.output_buffer_size_set
        self.output_buffer_timeout_ms = identity.output_buffer_timeout_ms
        self.sample_rate = identity.sample_rate
        if identity.msg_timeout is not None:
            self.msg_timeout = identity.msg_timeout
        self.desired_tag = identity.desired_tag
        self.extend_support = identity.extend_support
        self.ext_filter = identity.ext_filter
        # nsqd's Identify sets both even when empty: the remote address was the default only
        self.client_id = identity.client_id
        self.hostname = identity.hostname
        self.user_agent = identity.user_agent
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
        limit = self.view.limits.max_body_size
        raise ServerError("E_BAD_BODY", f"{prefix}body too big {size} > {limit}")

    async def _auth(self, command: ClientCommand) -> None:
        if self.state != ClientState.INIT:
            raise ServerError("E_INVALID", "cannot AUTH in current state")
        if command.params:
            raise ServerError("E_INVALID", "AUTH invalid number of parameters")
        self._body_or_error(command, "AUTH ")
        raise ServerError("E_AUTH_DISABLED", "AUTH Disabled")

    # -- subscribing ------------------------------------------------------------------------

    async def _sub(self, command: ClientCommand) -> None:
        name = command.name
        sub = read_sub(
            command,
            self.view,
            self.node,
            initial=self.state == ClientState.INIT,
            heartbeats=self.heartbeat_interval is not None,
            extend_support=self.extend_support,
            sample_rate=self.sample_rate,
        )
        part, channel_name, start, topic = sub.part, sub.channel, sub.start, sub.part.topic
        if not topic.ext:  # a tag only means something on an ext topic: nsqd drops it
            self.desired_tag = ""
        hub = part.hub(channel_name)
        if name == b"SUB_ORDERED":
            hub.channel.require_order()
        if start is not None and not hub.clients:
            apply_start(hub, start)
        self.format = MessageFormat(
            fork_ids=True,
            ext=self.extend_support and topic.ext,
            detail=name in (b"SUB_ORDERED", b"SUB_ADVANCED"),
        )
        if not self.output_buffer_size_set and not (self.tls or self.output.codec):
            self.output_buffer_size = 4096
        self.state = ClientState.SUBSCRIBED
        self.hub = hub
        hub.add(self)
        self.view.record(
            EventKind.SUBSCRIBED,
            node=self.node.index,
            peer=self.remote_address,
            topic=topic.name,
            partition=part.number,
            channel=channel_name,
            command=name.decode(),
        )
        await self._ok(name)

    def _rdy(self, command: ClientCommand) -> None:
        if self.state == ClientState.CLOSING:
            return
        if self.state != ClientState.SUBSCRIBED:
            raise ServerError("E_INVALID", "cannot RDY in current state")
        count = 1
        if command.params:
            raw = command.params[0].decode("latin-1")
            if not raw.isascii() or not raw.isdigit():
                raise ServerError("E_INVALID", f"RDY could not parse count {raw}")
            count = int(raw)
            if count > self.view.limits.max_rdy_count:
                raise ServerError(
                    "E_INVALID",
                    f"RDY count {count} out of range 0-{self.view.limits.max_rdy_count}",
                )
        self.rdy = count
        if self.hub is not None:
            self.hub.dispatch(self.view.now())

    def _message_id(self, command: ClientCommand, what: str) -> tuple[ChannelHub, bytes, int]:
        if self.state not in (ClientState.SUBSCRIBED, ClientState.CLOSING):
            raise ServerError("E_INVALID", f"cannot {what} in current state")
        message_id, internal_id = parse_message_id(command.params, what)
        if self.hub is None:
            raise ServerError("E_INVALID", "No channel")
        return self.hub, message_id, internal_id

    def _fin(self, command: ClientCommand) -> None:
        hub, message_id, internal_id = self._message_id(command, "FIN")
        self.view.check_leader(self.node, hub.partition, fatal=True)
        try:
            hub.channel.finish(internal_id, self)
        except KeyError as exc:
            raise refused("FIN", message_id, exc, self.number) from None
        self.in_flight_count -= 1
        self.finish_count += 1
        hub.dispatch(self.view.now())

    def _req(self, command: ClientCommand) -> None:
        hub, message_id, internal_id = self._message_id(command, "REQ")
        delay = parse_req_delay(command.params, self.view.limits.max_req_timeout)
        if delay > 0 and (hub.channel.ordered or hub.partition.topic.ordered):
            return  # nsqd ignores it before looking the id up: no answer, even when not held
        now = self.view.now()
        try:
            requeued = hub.channel.requeue(internal_id, self, delay, now)
        except KeyError as exc:
            raise refused("REQ", message_id, exc, self.number, delayed=delay > 0) from None
        if requeued:
            self.in_flight_count -= 1
            self.requeue_count += 1
            hub.dispatch(now)

    def _touch(self, command: ClientCommand) -> None:
        hub, message_id, internal_id = self._message_id(command, "TOUCH")
        try:
            hub.channel.touch(internal_id, self, self.msg_timeout, self.view.now())
        except KeyError as exc:
            raise refused("TOUCH", message_id, exc, self.number) from None

    async def _cls(self, command: ClientCommand) -> None:
        if self.state != ClientState.SUBSCRIBED:
            raise ServerError("E_INVALID", "cannot CLS in current state")
        self.state = ClientState.CLOSING
        self.rdy = 0
        await self._ok(command.name, b"CLOSE_WAIT")

    # -- delivery (called by the channel hub) -----------------------------------------------

    def has_room(self) -> bool:
        """True when this client may take one more message now."""
        return (
            self.in_flight_count < self.rdy
            and self.state is _SUBSCRIBED
            and not self.closed
            and not self.server.paused()
        )

    def deliver(self, flight: InFlight) -> None:
        """Write one message frame (or acknowledge it for the channel when sampled out or
        filtered out)."""
        message = flight.message
        hub = self.hub
        if hub is None:
            return
        ext_filter = self.ext_filter if hub.partition.topic.ext else None
        if (self.sample_rate and random.randrange(100) >= self.sample_rate) or (  # noqa: S311
            ext_filter and not filter_matches(ext_filter, message)
        ):
            hub.channel.finish(message.internal_id, self)
            return
        self.in_flight_count += 1
        self.message_count += 1
        self.output.write(message_frame(message, flight.attempts, self.format))

    def on_timeout(self, flight: InFlight) -> None:
        """The cluster timed out a message this client held."""
        self.in_flight_count = max(0, self.in_flight_count - 1)
        self.timeout_count += 1

    def on_forgotten(self, flight: InFlight) -> None:
        """The channel moved and forgot a message this client held: RDY room back, counted
        as a requeue (nsqd's ``RequeuedMessage``)."""
        self.in_flight_count = max(0, self.in_flight_count - 1)
        self.requeue_count += 1

    # -- publishing -------------------------------------------------------------------------

    async def _publish(self, command: ClientCommand) -> None:
        view, limits = self.view, self.view.limits
        topic_name, partition = publish_target(command, limits)
        part = view.hosted_partition(self.node, topic_name, partition, for_write=True)
        batch = read_publish(command, part, limits, self.decoder.unread)
        self.published_to.add(part.store)  # its /stats entry goes when the client does
        stored: list[StoredMessage] = []
        try:
            view.check_leader(self.node, part, fatal=False)
            if view.unwritable(part):
                raise ServerError("E_FAILED_ON_NOT_WRITABLE", fatal=False)
            stored = view.append(part, batch.messages)
        finally:
            count = len(stored) or len(batch.messages)
            part.store.count_publish(self.remote_address, self.user_agent, count, failed=not stored)
        await self._ok(command.name, publish_answer(command.name, stored, batch.traced_ext))

    # -- standalone-only commands -------------------------------------------------------------

    async def _internal_create_topic(self, command: ClientCommand) -> None:
        if len(command.params) < 2:
            raise ServerError("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        refused = "CREATE_TOPIC is not allowed here while cluster feature enabled."
        raise ServerError("E_CREATE_TOPIC_FAILED", refused, fatal=False)


#: the commands that never wait (no answer frame, no fault applies): run without a coroutine
_QUICK_HANDLERS: dict[bytes, Callable[[ClientConnection, ClientCommand], None]] = {
    b"NOP": ClientConnection._nop,
    b"RDY": ClientConnection._rdy,
    b"FIN": ClientConnection._fin,
    b"REQ": ClientConnection._req,
    b"TOUCH": ClientConnection._touch,
}
_HANDLERS: dict[bytes, Callable[[ClientConnection, ClientCommand], Awaitable[None]]] = {
    b"IDENTIFY": ClientConnection._identify,
    b"AUTH": ClientConnection._auth,
    b"SUB": ClientConnection._sub,
    b"SUB_ORDERED": ClientConnection._sub,
    b"SUB_ADVANCED": ClientConnection._sub,
    b"CLS": ClientConnection._cls,
    b"INTERNAL_CREATE_TOPIC": ClientConnection._internal_create_topic,
    **dict.fromkeys(PUBLISH, ClientConnection._publish),
}
