"""The byte pipe under one nsqd connection: TCP, then optionally TLS, then optionally compression.

:class:`StreamTransport` wraps asyncio's ``StreamReader``/``StreamWriter``. Upgrades happen in
place, in the order nsqd performs them (§1.8): :meth:`StreamTransport.start_tls` replaces the
socket layer with TLS, :meth:`StreamTransport.enable_compression` puts a codec from
:mod:`nsq_ha.protocol.compression` on top of whatever the socket layer is.

This module is the boundary where OS, TLS and asyncio stream exceptions become
:mod:`nsq_ha.errors` exceptions (:func:`map_exceptions`); nothing above it sees an ``OSError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterator

from nsq_ha.errors import (
    ConnectError,
    ConnectionClosedError,
    HandshakeError,
    LocalProtocolError,
    NsqError,
    NsqTimeoutError,
)
from nsq_ha.protocol.compression import StreamCodec

__all__ = ["READ_SIZE", "StreamTransport", "map_exceptions"]

#: Bytes asked from the socket per read.
READ_SIZE = 64 * 1024


@contextlib.contextmanager
def map_exceptions(what: str) -> Iterator[None]:
    """Turn socket-level exceptions raised inside the block into nsq_ha errors.

    ``ssl.SSLError`` becomes HandshakeError; a broken or reset connection and a short read
    become ConnectionClosedError; any other ``OSError`` ConnectionClosedError too. NsqError
    passes through untouched.
    """
    try:
        yield
    except NsqError:
        raise
    except ssl.SSLError as exc:
        raise HandshakeError(f"{what}: TLS failed: {exc}") from exc
    except asyncio.IncompleteReadError as exc:
        raise ConnectionClosedError(
            f"{what}: connection closed after {len(exc.partial)} of {exc.expected} bytes"
        ) from exc
    except (ConnectionError, OSError) as exc:
        raise ConnectionClosedError(f"{what}: {exc or type(exc).__name__}") from exc


class StreamTransport:
    """One TCP connection as a byte pipe with in-place TLS and compression upgrades."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str
    ) -> None:
        """Wrap an open stream pair; use :meth:`open` to make one."""
        self._reader = reader
        self._writer = writer
        self.address = address
        self._codec: StreamCodec | None = None
        self._write_buffer_limit = 64 * 1024
        self.tls = False

    def __repr__(self) -> str:
        """Show the address and the layers in use."""
        layers = ["tcp"]
        if self.tls:
            layers.append("tls")
        if self._codec is not None:
            layers.append(self._codec.name)
        return f"<StreamTransport {self.address} {'+'.join(layers)}>"

    @classmethod
    async def open(
        cls, host: str, port: int, *, connect_timeout: float, write_buffer_limit: int
    ) -> StreamTransport:
        """Open a TCP connection; failures raise ConnectError or NsqTimeoutError."""
        address = f"{host}:{port}"
        try:
            async with asyncio.timeout(connect_timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=READ_SIZE)
        except TimeoutError as exc:
            raise NsqTimeoutError(f"connecting to {address} took over {connect_timeout} s") from exc
        except OSError as exc:
            raise ConnectError(f"cannot connect to {address}: {exc}") from exc
        transport = cls(reader, writer, address)
        transport.set_write_buffer_limit(write_buffer_limit)
        return transport

    def set_write_buffer_limit(self, limit: int) -> None:
        """Make :meth:`drain` wait while more than ``limit`` bytes are queued in the socket."""
        self._write_buffer_limit = limit
        self._writer.transport.set_write_buffer_limits(high=limit)

    @property
    def compression(self) -> str | None:
        """Name of the compression codec in use, or ``None``."""
        return None if self._codec is None else self._codec.name

    @property
    def is_closing(self) -> bool:
        """True once the socket is closing or closed."""
        return self._writer.is_closing()

    # -- upgrades ---------------------------------------------------------------------------

    async def start_tls(
        self, context: ssl.SSLContext, *, server_hostname: str | None, handshake_timeout: float
    ) -> None:
        """Run the TLS handshake as the client, on the open socket (no bytes may be buffered)."""
        if self.tls or self._codec is not None:
            raise LocalProtocolError("TLS must be started once, before compression")
        with map_exceptions(f"TLS handshake with {self.address}"):
            await self._writer.start_tls(
                context, server_hostname=server_hostname, ssl_handshake_timeout=handshake_timeout
            )
        self.tls = True
        self.set_write_buffer_limit(self._write_buffer_limit)

    def enable_compression(self, codec: StreamCodec) -> None:
        """Send and receive through ``codec`` from now on."""
        if self._codec is not None:
            raise LocalProtocolError("compression is already enabled")
        self._codec = codec

    # -- reading ----------------------------------------------------------------------------

    async def read_exactly(self, count: int) -> bytes:
        """Read exactly ``count`` plain bytes (only before compression: no over-read)."""
        if self._codec is not None:
            raise LocalProtocolError("read_exactly cannot be used on a compressed stream")
        with map_exceptions(f"reading from {self.address}"):
            return await self._reader.readexactly(count)

    async def read(self) -> bytes:
        """Return the next plain bytes (never empty), or ``b""`` when the peer closed.

        With compression, at most one bounded slice is returned per call, and a slice decoded
        from input already received is returned only after the event loop has run once: a
        compression bomb neither fills memory nor stalls other tasks.
        """
        codec = self._codec
        if codec is not None and codec.pending:
            await asyncio.sleep(0)  # one slice per loop turn
            data = codec.decompress(b"")
            if data:
                return data
        while True:
            with map_exceptions(f"reading from {self.address}"):
                raw = await self._reader.read(READ_SIZE)
            if not raw:
                return b""
            if self._codec is None:
                return raw
            data = self._codec.decompress(raw)
            if data:
                return data

    # -- writing ----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue ``data`` for sending (compressed first when compression is on)."""
        if self._writer.is_closing():
            raise ConnectionClosedError(f"connection to {self.address} is closed")
        if self._codec is not None:
            data = self._codec.compress(data)
        self._writer.write(data)

    def write_buffer_size(self) -> int:
        """Bytes queued in the socket layer, not yet handed to the kernel."""
        return self._writer.transport.get_write_buffer_size()

    async def drain(self) -> None:
        """Wait until the socket layer's buffer is below its high-water mark."""
        with map_exceptions(f"writing to {self.address}"):
            await self._writer.drain()

    # -- closing ----------------------------------------------------------------------------

    async def close(self, grace: float = 2.0) -> None:
        """Close the socket and wait (up to ``grace`` s) until it is closed; never raises."""
        writer = self._writer
        if not writer.is_closing():
            writer.close()
        try:
            async with asyncio.timeout(grace):
                await writer.wait_closed()
        except (TimeoutError, OSError, ssl.SSLError):
            writer.transport.abort()
