"""A scripted HTTP server on 127.0.0.1 (port 0) that plays a misbehaving nsqlookupd.

Each connection's request head is read and recorded, then ``handler(head, writer)`` writes
whatever answer the test wants (slowly, hugely, wrongly) and the connection is closed. Every
loop in the handlers below is bounded, and leaving the ``async with`` cancels them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self

Handler = Callable[[str, asyncio.StreamWriter], Awaitable[None]]


class LyingHttpServer:
    """``async with LyingHttpServer(handler) as server``: ``server.url``, ``server.requests``."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: the request heads received (request line and headers), in order
        self.requests: list[str] = []
        self._bodies: dict[int, bytes] = {}
        self.url = ""

    def body(self, writer: asyncio.StreamWriter) -> bytes:
        """The body of the request ``writer`` answers (its Content-Length, up to 1 MiB)."""
        return self._bodies.get(id(writer), b"")

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            text = head.decode("latin-1")
            self.requests.append(text)
            length = next(
                (
                    int(line.split(":", 1)[1])
                    for line in text.split("\r\n")
                    if line.lower().startswith("content-length:")
                ),
                0,
            )
            if 0 < length <= 1 << 20:
                self._bodies[id(writer)] = await asyncio.wait_for(reader.readexactly(length), 10)
            await self._handler(text, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        except asyncio.CancelledError:
            # stopped by __aexit__: end normally, or Python 3.11's start_server logs the
            # cancelled task as an error
            pass
        finally:
            self._bodies.pop(id(writer), None)
            self._tasks.discard(task)  # type: ignore[arg-type]
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()


def head(status: str = "200 OK", *, length: int | None = None, extra: str = "") -> bytes:
    """A response head; no ``length`` means the body runs until the connection closes."""
    lines = [f"HTTP/1.1 {status}", "Content-Type: application/json", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def trickler(interval: float = 0.05, limit: int = 20_000) -> Handler:
    """Answer one byte every ``interval`` s: a valid head, then a body that never ends."""

    async def handle(_head: str, writer: asyncio.StreamWriter) -> None:
        data = head(length=10_000_000) + b" " * limit
        for i in range(len(data)):
            writer.write(data[i : i + 1])
            await writer.drain()
            await asyncio.sleep(interval)

    return handle


def flood(prefix: bytes, *, total: int, length: int | None = None) -> Handler:
    """Answer 200 with ``prefix`` and then filler up to ``total`` bytes, in 64 KiB writes."""

    async def handle(_head: str, writer: asyncio.StreamWriter) -> None:
        writer.write(head(length=length) + prefix)
        chunk = b"a" * 65536
        sent = len(prefix)
        while sent < total:
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)

    return handle


def answer(body: object, status: str = "200 OK", *, extra: str = "") -> Handler:
    """Answer at once with ``body`` (JSON-encoded unless it is bytes)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def handle(_head: str, writer: asyncio.StreamWriter) -> None:
        writer.write(head(status, length=len(data), extra=extra) + data)
        await writer.drain()

    return handle


def by_path(routes: dict[str, Handler]) -> Handler:
    """Dispatch on the request's path (query left out) to ``routes``, read at each request (a
    test may fill it once it knows the server's port); 404 for a path it does not name."""

    async def handle(request_head: str, writer: asyncio.StreamWriter) -> None:
        target = request_head.split(" ", 2)[1] if request_head.count(" ") >= 2 else ""
        route = routes.get(target.split("?", 1)[0])
        if route is None:
            await answer({"message": "NOT_FOUND"}, "404 Not Found")(request_head, writer)
        else:
            await route(request_head, writer)

    return handle


def repeated(prefix: bytes, unit: bytes, suffix: bytes, *, total: int) -> Handler:
    """Answer 200 with ``prefix``, ``unit`` repeated, then ``suffix``: ``total`` bytes at most
    (valid JSON when the three make it), in 64 KiB writes, without a Content-Length."""
    count = max(0, (total - len(prefix) - len(suffix)) // len(unit))
    step = max(1, 65536 // len(unit))

    async def handle(_head: str, writer: asyncio.StreamWriter) -> None:
        writer.write(head() + prefix)
        for done in range(0, count, step):
            writer.write(unit * min(step, count - done))
            await writer.drain()
        writer.write(suffix)
        await writer.drain()

    return handle
