"""NsqdConnection against real vanilla nsqd 1.3.0 (the session ``vanilla_cluster``)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import httpx
import pytest

import nsq_ha
from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.errors import (
    BrokerError,
    ConnectError,
    ConnectionClosedError,
    FinFailedError,
    InvalidArgumentError,
    InvalidError,
    InvalidNameError,
    LocalProtocolError,
    NsqTimeoutError,
)
from nsq_ha.protocol.commands import Nop
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.protocol.session import ConnState
from nsq_ha.testing.process import free_ports
from nsq_ha.testing.servers import VanillaCluster

from .helpers import Subscriber, connect, running_as_python, take
from .publishes import pub_command, publish, publish_many


class UncheckedRdy:
    """A RDY count the session does not see (not its Rdy command): sent as it is."""

    name = b"RDY"

    def encode(self) -> bytes:
        return b"RDY 99999\n"


pytestmark = pytest.mark.vanilla
PACKAGE = Path(nsq_ha.__file__).resolve().parent


def _topic() -> str:
    return f"cv_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def address(vanilla_cluster: VanillaCluster) -> str:
    return vanilla_cluster.nodes[0].tcp_address


async def test_identify_negotiates_vanilla_settings(address: str) -> None:
    """IDENTIFY with feature_negotiation answers vanilla's JSON: version without -HA., defaults."""
    async with NsqdConnection(address, config=ConnectionConfig(msg_timeout=20.0)) as conn:
        negotiated = conn.negotiated
        assert negotiated.version == "1.3.0"
        assert conn.is_fork is False
        assert negotiated.max_rdy_count == 2500
        assert negotiated.msg_timeout == 20.0
        assert negotiated.max_msg_timeout == 900.0
        assert negotiated.output_buffer_size == 16384
        assert negotiated.output_buffer_timeout == 0.25
        assert negotiated.auth_required is False
        assert conn.state is ConnState.READY
        assert "READY vanilla=1.3.0" in repr(conn)
    assert conn.state is ConnState.CLOSED
    assert conn.close_reason is None


async def test_pipelined_publishes_coalesce_and_round_trip(address: str) -> None:
    """50 publishes issued in one loop turn leave in one socket write and are all answered OK
    in order; a SUB connection receives all 50 with hex ids, FIN settles them, and CLS gets
    CLOSE_WAIT before a clean close."""
    topic = _topic()
    async with Subscriber(address) as sub, NsqdConnection(address) as pub:
        await sub.subscribe(topic, "ch")
        assert sub.state is ConnState.SUBSCRIBED
        sub.rdy(100)
        writes_before = pub.writes
        results = await asyncio.gather(*(publish(pub, topic, b"m%d" % i) for i in range(50)))
        assert results == [None] * 50
        assert pub.writes - writes_before == 1
        messages = await take(sub, 50)
        assert sorted(m.body for m in messages) == sorted(b"m%d" % i for i in range(50))
        assert all(m.attempts == 1 and m.internal_id is None for m in messages)
        assert all(set(m.id) <= set(b"0123456789abcdef") for m in messages)
        assert sub.in_flight == 50
        for message in messages:
            sub.fin(message.id)
        assert sub.in_flight == 0
        await sub.stop_delivery()  # CLS, answered by CLOSE_WAIT
        assert sub.state is ConnState.CLOSE_WAIT
        await sub.close()
        assert sub.state is ConnState.CLOSED
        assert sub.close_reason is None


async def test_mpub_and_on_message_callback(address: str) -> None:
    """MPUB delivers every body; on_message receives them from the read loop."""
    topic = _topic()
    got: list[DecodedMessage] = []
    all_in = asyncio.Event()

    def on_message(message: DecodedMessage) -> None:
        got.append(message)
        if len(got) == 3:
            all_in.set()

    async with NsqdConnection(address, on_message=on_message) as sub:
        await sub.subscribe(topic, "ch")
        sub.rdy(3)
        async with NsqdConnection(address) as pub:
            await publish_many(pub, topic, [b"a", b"b", b"c"])
        await asyncio.wait_for(all_in.wait(), 10)
        assert [m.body for m in got] == [b"a", b"b", b"c"]
        for message in got:
            sub.fin(message.id)


async def test_close_waits_for_in_flight_messages(address: str) -> None:
    """After CLS/CLOSE_WAIT the connection stays open until the in-flight message is FINed,
    and the FIN written during CLOSE_WAIT is accepted (the message is not redelivered)."""
    topic = _topic()
    async with NsqdConnection(address) as pub:
        await publish(pub, topic, b"late-fin")
    conn = await connect(address, config=ConnectionConfig(close_timeout=10.0))
    await conn.subscribe(topic, "ch")
    conn.rdy(1)
    (message,) = await take(conn, 1)
    closing = asyncio.create_task(conn.close())
    await asyncio.wait_for(_until(lambda: conn.state is ConnState.CLOSE_WAIT), 5)
    assert not closing.done()
    conn.fin(message.id)
    await asyncio.wait_for(closing, 5)
    assert conn.state is ConnState.CLOSED
    async with Subscriber(address) as again:
        await again.subscribe(topic, "ch")
        again.rdy(1)
        with pytest.raises(TimeoutError):
            await take(again, 1, within=1.0)


async def _until(predicate: object) -> None:
    """Poll a cheap in-process predicate once per loop turn (no wall-clock sleeps)."""
    # one event-loop turn per check, bounded by the caller's wait_for
    while not predicate():  # type: ignore[operator]  # noqa: ASYNC110
        await asyncio.sleep(0)


async def test_fin_failure_goes_to_on_error_not_to_a_pending_publish(address: str) -> None:
    """E_FIN_FAILED (non-fatal) for an unknown id is routed by id to on_error while a PUB
    pipelined behind it still gets its own OK; the connection stays open."""
    errors: list[BrokerError] = []
    arrived = asyncio.Event()

    def on_error(error: BrokerError) -> None:
        errors.append(error)
        arrived.set()

    topic = _topic()
    async with Subscriber(address, on_error=on_error) as conn:
        await conn.subscribe(topic, "ch")
        bogus = b"0123456789abcdef"
        conn.fin(bogus)
        assert await publish(conn, topic, b"after-fin") is None
        await asyncio.wait_for(arrived.wait(), 5)
        (error,) = errors
        assert isinstance(error, FinFailedError)
        assert error.fatal is False
        assert error.message_id == bogus
        assert conn.state is ConnState.SUBSCRIBED
        assert await publish(conn, topic, b"still-open") is None


async def test_fatal_unsolicited_error_closes_and_fails_waiters(address: str) -> None:
    """RDY above max_rdy_count (sent unchecked, bypassing the client check) gets a fatal E_INVALID:
    on_error sees it, nsqd closes, and the connection's close reason chains to it."""
    errors: list[BrokerError] = []
    async with Subscriber(address, on_error=errors.append) as conn:
        await conn.subscribe(_topic(), "ch")
        conn.send_nowait(UncheckedRdy())
        await asyncio.wait_for(conn.wait_closed(), 5)
        (error,) = errors
        assert isinstance(error, InvalidError)
        assert "out of range" in str(error)
        assert isinstance(conn.close_reason, ConnectionClosedError)
        assert conn.close_reason.__cause__ is error
        with pytest.raises(ConnectionClosedError) as info:
            await publish(conn, "t", b"x")
        assert info.value.__cause__ is conn.close_reason


async def test_heartbeats_answered_keep_an_idle_connection_alive(address: str) -> None:
    """With heartbeat_interval 1 s vanilla closes a silent client after 2 s; ours answers
    every _heartbeat_ with NOP, so after 3.5 s idle it still publishes."""
    config = ConnectionConfig(heartbeat_interval=1.0)
    async with NsqdConnection(address, config=config) as conn:
        writes = conn.writes
        await asyncio.sleep(3.5)  # the idle period under test, not a synchronisation
        assert conn.state is ConnState.READY
        assert conn.writes - writes >= 3  # one NOP per heartbeat
        assert await publish(conn, _topic(), b"alive") is None


async def test_dead_peer_detected_after_two_heartbeat_intervals(
    vanilla_cluster: VanillaCluster,
) -> None:
    """A frozen nsqd (SIGSTOP) sends no heartbeat: the waiting PUB gets the dead-peer
    NsqTimeoutError of the heartbeat watchdog (2 negotiated intervals), not the command
    timeout, and the connection closes with that reason."""
    node = vanilla_cluster.nodes[1]
    config = ConnectionConfig(heartbeat_interval=1.0, command_timeout=30.0)
    conn = await connect(node.tcp_address, config=config)
    assert conn.negotiated.heartbeat_interval == 1.0
    node.process.pause()
    try:
        # wait_for only guards against a hang; the 30 s command timeout cannot fire within
        # it, so the NsqTimeoutError can only come from the watchdog, which names its window
        with pytest.raises(NsqTimeoutError, match=r"\(2 heartbeat intervals\): dead peer"):
            await asyncio.wait_for(publish(conn, _topic(), b"lost"), 10)
        assert conn.closed
        assert isinstance(conn.close_reason, NsqTimeoutError)
    finally:
        node.process.resume()
        await conn.close()


async def test_client_side_refusals_send_nothing(address: str) -> None:
    """Invalid names, fork-only commands, partitions and RDY counts nsqd refuses, and commands
    illegal in the current state or method are refused before any byte is written (a
    message's own checks are the producer's, where it comes in)."""
    async with Subscriber(address) as conn:
        writes = conn.writes
        with pytest.raises(InvalidNameError):
            await conn.subscribe("t", "c" * 65)
        with pytest.raises(LocalProtocolError, match="only on the fork"):
            await publish(conn, "t", b"x", trace_id=1)
        with pytest.raises(LocalProtocolError, match="only on the fork"):
            await conn.subscribe("t", "c", ordered=True)
        with pytest.raises(LocalProtocolError, match="no partitions"):
            await conn.subscribe("t", "c", 1)
        with pytest.raises(LocalProtocolError, match="cannot send RDY in state READY"):
            conn.rdy(1)
        with pytest.raises(LocalProtocolError, match="has a response"):
            conn.send_nowait(pub_command("t", b"x"))
        with pytest.raises(LocalProtocolError, match="has no response"):
            await conn.command(Nop())
        assert conn.writes == writes
        assert await publish(conn, _topic(), b"x" * 1024) is None
        await conn.subscribe(_topic(), "c")
        with pytest.raises(InvalidArgumentError, match="over max_rdy_count 2500"):
            conn.rdy(2501)
        assert conn.writes == writes + 2


async def test_connect_refused_and_closed_use(vanilla_cluster: VanillaCluster) -> None:
    """No listener gives ConnectError; a closed connection raises ConnectionClosedError."""
    (port,) = free_ports(1)
    with pytest.raises(ConnectError):
        await connect(f"127.0.0.1:{port}", config=ConnectionConfig(connect_timeout=2))
    conn = await connect(vanilla_cluster.nodes[0].tcp_address)
    await conn.close()
    await conn.close()  # idempotent
    with pytest.raises(ConnectionClosedError):
        await publish(conn, "t", b"x")


async def test_sync_is_a_round_trip_while_subscribed_and_after_cls(address: str) -> None:
    """sync() TOUCHes an id that is never in flight: nsqd's non-fatal E_TOUCH_FAILED answers
    it, in SUBSCRIBED and in CLOSE_WAIT, and the connection stays usable."""
    topic = _topic()
    errors: list[object] = []
    async with NsqdConnection(address) as pub:
        await publish(pub, topic, b"x")
    conn = Subscriber(address, on_error=errors.append)
    await conn.connect()
    await conn.subscribe(topic, "sync")
    conn.rdy(1)
    await conn.sync(timeout=5)
    [message] = await take(conn, 1)
    await conn.stop_delivery()
    assert conn.state is ConnState.CLOSE_WAIT
    conn.fin(message.id)
    await conn.sync(timeout=5)  # the FIN was processed before this returned
    assert errors == []  # the sync answers went to sync(), not to on_error
    await conn.close()
    assert conn.close_reason is None


def _modules_during(calls: set[str]) -> Callable[[FrameType, str, object], None]:
    """A profile function adding the ``nsq_ha`` modules whose functions are called."""

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            path = Path(frame.f_code.co_filename).resolve()
            if path.is_relative_to(PACKAGE):
                calls.add(str(path.relative_to(PACKAGE)))

    return profile


async def test_a_warm_publish_and_a_warm_delivery_with_its_fin_pass_few_modules(
    vanilla_cluster: VanillaCluster,
) -> None:
    """On warm connections a publish (command() until it returns) enters the session and the
    publish codec, and a delivery (socket read to fin()) the session and the message codec; each
    enters connection/core, connection/reader and transport, and no other nsq_ha module."""
    node = vanilla_cluster.nodes[0]
    topic = _topic()
    async with NsqdConnection(node.tcp_address) as pub, Subscriber(node.tcp_address) as sub:
        await sub.subscribe(topic, "ch")
        sub.rdy(10)
        messages = sub.messages()
        await publish(pub, topic, b"warm")
        sub.fin((await anext(messages)).id)
        command = pub_command(topic, b"journey")

        published: set[str] = set()
        sys.setprofile(_modules_during(published))
        try:
            await pub.command(command)
        finally:
            sys.setprofile(None)

        def http_publish() -> None:  # another thread: not profiled
            url = f"{node.http_url}/pub?topic={topic}"
            httpx.post(url, content=b"delivered", timeout=10).raise_for_status()

        delivered: set[str] = set()
        sys.setprofile(_modules_during(delivered))
        try:
            await asyncio.to_thread(http_publish)
            message = await asyncio.wait_for(anext(messages), 10)
            sub.fin(message.id)
        finally:
            sys.setprofile(None)
    wire = {"connection/core.py", "connection/reader.py", "transport.py"}
    assert published == running_as_python(wire | {"protocol/session.py", "protocol/publish.py"})
    assert delivered == running_as_python(wire | {"protocol/session.py", "protocol/message.py"})
