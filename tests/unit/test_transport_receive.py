"""StreamTransport's pushed reads of a compressed stream: decoded one bounded slice per loop
turn, and a stream that turns corrupt ends the receiving with its error."""

from __future__ import annotations

import asyncio
import zlib

from nsq_ha.errors import NsqError, RemoteProtocolError
from nsq_ha.protocol.compression import MAX_DECOMPRESSED_SLICE, DeflateCodec
from nsq_ha.transport import StreamTransport


async def test_a_corruption_after_the_first_slice_ends_the_receiving_with_its_error() -> None:
    """One read holds four slices' worth of deflate data and then bytes that are no deflate
    block: slices decoded on the following loop turns reach ``on_data``, and the corruption
    (zlib refuses the slice it ends) reaches ``on_end`` as the codec's RemoteProtocolError."""
    plain = b"\0" * (4 * MAX_DECOMPRESSED_SLICE)
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    # a final block of the reserved type 3: zlib refuses it once the slices before are out
    wire = compressor.compress(plain) + compressor.flush(zlib.Z_SYNC_FLUSH) + b"\xff" * 16
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = await StreamTransport.open(
        "127.0.0.1", port, connect_timeout=5.0, write_buffer_limit=64 * 1024
    )
    ended: asyncio.Future[NsqError | None] = asyncio.get_running_loop().create_future()
    received: list[int] = []
    try:
        async with asyncio.timeout(5):
            writer = await accepted.get()
        transport.enable_compression(DeflateCodec())
        transport.receive(lambda data: received.append(len(data)), ended.set_result)
        writer.write(wire)
        async with asyncio.timeout(5):
            error = await ended
        assert isinstance(error, RemoteProtocolError)
        assert "corrupt deflate stream" in str(error)
        assert len(received) >= 2
        assert max(received) <= MAX_DECOMPRESSED_SLICE
    finally:
        await transport.close()
        writer.close()
        server.close()
        await server.wait_closed()
