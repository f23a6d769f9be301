"""A small lying nsqd for connection-hardening tests: a real TCP server on 127.0.0.1, port 0.

Each accepted connection runs a test-written ``script(peer)``. :class:`Peer` reads the client's
commands with the server-side decoder of :mod:`nsq_ha.protocol.command_decoder` and writes
whatever the script wants: valid frames, lies, floods, trickles, or nothing at all. Every
byte the client sent is recorded in :attr:`LyingNsqd.received` (per connection), so a test can
prove what was never sent (for example an AUTH secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import snappy  # type: ignore[import-untyped]

from nsq_ha.protocol.command_decoder import ClientCommand, CommandDecoder, Magic
from nsq_ha.protocol.frames import OK, FrameType, encode_frame

Script = Callable[["Peer"], Awaitable[None]]

#: What vanilla nsqd 1.3.0 answers to a feature-negotiating IDENTIFY (the parts that matter).
VANILLA_ANSWER: dict[str, Any] = {
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 6,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}


def identify_answer(**changes: Any) -> bytes:
    """A whole IDENTIFY answer frame: :data:`VANILLA_ANSWER` with ``changes``."""
    return encode_frame(FrameType.RESPONSE, json.dumps({**VANILLA_ANSWER, **changes}).encode())


class Peer:
    """The fake nsqd's side of one connection."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, log: bytearray
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.received = log
        self._decoder = CommandDecoder(max_body_size=128 * 1024 * 1024)
        self._deflate: Any = None

    async def next_event(self) -> Magic | ClientCommand:
        """The client's next magic or command (IncompleteReadError when it hung up)."""
        while (got := self._decoder.pop()) is None:
            data = await self.reader.read(65536)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            self.received += data
            if self._deflate is not None:
                data = self._deflate.decompress(data)
            self._decoder.receive(data)
        return got

    async def expect(self, name: bytes) -> ClientCommand:
        """Read the next command and check it is ``name``."""
        got = await self.next_event()
        if not isinstance(got, ClientCommand) or got.name != name:
            raise AssertionError(f"fake nsqd expected {name!r}, got {got!r}")
        return got

    async def handshake(self, answer: bytes | None = None) -> ClientCommand:
        """Read magic and IDENTIFY; write ``answer`` (a whole frame; default: vanilla's)."""
        magic = await self.next_event()
        if magic != Magic(b"  V2"):
            raise AssertionError(f"fake nsqd got the magic {magic!r}")
        identify = await self.expect(b"IDENTIFY")
        await self.send(identify_answer() if answer is None else answer)
        return identify

    def start_deflate(self) -> zlib._Compress:
        """Switch both directions to raw deflate (after a ``deflate: true`` answer); return the
        compressor for the server-to-client direction."""
        self._deflate = zlib.decompressobj(-15)
        return zlib.compressobj(6, zlib.DEFLATED, -15)

    def start_snappy(self) -> Any:
        """Switch both directions to snappy framing (after a ``snappy: true`` answer); return
        the ``snappy.StreamCompressor`` for the server-to-client direction."""
        self._deflate = snappy.StreamDecompressor()  # the client's bytes, whatever the codec
        return snappy.StreamCompressor()

    async def send(self, data: bytes) -> None:
        """Write ``data`` and wait until the socket took it."""
        self.writer.write(data)
        await self.writer.drain()

    async def ok(self) -> None:
        """Answer ``OK``."""
        await self.send(encode_frame(FrameType.RESPONSE, OK))

    async def until_client_closes(self) -> None:
        """Read and record (without answering) until the client hangs up."""
        while data := await self.reader.read(65536):
            self.received += data


class LyingNsqd:
    """``async with LyingNsqd(script) as server``: serve ``script`` on ``server.address``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.port = 0
        #: bytes received from the client, one bytearray per accepted connection
        self.received: list[bytearray] = []
        self.errors: list[BaseException] = []
        self.closed_by_client = 0
        #: set once a client hung up before its script ended
        self.client_hung_up = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        return len(self.received)

    async def __aenter__(self) -> LyingNsqd:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        log = bytearray()
        self.received.append(log)
        try:
            await self.script(Peer(reader, writer, log))
        except (OSError, asyncio.IncompleteReadError):
            self.closed_by_client += 1  # the client hung up first
            self.client_hung_up.set()
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a broken test script: reported at exit
            self.errors.append(exc)
        finally:
            writer.transport.abort()

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5.0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await self._server.wait_closed()
        if self.errors and exc_info[0] is None:
            raise self.errors[0]


@contextlib.asynccontextmanager
async def lying_nsqd(script: Script) -> AsyncIterator[LyingNsqd]:
    """Run ``script`` as nsqd on a fresh port."""
    async with LyingNsqd(script) as server:
        yield server


class LoopLag:
    """A ticker task measuring how late the event loop runs a 10 ms sleep (the worst case)."""

    def __init__(self, period: float = 0.01) -> None:
        self.period = period
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(self.period)
            self.worst = max(self.worst, loop.time() - started - self.period)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
