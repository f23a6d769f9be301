"""nsq_ha.transport.Wakeup: what a close waits on for answers, and a write for the socket's
buffer to drain."""

from __future__ import annotations

import asyncio

import pytest

from nsq_ha.transport import Wakeup


async def test_wakeup_wakes_every_waiter_at_the_next_wake_only() -> None:
    wakeup = Wakeup()
    wakeup.wake()  # nobody waits: nothing is remembered
    waiters = [wakeup.wait_next() for _ in range(2)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    wakeup.wake()
    wakeup.wake()  # a second wake before they run is harmless
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
    await asyncio.sleep(0)  # the done callbacks run
    assert wakeup._waiters == []


async def test_a_wake_between_wait_next_and_the_first_await_is_not_lost() -> None:
    """What a close does: take the future, then wait on it among others in a later turn."""
    wakeup = Wakeup()
    waiter = wakeup.wait_next()
    wakeup.wake()
    await asyncio.wait_for(waiter, 1)


async def test_a_cancelled_wakeup_waiter_is_forgotten() -> None:
    wakeup = Wakeup()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(wakeup.wait_next(), 0.01)
    await asyncio.sleep(0)
    assert wakeup._waiters == []
    wakeup.wake()


async def test_a_wake_with_an_error_raises_it_in_every_waiter() -> None:
    wakeup = Wakeup()
    waiters = [wakeup.wait_next() for _ in range(2)]
    wakeup.wake(ConnectionResetError("connection lost"))
    for result in await asyncio.gather(*waiters, return_exceptions=True):
        assert isinstance(result, ConnectionResetError)
    await asyncio.sleep(0)
    assert wakeup._waiters == []
