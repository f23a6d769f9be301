"""The byte pipe under one nsqd connection: TCP, then optionally TLS, then optionally compression.

:class:`StreamTransport` pushes every read from the socket callback to the session with no task
woken between (one event-loop turn per read, where a ``StreamReader`` costs two). Upgrades
happen in place, in nsqd's order (§1.8). OS, TLS and asyncio stream exceptions become
:mod:`nsq_ha.errors` exceptions here (:func:`map_exceptions`): nothing above sees an ``OSError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

from nsq_ha.errors import (
    ConnectError,
    ConnectionClosedError,
    HandshakeError,
    NsqConnectionError,
    NsqError,
    NsqTimeoutError,
)

if TYPE_CHECKING:  # the codecs (and python-snappy) load only when nsqd agrees to compress
    from nsq_ha.protocol.compression import StreamCodec

#: Bytes asked from the socket per read.
READ_SIZE = 64 * 1024


@contextlib.contextmanager
def map_exceptions(what: str) -> Iterator[None]:
    """Turn socket-level exceptions raised inside the block into nsq_ha errors: ``ssl.SSLError``
    into HandshakeError, any other ``OSError`` into ConnectionClosedError."""
    try:
        yield
    except NsqError:
        raise
    except ssl.SSLError as exc:
        raise HandshakeError(f"{what}: TLS failed: {exc}") from exc
    except OSError as exc:
        raise ConnectionClosedError(f"{what}: {exc or type(exc).__name__}") from exc


def _discard(data: bytes) -> None: ...  # the receiver before receive(), after stop_receiving()


class Wakeup:
    """Wakes what waits on :meth:`wait_next` at the next :meth:`wake` (``error``: raising it).
    A wake with none waiting tests one list, where ``asyncio.Event.set`` is a Python call (a
    consumer's two per message, for its close's wait, cost 5% of its instructions)."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def wake(self, error: BaseException | None = None) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)

    def wait_next(self) -> asyncio.Future[None]:
        """A future done at the next wake, waiting from this call on (not from a first await)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        waiter.add_done_callback(self._waiters.remove)  # woken, or cancelled
        return waiter


class _Pipe(asyncio.BufferedProtocol):
    """The protocol under a :class:`StreamTransport`: hands each read to the receiver at once;
    tracks EOF, loss and write flow control. Buffered, into one buffer kept for the connection's
    life: with a plain one asyncio maps 256 KiB per read and shrinks it (most of a read's cost)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._read_view = memoryview(bytearray(READ_SIZE))
        self.eof = False  # the peer closed its side, or the connection is lost
        self.error: Exception | None = None  # why the connection was lost (None: cleanly)
        self.receiver: Callable[[bytes], None] = _discard
        self.on_end: Callable[[Exception | None], None] | None = None
        self.reading_paused = False
        self.writing_paused = False
        self._drained = Wakeup()
        self.closed: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_view

    def buffer_updated(self, nbytes: int) -> None:
        self.receiver(bytes(self._read_view[:nbytes]))

    def eof_received(self) -> bool:
        self.eof = True
        self.end(None)
        return False  # let asyncio close the socket

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None:
            self.error = exc
        self.end(exc)
        self._drained.wake(ConnectionResetError("connection lost"))
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._drained.wake()

    def end(self, error: Exception | None) -> None:
        """The stream ended: tell the receiver once."""
        on_end = self.on_end
        if on_end is not None:
            self.on_end = None
            self.receiver = _discard
            on_end(error)

    def pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None:
            self.reading_paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()

    async def wait_drained(self) -> None:
        """Wait until the transport's write buffer is below its high-water mark."""
        if self.closed.done():
            raise ConnectionResetError("connection lost")
        if self.writing_paused:
            await self._drained.wait_next()


class StreamTransport:
    """One TCP connection as a byte pipe with in-place TLS and compression upgrades."""

    def __init__(
        self, transport: asyncio.Transport, pipe: _Pipe, address: str, write_buffer_limit: int
    ) -> None:
        self._transport = transport
        self._pipe = pipe
        self.address = address
        #: the connection's event loop (cheaper to read than the running loop: a ``getpid()``)
        self.loop = pipe.loop
        self._codec: StreamCodec | None = None
        #: the name of the compression codec in use, or ``None``
        self.compression: str | None = None
        #: bytes queued above which senders wait (:meth:`backpressure`)
        self.write_buffer_limit = write_buffer_limit
        transport.set_write_buffer_limits(high=write_buffer_limit)
        self._slice_handle: asyncio.Handle | None = None
        self._receiving = False
        #: the receiver asked for nothing more until it resumes (it has frames left to handle)
        self._held = False
        self._on_data: Callable[[bytes], None] = _discard
        self.tls = False
        #: coalesced sends waiting for the end of the loop turn, and their size
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_handle: asyncio.Handle | None = None
        #: socket writes issued (a coalescing statistic)
        self.writes = 0

    def __repr__(self) -> str:
        layers = ["tcp", "tls"] if self.tls else ["tcp"]
        if self.compression is not None:
            layers.append(self.compression)
        return f"<StreamTransport {self.address} {'+'.join(layers)}>"

    @classmethod
    async def open(
        cls, host: str, port: int, *, connect_timeout: float, write_buffer_limit: int
    ) -> StreamTransport:
        """Open a TCP connection; failures raise ConnectError or NsqTimeoutError."""
        address = f"{host}:{port}"
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                transport, pipe = await loop.create_connection(lambda: _Pipe(loop), host, port)
        except TimeoutError as exc:
            raise NsqTimeoutError(f"connecting to {address} took over {connect_timeout} s") from exc
        except OSError as exc:
            raise ConnectError(f"cannot connect to {address}: {exc}") from exc
        return cls(transport, pipe, address, write_buffer_limit)

    async def start_tls(
        self, context: ssl.SSLContext, *, server_hostname: str | None, handshake_timeout: float
    ) -> None:
        """Run the TLS handshake on the open socket: all the receiver gets next came through TLS."""
        loop = asyncio.get_running_loop()
        with map_exceptions(f"TLS handshake with {self.address}"):
            transport = await loop.start_tls(
                self._transport,
                self._pipe,
                context,
                server_hostname=server_hostname,
                ssl_handshake_timeout=handshake_timeout,
            )
        if transport is None:  # pragma: no cover - only for a transport closed meanwhile
            raise ConnectionClosedError(f"TLS handshake with {self.address}: connection closed")
        self._transport = self._pipe.transport = transport
        self.tls = True
        transport.set_write_buffer_limits(high=self.write_buffer_limit)

    def enable_compression(self, codec: StreamCodec, received: bytes = b"") -> None:
        """Send and receive through ``codec`` from now on; ``received`` came compressed before."""
        self._codec = codec
        self.compression = codec.name
        if self._receiving:
            self._pipe.receiver = self._decode
            self._decode(received)

    def receive(
        self, on_data: Callable[[bytes], None], on_end: Callable[[NsqError | None], None]
    ) -> None:
        """From now on hand every plain byte read to ``on_data`` from the socket's callback, and
        call ``on_end`` once when the stream ends (``None``: the peer closed it); nothing after
        that or :meth:`stop_receiving`, nor while held. A new receiver replaces the old, unheld.
        With compression one bounded slice is decoded per loop turn, the socket unread while
        slices wait (a compression bomb neither fills memory nor stalls the loop)."""
        pipe = self._pipe
        self._receiving = True
        self._held = False
        self._on_data = on_data
        what = f"reading from {self.address}"

        def ended(error: Exception | None) -> None:
            self._receiving = False
            self._cancel_slices()
            if error is None or isinstance(error, NsqError):
                on_end(error)
                return
            try:
                with map_exceptions(what):
                    raise error
            except NsqError as mapped:
                on_end(mapped)

        pipe.receiver = on_data if self._codec is None else self._decode
        pipe.on_end = ended
        if pipe.eof:
            pipe.end(pipe.error)
        else:
            self._read_on()

    def hold(self) -> None:
        """Hand nothing more to the receiver (no read, no slice) until :meth:`release`."""
        self._held = True
        self._cancel_slices()
        self._pipe.pause_reading()

    def release(self) -> None:
        """Undo :meth:`hold`."""
        if self._held:
            self._held = False
            self._read_on()

    def _read_on(self) -> None:
        """Decode the next waiting slice a loop turn later, or read on."""
        if not self._receiving:
            return
        codec = self._codec
        if codec is not None and codec.pending:
            if self._slice_handle is None:
                self._slice_handle = self.loop.call_soon(self._slice)
        else:
            self._pipe.resume_reading()

    def _slice(self) -> None:
        self._slice_handle = None
        if self._receiving and not self._held:
            self._decode(b"")

    def _decode(self, raw: bytes) -> None:
        """Hand on the next slice ``raw`` and the input before it decode to."""
        codec = cast("StreamCodec", self._codec)
        try:
            data = codec.decompress(raw)
        except NsqError as exc:
            self._pipe.end(exc)  # the receiving ends with it
            return
        if data:
            self._on_data(data)  # may stop or hold the receiving
        if not self._receiving or self._held:
            return
        if codec.pending:
            self._pipe.pause_reading()
        self._read_on()

    def _cancel_slices(self) -> None:
        if self._slice_handle is not None:
            self._slice_handle.cancel()
            self._slice_handle = None

    def stop_receiving(self) -> None:
        """Hand nothing more to the receiver (bytes that arrive later are dropped)."""
        pipe = self._pipe
        self._receiving = False
        self._held = False
        self._cancel_slices()
        self._on_data = _discard
        pipe.receiver = _discard
        pipe.on_end = None

    def send(self, data: bytes) -> None:
        """Queue ``data``: a loop turn's sends leave in one write (at once past the limit)."""
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= self.write_buffer_limit:
            self.flush()
        elif self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self.flush)

    def send_now(self, data: bytes) -> None:
        """Write ``data`` now, after what was queued (the answer nsqd waits for)."""
        self._out.append(data)
        self.flush()

    def flush(self) -> None:
        """Write what was queued as one write; a closed socket drops it (the reader reports it)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._out:
            return
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        if self._transport.is_closing():
            return
        if self._codec is not None:
            data = self._codec.compress(data)
        self._transport.write(data)
        self.writes += 1

    def discard_queued(self) -> None:
        """Drop what was queued and not written (the connection is closing)."""
        self._out.clear()
        self._out_size = 0
        self.flush()  # cancels the flush to come, writes nothing

    def backlogged(self) -> bool:
        """True while the socket layer and the queue hold more than the write buffer limit."""
        return self._transport.get_write_buffer_size() + self._out_size > self.write_buffer_limit

    async def backpressure(self) -> None:
        """Wait while the socket layer holds more than its limit (unbounded here: the caller
        puts a timeout around it); a closed socket ends the wait (the reader reports it)."""
        if self.backlogged():
            self.flush()
            with contextlib.suppress(NsqConnectionError):
                await self.drain()

    async def drain(self) -> None:
        """Wait until the socket layer's buffer is below its high-water mark."""
        with map_exceptions(f"writing to {self.address}"):
            await self._pipe.wait_drained()

    async def close(self, grace: float = 2.0) -> None:
        """Close the socket and wait (up to ``grace`` s) until it is closed; never raises."""
        transport = self._transport
        if not transport.is_closing():
            transport.close()
        try:
            async with asyncio.timeout(grace):
                await asyncio.shield(self._pipe.closed)
        except TimeoutError:
            transport.abort()
