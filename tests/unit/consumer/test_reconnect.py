"""A consumer's lost or refused connection is made again with the shared retry loop: waits from
``reconnect_interval`` doubling up to ``max_reconnect_interval`` (plus the loop's jitter), one
:class:`~nsq_ha.events.Reconnecting` per failure, and one warning for a failure streak (the
later failures of the streak are logged at debug level).

No server: the nsqd address is a loopback port nothing listens on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from nsq_ha import events
from nsq_ha.consumer import Consumer
from nsq_ha.retry import RECONNECT


async def _failures(consumer: Consumer, count: int) -> list[events.Reconnecting]:
    """The first ``count`` Reconnecting events of ``consumer``'s start."""
    seen: list[events.Reconnecting] = []
    enough = asyncio.Event()

    def heard(event: events.Event) -> None:
        if isinstance(event, events.Reconnecting):
            seen.append(event)
        if len(seen) >= count:
            enough.set()

    events.subscribe(heard, events.Reconnecting)
    try:
        await consumer.start()  # the first attempt fails; start() does not wait for the next
        async with asyncio.timeout(20):
            await enough.wait()
    finally:
        events.unsubscribe(heard)
        await consumer.close()
    return seen[:count]


async def test_a_refused_connection_is_tried_again_with_doubling_waits(
    unused_tcp_port: int,
) -> None:
    address = f"127.0.0.1:{unused_tcp_port}"
    consumer = Consumer(
        "t", "c", nsqd=address, reconnect_interval=0.02, max_reconnect_interval=0.08
    )
    seen = await _failures(consumer, 5)
    assert [e.attempt for e in seen] == [1, 2, 3, 4, 5]
    assert {(e.role, e.topic, e.channel, e.address, e.partition) for e in seen} == {
        ("consumer", "t", "c", address, None)
    }
    for event, base in zip(seen, [0.02, 0.04, 0.08, 0.08, 0.08], strict=True):
        assert event.delay is not None
        assert base <= event.delay <= base + RECONNECT.jitter


async def test_a_failure_streak_logs_one_warning(
    unused_tcp_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    consumer = Consumer(
        "t",
        "c",
        nsqd=f"127.0.0.1:{unused_tcp_port}",
        reconnect_interval=0.01,
        max_reconnect_interval=0.01,
    )
    await _failures(consumer, 4)
    about = [
        r
        for r in caplog.records
        if r.name.startswith("nsq_ha.consumer") and str(unused_tcp_port) in r.getMessage()
    ]
    warnings = [r for r in about if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert len(about) >= 4  # the later failures are there, at debug level
