"""The fault proxy against an echo server: forwards, stalls, trickles, and cuts mid-chunk."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from .proxy import FaultProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = FaultProxy("127.0.0.1", port, random.Random(3))  # noqa: S311
    await proxy.start()
    yield proxy
    await proxy.close()
    server.close()
    await server.wait_closed()


async def _connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def test_forwards_both_ways(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"hello")
    assert await asyncio.wait_for(reader.readexactly(5), 5) == b"hello"
    writer.close()


async def test_stall_holds_bytes_until_healed(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    proxy.stall()
    writer.write(b"ping")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.3)
    proxy.heal()
    assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
    writer.close()


async def test_slow_reads_deliver_everything_in_pieces(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    proxy.slow(piece=7, pause=0.001)
    payload = bytes(range(256)) * 4
    writer.write(payload)
    assert await asyncio.wait_for(reader.readexactly(len(payload)), 10) == payload
    writer.close()


async def test_cut_forwards_a_prefix_then_closes(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"x")
    await asyncio.wait_for(reader.readexactly(1), 5)
    proxy.cut(grace=5.0)
    writer.write(b"0123456789" * 100)
    got = await asyncio.wait_for(reader.read(), 5)  # until EOF
    assert len(got) < 1000
    assert got != b"0123456789" * 100
    assert proxy.cuts == 1
    # new connections work again
    reader2, writer2 = await _connect(proxy)
    writer2.write(b"again")
    assert await asyncio.wait_for(reader2.readexactly(5), 5) == b"again"
    writer.close()
    writer2.close()


async def test_cut_closes_idle_connections_after_the_grace(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"x")
    await asyncio.wait_for(reader.readexactly(1), 5)
    proxy.cut(grace=0.05)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
