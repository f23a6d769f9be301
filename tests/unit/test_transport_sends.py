"""StreamTransport's coalesced sends: what one loop turn sends leaves in one write; the answer
nsqd waits for leaves at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from nsq_ha.transport import StreamTransport


@pytest.fixture
async def pair() -> AsyncIterator[tuple[StreamTransport, asyncio.StreamReader]]:
    """A StreamTransport connected to a loopback server; the server side's reader."""
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = await StreamTransport.open(
        "127.0.0.1", port, connect_timeout=5.0, write_buffer_limit=64 * 1024
    )
    async with asyncio.timeout(5):
        peer, peer_writer = await accepted.get()
    try:
        yield transport, peer
    finally:
        await transport.close()
        peer_writer.close()
        await peer_writer.wait_closed()
        server.close()
        await server.wait_closed()


async def test_commands_of_one_turn_leave_in_one_write(
    pair: tuple[StreamTransport, asyncio.StreamReader],
) -> None:
    transport, peer = pair
    transport.send(b"RDY 5\n")
    transport.send(b"FIN a\n")
    assert transport.writes == 0  # gathered until the end of the turn
    await asyncio.sleep(0)
    assert transport.writes == 1
    async with asyncio.timeout(5):
        assert await peer.readexactly(12) == b"RDY 5\nFIN a\n"


async def test_the_last_answer_leaves_at_once_with_what_is_queued(
    pair: tuple[StreamTransport, asyncio.StreamReader],
) -> None:
    transport, peer = pair
    transport.send(b"RDY 1\n")
    transport.send_now(b"FIN b\n")
    assert transport.writes == 1  # no loop turn waited for
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert transport.writes == 1  # and nothing left to write later
    async with asyncio.timeout(5):
        assert await peer.readexactly(12) == b"RDY 1\nFIN b\n"


async def test_sends_past_the_limit_leave_at_once_and_dropped_ones_never(
    pair: tuple[StreamTransport, asyncio.StreamReader],
) -> None:
    transport, peer = pair
    transport.send(b"x" * (64 * 1024))
    assert transport.writes == 1
    transport.send(b"dropped")
    transport.discard_queued()
    await asyncio.sleep(0)
    assert transport.writes == 1
    async with asyncio.timeout(5):
        assert len(await peer.readexactly(64 * 1024)) == 64 * 1024
