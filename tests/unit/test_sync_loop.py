"""The blocking facade's shared event loop thread outlives user code that raises SystemExit or
KeyboardInterrupt on it (a callback, an ``on_give_up``, a posted call): it logs and goes on."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading

import pytest

from nsq_ha import sync
from nsq_ha._sync_runtime import loop_thread


async def _echo(value: str) -> str:
    await asyncio.sleep(0)
    return value


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()])
def test_the_shared_loop_keeps_running_after_a_callback_raises(
    caplog: pytest.LogCaptureFixture, raised: BaseException
) -> None:
    loop = sync.shared_loop()
    after = threading.Event()

    def quits() -> None:
        raise raised

    with caplog.at_level(logging.ERROR, logger="nsq_ha.sync"):
        loop.call_soon_threadsafe(quits)
        loop.call_soon_threadsafe(after.set)
        assert after.wait(5), "the loop stopped at the callback"
    assert sync.shared_loop() is loop
    assert asyncio.run_coroutine_threadsafe(_echo("still here"), loop).result(5) == "still here"
    assert type(raised).__name__ in caplog.text


def test_a_posted_call_raising_system_exit_does_not_drop_the_calls_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runner = loop_thread()
    ran: list[str] = []
    after = threading.Event()
    with caplog.at_level(logging.WARNING, logger="nsq_ha.sync"):
        runner.loop.call_soon_threadsafe(lambda: ran.append("first"))
        runner.loop.call_soon_threadsafe(sys.exit)
        runner.loop.call_soon_threadsafe(lambda: ran.append("third"))
        runner.loop.call_soon_threadsafe(after.set)
        assert after.wait(5), "the calls posted after the one that raised never ran"
    assert ran == ["first", "third"]
    assert runner.loop.is_running()
    assert "SystemExit" in caplog.text
