"""FrameReader's work per event-loop turn: a read of thousands of frames nothing asked for is
handled a bounded share per turn, with the transport held meanwhile; messages and answers are
not held back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

from nsq_ha.connection.reader import EVENTS_PER_TURN, FrameReader, PendingAnswers
from nsq_ha.errors import BrokerError, ConnectionClosedError, FinFailedError
from nsq_ha.protocol.broker import encode_message
from nsq_ha.protocol.frames import FrameType, encode_frame
from nsq_ha.protocol.message import DecodedMessage, MessageFormat
from nsq_ha.protocol.session import ClientSession
from tests.unit.connection.wire import Pushed, subscribed_session

FIN_FAILED = encode_frame(FrameType.ERROR, b"E_FIN_FAILED FIN 0000000000000000 failed")


async def started(
    session: ClientSession, *, deliver: Callable[[DecodedMessage], object] = lambda m: None
) -> tuple[Pushed, list[BrokerError], asyncio.Task[None]]:
    """Run a FrameReader over a real transport whose reads are pushed by hand; return that,
    the reported errors, the task."""
    transport = Pushed()
    reported: list[BrokerError] = []
    frames = FrameReader(
        session,
        transport.transport,
        PendingAnswers(),
        deliver=deliver,
        on_error=reported.append,
    )
    task = asyncio.create_task(frames.run())
    await asyncio.sleep(0)
    assert transport.receiving
    return transport, reported, task


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_error_frames_in_one_read_are_handled_a_bounded_share_per_turn() -> None:
    """1000 error frames in one read: EVENTS_PER_TURN now with the transport held, as many per
    following turn, in order; bytes that come while held wait their turn; then it is
    released."""
    transport, reported, task = await started(subscribed_session(10))
    transport.push(FIN_FAILED * 1000)
    assert len(reported) == EVENTS_PER_TURN
    assert transport.held
    transport.push(FIN_FAILED * 5)  # already read when the transport was held
    assert len(reported) == EVENTS_PER_TURN
    shares = []
    for _ in range(20):  # 1005 / 128 turns, and then some
        before = len(reported)
        await asyncio.sleep(0)
        shares.append(len(reported) - before)
        if not transport.held:
            break
    assert not transport.held
    assert transport.holds == 1
    assert len(reported) == 1005
    assert all(isinstance(error, FinFailedError) for error in reported)
    assert max(shares) <= EVENTS_PER_TURN, shares
    await stopped(task)


async def test_messages_in_one_read_are_not_held_back() -> None:
    """1000 messages within the RDY given in one read are all delivered in that read."""
    delivered: list[DecodedMessage] = []
    transport, _, task = await started(subscribed_session(1000), deliver=delivered.append)
    stream = b"".join(
        encode_frame(
            FrameType.MESSAGE,
            encode_message(
                DecodedMessage(timestamp=1, attempts=1, id=b"%016x" % i, body=b"m"),
                MessageFormat.vanilla(),
            ),
        )
        for i in range(1000)
    )
    transport.push(stream)
    assert len(delivered) == 1000
    assert transport.holds == 0
    await stopped(task)


async def test_frames_left_when_the_peer_closes_are_handled_before_the_end() -> None:
    """nsqd closes while a backlog waits: every frame already read is handled, then the read
    ends with ConnectionClosedError."""
    transport, reported, task = await started(subscribed_session(10))
    transport.push(FIN_FAILED * 1000)
    transport.end(None)
    with pytest.raises(ConnectionClosedError, match="closed the connection"):
        await task
    assert len(reported) == 1000
