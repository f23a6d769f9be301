"""NsqdConnection before it is connected: a command is refused for the state, before anything
is sent (not as a closed connection)."""

from __future__ import annotations

import pytest

from nsq_ha.connection import NsqdConnection
from nsq_ha.errors import LocalProtocolError
from nsq_ha.protocol.commands import Cls


async def test_a_command_before_connect_is_refused_for_the_state() -> None:
    conn = NsqdConnection("127.0.0.1:4150")
    with pytest.raises(LocalProtocolError, match="cannot send RDY in state INIT"):
        conn.rdy(1)
    with pytest.raises(LocalProtocolError, match="cannot send CLS in state INIT"):
        await conn.command(Cls())
    assert conn.writes == 0
