"""Helpers shared by the integration tests."""

from __future__ import annotations

import asyncio

from nsq_ha.connection import NsqdConnection
from nsq_ha.protocol import DecodedMessage


async def take(conn: NsqdConnection, count: int, within: float = 10.0) -> list[DecodedMessage]:
    """Read ``count`` messages from ``conn.messages()``; TimeoutError after ``within`` s."""
    received: list[DecodedMessage] = []

    async def collect() -> None:
        async for message in conn.messages():
            received.append(message)
            if len(received) == count:
                return

    await asyncio.wait_for(collect(), within)
    return received
