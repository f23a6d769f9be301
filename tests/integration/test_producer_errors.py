"""What the producer's errors and warnings tell a user, on the embedded broker.

* PublishError (retries exhausted) chains the last error as ``__cause__``, as documented.
* A publish retried through a failure logs one warning for the streak and one line when it
  succeeds again, not a warning per try; its tries after the first are the project's shared
  retry loop (``nsq_ha.retry``), which a publish that succeeds at once never builds.
* An unknown topic names the command and the admin call that create it.
* Unkeyed messages to an ordered topic are not kept in order: one warning per topic says so.
* A ``str`` body is refused before anything is sent, with the fix in the error.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from nsq_ha import events, retry
from nsq_ha.devcluster import DevCluster
from nsq_ha.errors import (
    InvalidArgumentError,
    NotWritableError,
    PublishError,
    TopicNotFoundError,
)
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


async def test_only_a_failed_first_try_builds_the_shared_retry_loop(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try of a publish is made outside tenacity; the tries after a failure are
    ``nsq_ha.retry``'s loop, whose warning names the attempt and the next wait."""
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    built: list[object] = []
    shared = retry.AsyncRetrying

    def counted(**options: object) -> object:
        built.append(options)
        return shared(**options)  # type: ignore[arg-type]

    monkeypatch.setattr(retry, "AsyncRetrying", counted)
    policy = RetryPolicy(deadline=30.0, initial_backoff=0.01, max_backoff=0.02, jitter=0.0)
    async with DevCluster(nodes=1) as cluster:
        cluster.create_topic("shaky", partitions=1)
        async with Producer(lookupd=cluster.lookupd_http, retry=policy) as producer:
            async with asyncio.timeout(BOUND):
                for i in range(20):
                    await producer.publish("shaky", b"%d" % i)
            assert built == []  # twenty publishes (and the lookup before them) built none
            cluster.set_writable("shaky", 0, False)
            refused = asyncio.Event()
            listener = events.subscribe(lambda _: refused.set(), events.Reconnecting)
            try:
                publish = asyncio.create_task(producer.publish("shaky", b"x"))
                async with asyncio.timeout(BOUND):
                    await refused.wait()
                cluster.set_writable("shaky", 0, True)
                async with asyncio.timeout(BOUND):
                    await publish
            finally:
                events.unsubscribe(listener)
    assert len(built) == 1  # one loop, for the publish the warning names
    warnings = producer_records(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert "publish to 'shaky' failed on attempt 1" in warnings[0]
    assert "next try in" in warnings[0]


async def test_an_unknown_topic_names_the_command_and_the_admin_call() -> None:
    async with (
        DevCluster(nodes=1) as cluster,
        Producer(lookupd=cluster.lookupd_http) as producer,
        asyncio.timeout(BOUND),
    ):
        with pytest.raises(TopicNotFoundError) as info:
            await producer.publish("no_such_topic", b"x")
    text = str(info.value)
    assert "nsq-ha topic create" in text
    assert "--topic no_such_topic" in text
    assert "LookupdAdmin.create_topic" in text
    assert "POST /topic/create" not in text


async def test_unkeyed_publishes_to_an_ordered_topic_warn_once_per_topic(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="nsq_ha")
    async with DevCluster(nodes=1) as cluster:
        cluster.create_topic("orders", partitions=2, ordered=True)
        cluster.create_topic("payments", partitions=2, ordered=True)
        cluster.create_topic("plain", partitions=2)
        async with Producer(lookupd=cluster.lookupd_http) as producer, asyncio.timeout(BOUND):
            await producer.publish("orders", b"k", sharding_key="user-1")  # keyed: no warning
            assert producer_records(caplog, logging.WARNING) == []
            for i in range(3):
                await producer.publish("orders", b"%d" % i)
            await producer.publish_many("orders", [b"a", b"b"])
            await producer.publish("plain", b"x")  # not ordered: no warning
            await producer.publish_many("payments", [b"a", b"b"])
    warnings = producer_records(caplog, logging.WARNING)
    assert len(warnings) == 2, warnings
    assert "'orders'" in warnings[0]
    assert "'payments'" in warnings[1]
    assert all("sharding_key" in w for w in warnings)


async def publish_text(producer: Producer, *, many: bool) -> object:
    """Publish a ``str`` body, alone or after a good one."""
    if many:
        return await producer.publish_many("text", [b"ok", "not bytes"])  # type: ignore[list-item]
    return await producer.publish("text", "not bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("many", [False, True], ids=["publish", "publish_many"])
async def test_a_str_body_says_to_encode_it(many: bool) -> None:
    async with DevCluster(nodes=1) as cluster:
        cluster.create_topic("text", partitions=1)
        async with Producer(lookupd=cluster.lookupd_http) as producer, asyncio.timeout(BOUND):
            with pytest.raises(InvalidArgumentError, match=r"body\.encode\(\)"):
                await publish_text(producer, many=many)
            assert producer.stats["commands"] == 0  # nothing was sent
