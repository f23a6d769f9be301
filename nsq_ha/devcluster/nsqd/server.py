"""The emulated nsqd's TCP listener: one node of a DevCluster, its connections, pause and cuts."""

from __future__ import annotations

import asyncio
import contextlib

from ..model import DevNode, NodeState
from ..view import ClusterView
from .connection import ClientConnection

__all__ = ["NsqdServer"]


class NsqdServer:
    """The TCP listener of one emulated node; its open connections are ``node.connections``."""

    def __init__(self, view: ClusterView, node: DevNode) -> None:
        self.view = view
        self.node = node
        self._server: asyncio.Server | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()

    def __repr__(self) -> str:
        return f"<NsqdServer node{self.node.index} {self.node.tcp_address} {self.node.state}>"

    @property
    def clients(self) -> set[ClientConnection]:
        """The open connections."""
        return self.node.connections

    async def start(self, port: int = 0) -> int:
        """Listen on ``port`` (0: a free one); return the port."""
        self._server = await asyncio.start_server(self._accept, self.node.host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self, *, abort: bool = False) -> None:
        """Stop listening and close every connection (``abort``: reset them)."""
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            client.drop("node stopped" if not abort else "node killed", abort=abort)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    def paused(self) -> bool:
        """True while the node is paused (connections frozen)."""
        return self.node.state == NodeState.PAUSED

    async def wait_resumed(self) -> None:
        """Return once the node is not paused."""
        while self.paused():
            self._resumed.clear()
            await self._resumed.wait()

    def resume(self) -> None:
        """Wake the frozen connections and deliver what piled up."""
        self._resumed.set()
        now = self.view.now()
        for client in list(self.clients):
            if client.hub is not None:
                client.hub.dispatch(now)

    def arm_cut(self) -> None:
        """Apply a new ``cut_after`` budget to every open connection."""
        for client in self.clients:
            client.output.arm_cut()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = ClientConnection(self, reader, writer)
        self.clients.add(client)
        try:
            await client.run()
        finally:
            self.clients.discard(client)
