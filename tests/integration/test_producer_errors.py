"""What the producer's errors and warnings tell a user, on the embedded broker.

* PublishError (retries exhausted) chains the last error as ``__cause__``, as documented.
* A publish retried through a failure logs one warning for the streak and one line when it
  succeeds again, not a warning per try.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from nsq_ha import events
from nsq_ha.devcluster import DevCluster
from nsq_ha.errors import NotWritableError, PublishError
from nsq_ha.producer import Producer, RetryPolicy

BOUND = 15.0  # seconds: every wait of these tests
SHORT = RetryPolicy(attempts=3, deadline=None, initial_backoff=0.01, max_backoff=0.02, jitter=0.0)


def producer_records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == level and r.name.startswith("nsq_ha.producer")
    ]


async def test_publish_error_keeps_the_last_error_as_its_cause() -> None:
    async with DevCluster(nodes=1) as cluster:
        cluster.create_topic("refused", partitions=1)
        cluster.set_writable("refused", 0, False)
        async with Producer(lookupd=cluster.lookupd_http, retry=SHORT) as producer:
            async with asyncio.timeout(BOUND):
                with pytest.raises(PublishError) as info:
                    await producer.publish("refused", b"x")
                with pytest.raises(PublishError) as many:
                    await producer.publish_many("refused", [b"a", b"b"], sharding_key="k")
    error = info.value
    assert error.attempts == 3
    assert isinstance(error.__cause__, NotWritableError)
    assert error.__cause__ is error.last_error
    assert many.value.__cause__ is not None
    assert many.value.__cause__ is many.value.last_error


async def test_a_retried_publish_logs_one_warning_and_one_line_when_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    policy = RetryPolicy(deadline=30.0, initial_backoff=0.01, max_backoff=0.02, jitter=0.0)
    async with DevCluster(nodes=1) as cluster:
        cluster.create_topic("flaky", partitions=1)
        async with Producer(lookupd=cluster.lookupd_http, retry=policy) as producer:
            await producer.publish("flaky", b"warm-up")
            caplog.clear()
            cluster.set_writable("flaky", 0, False)
            refused = asyncio.Event()
            seen: list[events.Event] = []

            def count(event: events.Event) -> None:
                seen.append(event)
                if len(seen) >= 5:
                    refused.set()

            events.subscribe(count, events.Reconnecting)
            try:
                publish = asyncio.create_task(producer.publish("flaky", b"x"))
                async with asyncio.timeout(BOUND):
                    await refused.wait()  # five tries refused
                cluster.set_writable("flaky", 0, True)
                async with asyncio.timeout(BOUND):
                    await publish
            finally:
                events.unsubscribe(count)
    warnings = producer_records(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert "flaky" in warnings[0]
    assert any("again" in m for m in producer_records(caplog, logging.INFO))
