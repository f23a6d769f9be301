"""CommandWriter: what one loop turn queues leaves in one write; the last answer nsqd waits
for leaves at once."""

from __future__ import annotations

import asyncio

from nsq_ha.connection.writer import CommandWriter


class Socket:
    """Stands in for the StreamTransport: records each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def write_buffer_size(self) -> int:
        return 0


def writer() -> tuple[CommandWriter, Socket]:
    socket = Socket()
    out = CommandWriter(64 * 1024, "127.0.0.1:4150")
    out.transport = socket  # type: ignore[assignment]
    return out, socket


async def test_commands_of_one_turn_leave_in_one_write() -> None:
    out, socket = writer()
    out.enqueue(b"RDY 5\n")
    out.answer(b"FIN a\n", last=False)
    assert socket.writes == []  # gathered until the end of the turn
    await asyncio.sleep(0)
    assert socket.writes == [b"RDY 5\nFIN a\n"]
    assert out.writes == 1


async def test_the_last_answer_leaves_at_once_with_what_is_queued() -> None:
    out, socket = writer()
    out.enqueue(b"RDY 1\n")
    out.answer(b"FIN b\n", last=True)
    assert socket.writes == [b"RDY 1\nFIN b\n"]  # no loop turn waited for
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert socket.writes == [b"RDY 1\nFIN b\n"]  # and nothing left to write later
    assert out.writes == 1
