"""What one nsqd connection promises whatever the server does.

Every test plays nsqd with a small lying TCP server (:mod:`tests.integration.lying_nsqd`) that
follows the protocol exactly as far as the test needs and then lies: it stops reading, trickles
a frame, sends a deflate bomb, ignores RDY, or asks for AUTH on a plaintext socket. The client
must end each case with a typed :class:`~nsq_ha.errors.NsqError` within its deadline, in bounded
memory (tracemalloc), without stalling the event loop (a ticker task), and without sending or
showing a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest

from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.consumer import Consumer
from nsq_ha.errors import (
    BrokerError,
    ConfigError,
    FinFailedError,
    HandshakeError,
    NsqTimeoutError,
    PubFailedError,
    PublishError,
    RemoteProtocolError,
)
from nsq_ha.producer import Producer, RetryPolicy
from nsq_ha.protocol.broker import encode_message
from nsq_ha.protocol.command_decoder import ClientCommand, CommandDecoder, Magic
from nsq_ha.protocol.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    OK,
    FrameType,
    encode_frame,
    max_frame_size_for,
)
from nsq_ha.protocol.message import DecodedMessage, MessageFormat

from .helpers import connect
from .lying_nsqd import LoopLag, Peer, Script, identify_answer, lying_nsqd
from .publishes import pub_command, publish

MiB = 1024 * 1024
#: The memory a lying server may make the client hold (the hardening target).
MEMORY_BOUND = 64 * MiB
#: The longest event-loop stall a lying server may cause (the hardening target).
LAG_BOUND = 0.1
SECRET = "s3cr3t-do-not-leak"  # noqa: S105 - the secret every test checks is never shown


@contextlib.contextmanager
def traced_growth() -> Iterator[list[int]]:
    """Yield a list that receives the peak traced memory growth (bytes) at the end."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    growth: list[int] = []
    try:
        yield growth
    finally:
        growth.append(tracemalloc.get_traced_memory()[1] - base)
        if started:
            tracemalloc.stop()


def _message_frame(index: int) -> bytes:
    message = DecodedMessage(
        timestamp=1_700_000_000_000_000_000, attempts=1, id=b"%016x" % index, body=b"m%d" % index
    )
    return encode_frame(FrameType.MESSAGE, encode_message(message, MessageFormat.vanilla()))


# -- the command timeout covers the wait for a full socket -----------------------------------------


async def _stop_reading(peer: Peer) -> None:
    await peer.handshake()
    await asyncio.sleep(60)  # reads nothing more: the client's socket buffers fill up


async def test_publish_to_an_nsqd_that_stops_reading_times_out() -> None:
    """nsqd answers IDENTIFY and then reads nothing: a 32 MiB PUB cannot leave the socket
    buffers. The publish fails with NsqTimeoutError within command_timeout (+ margin), not
    after the buffers drain (never)."""
    config = ConnectionConfig(
        heartbeat_interval=-1,
        command_timeout=1.0,
        close_timeout=0.5,
        max_msg_size=64 * MiB,
        max_body_size=64 * MiB,
    )
    async with lying_nsqd(_stop_reading) as server:
        conn = await connect(server.address, config=config)
        try:
            # the command's own timeout fires (NsqTimeoutError), not the guard (TimeoutError)
            with pytest.raises(NsqTimeoutError, match=r"within 1\.0 s"):
                async with asyncio.timeout(config.command_timeout + 2.0):
                    await publish(conn, "hardening", bytes(32 * MiB))
        finally:
            await conn.close()


async def test_producer_attempt_timeout_covers_a_full_socket() -> None:
    """The same through ``Producer(nsqd=)``: every attempt is bounded by attempt_timeout, so the
    publish ends with PublishError (last error NsqTimeoutError) within attempts x timeout."""
    config = ConnectionConfig(
        heartbeat_interval=-1, close_timeout=0.5, max_msg_size=64 * MiB, max_body_size=64 * MiB
    )
    retry = RetryPolicy(attempts=2, deadline=None, attempt_timeout=1.0, initial_backoff=0.01)
    async with lying_nsqd(_stop_reading) as server:
        producer = Producer(nsqd=server.address, connection=config, retry=retry, close_timeout=1.0)
        try:
            with pytest.raises(PublishError) as info:
                async with asyncio.timeout(2 * retry.attempt_timeout + 3.0):
                    await producer.publish("hardening", bytes(32 * MiB))
            assert isinstance(info.value.last_error, NsqTimeoutError)
        finally:
            async with asyncio.timeout(10):
                await producer.close()


# -- liveness is a complete frame, not a byte ------------------------------------------------------


async def test_a_trickled_frame_is_no_sign_of_life() -> None:
    """After SUB nsqd sends the header of a 1000-byte frame and then one byte every 0.5 s: no
    frame completes, so after two heartbeat intervals (2 s) the peer counts as dead."""

    async def script(peer: Peer) -> None:
        await peer.handshake()
        await peer.expect(b"SUB")
        await peer.ok()
        await peer.send(struct.pack(">Ii", 1004, int(FrameType.RESPONSE)))
        for _ in range(60):
            await asyncio.sleep(0.5)
            await peer.send(b"x")

    config = ConnectionConfig(heartbeat_interval=1.0, close_timeout=0.5)
    async with lying_nsqd(script) as server:
        conn = await connect(server.address, config=config)
        try:
            await conn.subscribe("hardening", "ch")
            async with asyncio.timeout(2 * 1.0 + 3.0):
                await conn.wait_closed()
            assert isinstance(conn.close_reason, NsqTimeoutError)
            assert "no complete frame" in str(conn.close_reason)
        finally:
            await conn.close()


# -- a deflate bomb is decoded in bounded slices ---------------------------------------------------


def _deflate_bomb(kind: str, compressor: zlib._Compress) -> bytes:
    """About 190 MiB of plain stream in about 190 KiB of deflate."""
    parts = []
    if kind == "max_frame":  # a legal-size frame header, then zeros
        limit = max(DEFAULT_MAX_FRAME_SIZE, max_frame_size_for(ConnectionConfig().max_msg_size))
        parts.append(compressor.compress(struct.pack(">Ii", limit, int(FrameType.RESPONSE))))
    zeros = bytes(MiB)
    parts.extend(compressor.compress(zeros) for _ in range(190))
    parts.append(compressor.flush(zlib.Z_SYNC_FLUSH))
    return b"".join(parts)


@pytest.mark.parametrize("kind", ["zeros", "max_frame"])
async def test_a_deflate_bomb_is_refused_in_bounded_memory_without_stalling(kind: str) -> None:
    """nsqd agrees to deflate, answers SUB, then sends ~190 KiB that inflate to ~190 MiB. The
    connection ends with a typed error; memory grows by less than 64 MiB and the event loop is
    never stalled for 100 ms."""
    ready = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.handshake(identify_answer(deflate=True, deflate_level=6))
        compressor = peer.start_deflate()
        ok = encode_frame(FrameType.RESPONSE, OK)
        await peer.send(compressor.compress(ok) + compressor.flush(zlib.Z_SYNC_FLUSH))
        await peer.expect(b"SUB")
        await peer.send(compressor.compress(ok) + compressor.flush(zlib.Z_SYNC_FLUSH))
        bomb = _deflate_bomb(kind, compressor)
        await ready.wait()
        await peer.send(bomb)
        await peer.until_client_closes()

    config = ConnectionConfig(deflate=True, heartbeat_interval=-1, close_timeout=0.5)
    async with lying_nsqd(script) as server:
        conn = await connect(server.address, config=config)
        try:
            await conn.subscribe("hardening", "ch")
            with traced_growth() as growth:
                async with LoopLag() as lag:
                    ready.set()
                    async with asyncio.timeout(20):
                        await conn.wait_closed()
        finally:
            await conn.close()
    assert isinstance(conn.close_reason, RemoteProtocolError)
    assert growth[0] < MEMORY_BOUND, f"memory grew by {growth[0] / MiB:.1f} MiB"
    assert lag.worst < LAG_BOUND, f"the event loop stalled for {lag.worst * 1000:.0f} ms"


def _compressed(compression: str, peer: Peer, blocks: list[bytes]) -> tuple[bytes, bytes]:
    """Switch ``peer`` to ``compression`` (unless ``plain``); return the upgrade's ``OK`` and
    ``blocks``, both compressed."""
    ok = encode_frame(FrameType.RESPONSE, OK)
    if compression == "plain":
        return b"", b"".join(blocks)
    if compression == "snappy":
        framer = peer.start_snappy()
        return framer.compress(ok), b"".join(framer.compress(block) for block in blocks)
    deflate = peer.start_deflate()
    upgraded = deflate.compress(ok) + deflate.flush(zlib.Z_SYNC_FLUSH)
    stream = b"".join(deflate.compress(block) for block in blocks)
    return upgraded, stream + deflate.flush(zlib.Z_SYNC_FLUSH)


def _heartbeat_flood(compression: str, peer: Peer, mib: int = 256) -> tuple[bytes, bytes]:
    """Switch ``peer`` to ``compression``; return the upgrade's ``OK`` and ``mib`` MiB of heartbeat
    frames back to back, both compressed (256 MiB: 636 KiB of deflate, 12 MiB of snappy)."""
    heartbeat = encode_frame(FrameType.RESPONSE, b"_heartbeat_")
    return _compressed(compression, peer, [heartbeat * (MiB // len(heartbeat))] * mib)


@pytest.mark.parametrize("compression", ["deflate", "snappy"])
async def test_a_compressed_heartbeat_flood_ends_the_connection_without_stalling(
    compression: str,
) -> None:
    """nsqd agrees to compression, then sends nothing but heartbeats, back to back: 256 MiB of
    them, each slice of the stream inflating to thousands of frames. nsqd sends one heartbeat
    per interval (1 s at least), so the connection ends with RemoteProtocolError; memory grows
    by less than 64 MiB and the event loop never stalls for 100 ms."""
    ready = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.handshake(identify_answer(**{compression: True}))
        upgraded, flood = _heartbeat_flood(compression, peer)
        await peer.send(upgraded)
        await ready.wait()
        await peer.send(flood)
        await peer.until_client_closes()

    config = ConnectionConfig(close_timeout=0.5, **{compression: True})
    async with lying_nsqd(script) as server:
        conn = await connect(server.address, config=config)
        try:
            with traced_growth() as growth:
                async with LoopLag() as lag:
                    ready.set()
                    with contextlib.suppress(TimeoutError):  # the asserts below say what failed
                        async with asyncio.timeout(15):
                            await conn.wait_closed()
        finally:
            await conn.close()
    assert lag.worst < LAG_BOUND, f"the event loop stalled for {lag.worst * 1000:.0f} ms"
    assert growth[0] < MEMORY_BOUND, f"memory grew by {growth[0] / MiB:.1f} MiB"
    assert isinstance(conn.close_reason, RemoteProtocolError), conn.close_reason
    assert "heartbeats" in str(conn.close_reason)


@pytest.mark.parametrize("compression", ["plain", "deflate", "snappy"])
async def test_a_flood_of_error_frames_is_handled_without_stalling(compression: str) -> None:
    """nsqd sends 65536 error frames that answer no command and keep the connection
    (E_FIN_FAILED, 1.25 MiB: 3276 frames in one 64 KiB read, 13107 in each 256 KiB slice a
    compressed read inflates to). Every one reaches on_error and the connection stays open, but
    only a bounded number is handled per event-loop turn: memory grows by less than 64 MiB and
    the loop never stalls for 100 ms."""
    frames = 65_536
    options = {} if compression == "plain" else {compression: True}
    ready = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.handshake(identify_answer(**options))
        block = encode_frame(FrameType.ERROR, b"E_FIN_FAILED") * (frames // 16)
        upgraded, flood = _compressed(compression, peer, [block] * 16)
        await peer.send(upgraded)
        await ready.wait()
        await peer.send(flood)
        await peer.until_client_closes()

    reported = 0
    all_reported = asyncio.Event()

    def on_error(error: BrokerError) -> None:
        nonlocal reported
        reported += isinstance(error, FinFailedError)
        if reported == frames:
            all_reported.set()

    config = ConnectionConfig(close_timeout=0.5, **options)
    async with lying_nsqd(script) as server:
        conn = await connect(server.address, config=config, on_error=on_error)
        try:
            with traced_growth() as growth:
                async with LoopLag() as lag:
                    ready.set()
                    async with asyncio.timeout(60):
                        await all_reported.wait()
            assert not conn.closed, conn.close_reason
        finally:
            await conn.close()
    assert lag.worst < LAG_BOUND, f"the event loop stalled for {lag.worst * 1000:.0f} ms"
    assert growth[0] < MEMORY_BOUND, f"memory grew by {growth[0] / MiB:.1f} MiB"


async def test_a_heartbeat_flood_ends_the_connection_without_a_nop_each() -> None:
    """200000 heartbeats in a row (3.6 MiB): nsqd sends one per interval, so the connection ends
    with RemoteProtocolError at the eleventh; the ones before it are answered with at most one
    NOP (one per write), not one each."""
    heartbeats = 200_000

    async def script(peer: Peer) -> None:
        await peer.handshake()
        await peer.send(encode_frame(FrameType.RESPONSE, b"_heartbeat_") * heartbeats)
        await peer.until_client_closes()

    config = ConnectionConfig(close_timeout=0.5)
    async with lying_nsqd(script) as server:
        conn = await connect(server.address, config=config)
        try:
            async with asyncio.timeout(10):
                await conn.wait_closed()
        finally:
            await conn.close()
    assert isinstance(conn.close_reason, RemoteProtocolError), conn.close_reason
    assert "heartbeats within 1 s" in str(conn.close_reason)
    sent = CommandDecoder().feed(bytes(server.received[0]))
    assert sum(command == ClientCommand(b"NOP") for command in sent) <= 1, sent


async def test_heartbeats_spread_over_a_slow_handshake_are_no_flood() -> None:
    """A slow nsqd sends 14 heartbeats, 0.25 s apart, before it answers IDENTIFY: at most 4 in
    any second, so the handshake answers each and completes (the flood rule counts real time
    during the handshake as it does afterwards)."""
    beats = 14

    async def script(peer: Peer) -> None:
        magic = await peer.next_event()
        assert magic == Magic(b"  V2"), magic
        await peer.expect(b"IDENTIFY")
        for _ in range(beats):
            await peer.send(encode_frame(FrameType.RESPONSE, b"_heartbeat_"))
            await asyncio.sleep(0.25)
        await peer.send(identify_answer())
        await peer.until_client_closes()

    config = ConnectionConfig(connect_timeout=15.0, close_timeout=0.5)
    async with lying_nsqd(script) as server:
        conn = await connect(server.address, config=config)
        await conn.close()
    sent = CommandDecoder().feed(bytes(server.received[0]))
    assert sum(command == ClientCommand(b"NOP") for command in sent) == beats, sent


# -- messages beyond RDY are a protocol violation --------------------------------------------------


def _rdy_ignoring_script(total: int = 300_000, batch: int = 10_000) -> tuple[list[int], Script]:
    sent = [0]

    async def script(peer: Peer) -> None:
        await peer.handshake()
        await peer.expect(b"SUB")
        await peer.ok()
        await peer.expect(b"RDY")
        for start in range(0, total, batch):
            await peer.send(b"".join(_message_frame(i) for i in range(start, start + batch)))
            sent[0] += batch
        await peer.until_client_closes()

    return sent, script


async def test_messages_beyond_rdy_close_the_connection() -> None:
    """With RDY 1 the server pushes 300000 messages: the connection closes with
    RemoteProtocolError naming RDY, the client keeps a handful of messages, and memory stays
    bounded."""
    _, script = _rdy_ignoring_script()
    config = ConnectionConfig(close_timeout=0.5)
    async with lying_nsqd(script) as server:
        conn = await connect(server.address, config=config)
        try:
            with traced_growth() as growth:
                await conn.subscribe("hardening", "ch")
                conn.rdy(1)
                async with asyncio.timeout(10):
                    await conn.wait_closed()
                received = [m async for m in conn.messages()]
        finally:
            await conn.close()
    assert isinstance(conn.close_reason, RemoteProtocolError)
    assert "RDY" in str(conn.close_reason)
    assert 1 <= len(received) <= 2
    assert growth[0] < MEMORY_BOUND, f"memory grew by {growth[0] / MiB:.1f} MiB"


async def test_consumer_with_max_in_flight_one_is_not_flooded() -> None:
    """The same through a Consumer with max_in_flight=1: each connection to the lying server is
    closed after at most two messages; what the consumer received stays tiny."""
    _, script = _rdy_ignoring_script()
    async with lying_nsqd(script) as server:
        with traced_growth() as growth:
            consumer = Consumer(
                "hardening",
                "ch",
                nsqd=server.address,
                max_in_flight=1,
                drain_timeout=0.5,
                connection=ConnectionConfig(close_timeout=0.5),
            )
            try:
                await consumer.start()
                async with asyncio.timeout(10):
                    await server.client_hung_up.wait()
                received = consumer.stats["received"]
            finally:
                async with asyncio.timeout(10):
                    await consumer.close()
        connections = server.connections
    assert received <= 2 * connections
    assert growth[0] < MEMORY_BOUND, f"memory grew by {growth[0] / MiB:.1f} MiB"


# -- items 16 and 17: the AUTH secret --------------------------------------------------------------


def test_config_repr_redacts_the_secret() -> None:
    """repr/str of a config (and of a connection using it) never show the AUTH secret."""
    for secret in (SECRET, SECRET.encode()):
        config = ConnectionConfig(auth_secret=secret)
        assert SECRET not in repr(config)
        assert SECRET not in str(config)
        assert "auth_secret=<redacted>" in repr(config)
        assert SECRET not in repr(NsqdConnection("127.0.0.1:4150", config=config))
    assert "auth_secret=None" in repr(ConnectionConfig())


@pytest.mark.parametrize(
    "secret", [SECRET + "\ud800", 42, [SECRET]], ids=["surrogate", "int", "list"]
)
def test_a_bad_secret_is_refused_without_showing_it(secret: object) -> None:
    """A secret that cannot be sent raises ConfigError whose text does not contain it."""
    with pytest.raises(ConfigError) as info:
        ConnectionConfig(auth_secret=secret)  # type: ignore[arg-type]
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


def _auth_script(answers: list[bytes]) -> Script:
    async def script(peer: Peer) -> None:
        await peer.handshake(identify_answer(auth_required=True))
        command = await peer.expect(b"AUTH")
        answers.append(command.body or b"")
        body = b'{"identity":"me","identity_url":"","permission_count":1}'
        await peer.send(encode_frame(FrameType.RESPONSE, body))
        await peer.until_client_closes()

    return script


async def test_plaintext_auth_is_refused_by_default(caplog: pytest.LogCaptureFixture) -> None:
    """A server on a plaintext connection claims auth_required: the client sends no AUTH and
    no secret byte, and connect() raises HandshakeError saying why and how to allow it."""
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    secrets: list[bytes] = []
    config = ConnectionConfig(auth_secret=SECRET, close_timeout=0.5)
    async with lying_nsqd(_auth_script(secrets)) as server:
        with pytest.raises(HandshakeError, match="allow_plaintext_auth") as info:
            await connect(server.address, config=config)
        await asyncio.sleep(0.1)  # let the server read what the client might still send
    sent = bytes(server.received[0])
    assert b"AUTH" not in sent
    assert SECRET.encode() not in sent
    assert secrets == []
    assert SECRET not in str(info.value)
    assert SECRET not in caplog.text


async def test_plaintext_auth_is_sent_when_allowed(caplog: pytest.LogCaptureFixture) -> None:
    """With ``allow_plaintext_auth=True`` the secret goes out (and still never into a log)."""
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    secrets: list[bytes] = []
    config = ConnectionConfig(auth_secret=SECRET, allow_plaintext_auth=True, close_timeout=0.5)
    async with lying_nsqd(_auth_script(secrets)) as server:
        conn = await connect(server.address, config=config)
        try:
            assert conn.auth is not None
            assert conn.auth["identity"] == "me"
            assert SECRET not in repr(conn)
        finally:
            await conn.close()
    assert secrets == [SECRET.encode()]
    assert SECRET not in caplog.text


# -- a cancelled handshake says so -----------------------------------------------------------------


async def test_a_cancelled_handshake_logs_a_reason(caplog: pytest.LogCaptureFixture) -> None:
    """connect() cancelled while nsqd keeps the IDENTIFY answer: the log says it was cancelled
    (no record with an empty reason)."""
    caplog.set_level(logging.DEBUG, logger="nsq_ha.connection")
    identified = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.next_event()
        await peer.expect(b"IDENTIFY")
        identified.set()
        await peer.until_client_closes()

    async with lying_nsqd(script) as server:
        conn = NsqdConnection(server.address, config=ConnectionConfig(close_timeout=0.5))
        task = asyncio.get_running_loop().create_task(conn.connect())
        async with asyncio.timeout(10):
            await identified.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert conn.closed
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("nsq_ha.connection")]
    assert not [m for m in messages if m.rstrip().endswith(":")], messages
    assert any("cancelled" in m for m in messages), messages
    assert "cancelled" in repr(conn)


# -- the answer FIFO stays in step -------------------------------------------------------------


async def test_a_late_answer_is_discarded_and_the_next_command_gets_its_own() -> None:
    """nsqd answers the first PUB after the caller gave up, then fails the second one with a
    non-fatal error and answers the third: each caller gets the answer to its own command."""
    third_sent = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.handshake(identify_answer(version="0.3.7-HA.1.12.3"))
        for _ in range(3):
            await peer.expect(b"PUB")
        await third_sent.wait()
        await peer.ok()  # the first PUB's answer, late
        await peer.send(encode_frame(FrameType.ERROR, b"E_PUB_FAILED disk full"))
        await peer.ok()
        await peer.until_client_closes()

    config = ConnectionConfig(heartbeat_interval=-1, close_timeout=0.5)
    async with lying_nsqd(script) as server, NsqdConnection(server.address, config=config) as conn:
        with pytest.raises(NsqTimeoutError, match="no answer to PUB"):
            await conn.command(pub_command("t", b"a", 0), response_timeout=0.2)
        second = asyncio.ensure_future(publish(conn, "t", b"b", 0))
        third = asyncio.ensure_future(publish(conn, "t", b"c", 0))
        await asyncio.sleep(0.05)
        third_sent.set()
        with pytest.raises(PubFailedError) as failed:
            await second
        assert failed.value.fatal is False
        assert await third is None
        assert not conn.closed
