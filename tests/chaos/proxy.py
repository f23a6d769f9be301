"""A TCP proxy the chaos suite puts between the client and a server, to break the wire on cue.

Faults (each affects the connections open when it is set, and new ones while it lasts):

* :meth:`FaultProxy.cut`: the next chunk each connection carries server->client (or, after a
  short grace with no traffic, at once) is forwarded only up to a random byte, then both sides
  are closed: a connection cut mid-frame;
* :meth:`FaultProxy.stall`: nothing is forwarded either way until :meth:`heal` (bytes wait in
  the proxy; the client sees a silent peer);
* :meth:`FaultProxy.slow`: server->client bytes trickle in small pieces with pauses (the
  client's reads starve, its writes back up) until :meth:`heal`.

It runs on the test's event loop; ``random.Random`` from the run's seed picks the cut points.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

__all__ = ["FaultProxy"]

CHUNK = 64 * 1024


@dataclass(eq=False)
class _Pair:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    #: the cut generation this pair has already been cut for
    cut_seen: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for writer in (self.client, self.server):
            with contextlib.suppress(Exception):
                writer.transport.abort()


class FaultProxy:
    """Forward ``listen`` (127.0.0.1, a free port) to ``upstream`` host:port, with faults."""

    def __init__(self, upstream_host: str, upstream_port: int, rng: random.Random) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.rng = rng
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[_Pair] = set()
        self._open = asyncio.Event()
        self._open.set()
        self._cut_generation = 0
        self._slow: tuple[int, float] | None = None
        #: what happened, for the report: cuts made, connections accepted
        self.cuts = 0
        self.accepted = 0

    @property
    def address(self) -> str:
        """``127.0.0.1:port`` to give the client."""
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        self.heal()
        if self._server is not None:
            self._server.close()
        for pair in list(self._pairs):
            pair.close()
        tasks = [t for p in self._pairs for t in p.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pairs.clear()
        if self._server is not None:
            await self._server.wait_closed()

    # -- faults -------------------------------------------------------------------------------

    def cut(self, grace: float = 0.3) -> None:
        """Cut every open connection, mid-frame when traffic comes within ``grace`` seconds."""
        self._cut_generation += 1
        generation = self._cut_generation
        loop = asyncio.get_running_loop()
        loop.call_later(grace, self._cut_idle, generation)

    def _cut_idle(self, generation: int) -> None:
        for pair in list(self._pairs):
            if pair.cut_seen < generation:
                pair.cut_seen = generation
                self.cuts += 1
                pair.close()

    def stall(self) -> None:
        """Forward nothing until :meth:`heal`."""
        self._open.clear()

    def slow(self, piece: int = 16, pause: float = 0.02) -> None:
        """Forward server->client bytes ``piece`` at a time, ``pause`` seconds apart."""
        self._slow = (piece, pause)

    def heal(self) -> None:
        """End stall and slow reads (cuts are instant)."""
        self._open.set()
        self._slow = None

    # -- plumbing -----------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()  # the server is down: the client sees a reset
            return
        pair = _Pair(writer, up_writer, cut_seen=self._cut_generation)
        self._pairs.add(pair)
        pair.tasks = [
            asyncio.create_task(self._pump(pair, reader, up_writer, downstream=False)),
            asyncio.create_task(self._pump(pair, up_reader, writer, downstream=True)),
        ]
        await asyncio.gather(*pair.tasks, return_exceptions=True)
        self._pairs.discard(pair)
        pair.close()

    async def _pump(
        self,
        pair: _Pair,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        downstream: bool,
    ) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                await self._open.wait()
                if pair.cut_seen < self._cut_generation:
                    pair.cut_seen = self._cut_generation
                    self.cuts += 1
                    if len(data) > 1:
                        writer.write(data[: self.rng.randrange(1, len(data))])
                        with contextlib.suppress(Exception):
                            await writer.drain()
                    break
                slow = self._slow
                if downstream and slow is not None:
                    piece, pause = slow
                    for i in range(0, len(data), piece):
                        writer.write(data[i : i + piece])
                        await writer.drain()
                        await asyncio.sleep(pause)
                    continue
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            pair.close()
