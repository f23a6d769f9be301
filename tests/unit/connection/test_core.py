"""NsqdConnection before it is connected: a command is refused for the state, before anything
is sent (not as a closed connection)."""

from __future__ import annotations

import pytest

from nsq_ha.connection import NsqdConnection
from nsq_ha.errors import ConfigError, LocalProtocolError
from nsq_ha.protocol.commands import Cls


async def test_a_command_before_connect_is_refused_for_the_state() -> None:
    conn = NsqdConnection("127.0.0.1:4150")
    with pytest.raises(LocalProtocolError, match="cannot send RDY in state INIT"):
        conn.rdy(1)
    with pytest.raises(LocalProtocolError, match="cannot send CLS in state INIT"):
        await conn.command(Cls())
    assert conn.writes == 0


async def test_a_connection_without_a_message_handler_cannot_subscribe() -> None:
    """Messages would have nowhere to go: refused before anything is sent."""
    conn = NsqdConnection("127.0.0.1:4150")
    with pytest.raises(ConfigError, match="needs a connection made with on_message="):
        await conn.subscribe("t", "c")
    assert conn.writes == 0
