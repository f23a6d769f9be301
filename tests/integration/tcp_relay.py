"""A TCP relay on 127.0.0.1 that can be taken down and brought back on the same port.

``async with TcpRelay(upstream_host, upstream_port) as relay``: clients use ``relay.port``; the
bytes go to the upstream and back unchanged. ``await relay.down()`` closes the listening socket
and every relayed connection (new connections are refused, as by a restarting server);
``await relay.up()`` listens on the same port again. Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

_CHUNK = 65536


class TcpRelay:
    """Relay connections to ``host:port``; :meth:`down` and :meth:`up` play an outage."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        #: connections accepted so far
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> Self:
        await self.up()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.down()

    async def up(self) -> None:
        """Listen (on the port of the first start, once there was one)."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        """Stop listening and cut every relayed connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.accepted += 1
        upstream: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), 5
            )
            upstream = up_writer
            self._writers.add(up_writer)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, TimeoutError, asyncio.CancelledError):
            pass  # a cut connection, or down(): the client sees it closed
        finally:
            self._tasks.discard(task)
            for end in (writer, upstream):
                if end is not None:
                    self._writers.discard(end)
                    end.close()
                    with contextlib.suppress(OSError, asyncio.CancelledError):
                        await end.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of file, then half-close the other side."""
    while data := await reader.read(_CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
