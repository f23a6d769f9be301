"""A producer given a wrong nsqlookupd address fails on its first publish, as a consumer does;
once a lookupd has answered, an outage is retried as before; a failure streak logs once.

* No lookupd has ever answered (connection refused, or an answer that is not HTTP):
  LookupdUnavailableError within about the lookup timeout, naming the address and what to
  check, and at most a warning or two in the log.
* nsqd's TCP port given as the lookupd (4150 for 4161): the error says so. Checked against the
  session's real vanilla nsqd and the embedded broker's nsqd.
* A lookupd that answered once and then went away (a restart) is retried under the retry
  policy, and the producer and the lookup client each log one warning for the streak and one
  line when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from nsq_ha import events
from nsq_ha import sync as nsq_sync
from nsq_ha.devcluster import DevCluster
from nsq_ha.errors import LookupdUnavailableError
from nsq_ha.lookup import LookupClient
from nsq_ha.producer import Producer, RetryPolicy
from nsq_ha.testing.process import free_ports
from nsq_ha.testing.servers import VanillaCluster

from .log_waiter import waiting_for
from .lookupd_proxy import LookupdProxy
from .lying_http import LyingHttpServer
from .tcp_relay import TcpRelay

FAST_FAIL = 2.0  # seconds: a wrong address fails well within the lookup timeout
BOUND = 15.0  # seconds: the test's own bound (retrying a wrong address took 59 s)


def closed_port_url() -> str:
    (port,) = free_ports(1)
    return f"http://127.0.0.1:{port}"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("nsq_ha")
    ]


async def test_a_closed_port_fails_the_first_publish_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    address = closed_port_url()
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    async with Producer(lookupd=address) as producer:
        started = time.monotonic()
        async with asyncio.timeout(BOUND):
            with pytest.raises(LookupdUnavailableError) as info:
                await producer.publish("wrong_address", b"x")
        elapsed = time.monotonic() - started
    text = str(info.value)
    assert elapsed < FAST_FAIL, elapsed
    assert address in text
    assert "4161" in text  # what to check: nsqlookupd's HTTP port
    assert len(warnings_of(caplog)) <= 2, warnings_of(caplog)


async def test_a_consumer_and_a_producer_raise_the_same_error_for_a_closed_port() -> None:
    """The consumer already failed at once; both now say the same thing."""
    from nsq_ha.consumer import Consumer

    address = closed_port_url()
    async with asyncio.timeout(BOUND):
        with pytest.raises(LookupdUnavailableError) as from_consumer:
            async with Consumer("wrong_address", "c", lookupd=address):
                pass
        async with Producer(lookupd=address) as producer:
            with pytest.raises(LookupdUnavailableError) as from_producer:
                await producer.publish("wrong_address", b"x")
    assert type(from_consumer.value) is type(from_producer.value)
    assert str(from_consumer.value) == str(from_producer.value)


async def test_nsqd_tcp_port_of_vanilla_nsqd_is_named_as_such(
    vanilla_cluster: VanillaCluster,
) -> None:
    address = f"http://{vanilla_cluster.nodes[0].tcp_address}"
    async with Producer(lookupd=address) as producer:
        started = time.monotonic()
        async with asyncio.timeout(BOUND):
            with pytest.raises(LookupdUnavailableError) as info:
                await producer.publish("wrong_port", b"x")
        assert time.monotonic() - started < FAST_FAIL
    assert "looks like nsqd's TCP port (4150)" in str(info.value)
    assert "lookupd's HTTP port is usually 4161" in str(info.value)
    assert address in str(info.value)


async def test_nsqd_tcp_port_of_the_embedded_broker_is_named_as_such() -> None:
    async with DevCluster(nodes=1) as cluster:
        address = f"http://127.0.0.1:{cluster.nodes[0].tcp_port}"
        async with Producer(lookupd=address) as producer, asyncio.timeout(BOUND):
            with pytest.raises(LookupdUnavailableError, match="looks like nsqd's TCP port"):
                await producer.publish("wrong_port", b"x")


async def test_an_answer_that_is_not_http_says_to_check_the_port() -> None:
    """Something else than nsqd or nsqlookupd on the port: not HTTP, and not called nsqd."""

    async def banner(_head: str, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        await writer.drain()

    async with LyingHttpServer(banner) as server, Producer(lookupd=server.url) as producer:
        async with asyncio.timeout(BOUND):
            with pytest.raises(LookupdUnavailableError) as info:
                await producer.publish("wrong_port", b"x")
    text = str(info.value)
    assert "not HTTP" in text
    assert "4161" in text
    assert "looks like nsqd" not in text


def test_the_blocking_producer_fails_at_once_too() -> None:
    address = closed_port_url()
    producer = nsq_sync.Producer(lookupd=address)
    try:
        started = time.monotonic()
        with pytest.raises(LookupdUnavailableError, match="4161"):
            producer.publish("wrong_address", b"x")
        assert time.monotonic() - started < FAST_FAIL
    finally:
        producer.close()


async def test_once_lookupd_answered_an_outage_is_retried_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lookupd restart: lookups fail while it is down and the publish waiting for one is
    retried until it is back; one warning from the producer and one from the lookup client,
    then one line each saying it recovered."""
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    policy = RetryPolicy(deadline=30.0, initial_backoff=0.02, max_backoff=0.05, jitter=0.0)
    async with DevCluster(nodes=1) as cluster:
        cluster.create_topic("before", partitions=1)
        cluster.create_topic("during", partitions=1)
        async with (
            LookupdProxy(cluster.lookupd_http) as proxy,  # lists no other lookupd
            TcpRelay("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])) as relay,
            LookupClient(f"http://127.0.0.1:{relay.port}", max_backoff=0.1) as lookup,
            Producer(lookup=lookup, retry=policy) as producer,
        ):
            await producer.publish("before", b"x")  # lookupd has answered
            await relay.down()
            caplog.clear()
            gave_up: list[events.Event] = []
            events.subscribe(gave_up.append, events.PublishGaveUp)
            try:
                with waiting_for("nsq_ha.producer", "lookup of 'during' failed", 5) as tries:
                    publish = asyncio.create_task(producer.publish("during", b"y"))
                    async with asyncio.timeout(BOUND):
                        await tries.event.wait()  # five lookups failed
                assert not publish.done()
                await relay.up()
                async with asyncio.timeout(BOUND):
                    result = await publish
            finally:
                events.unsubscribe(gave_up.append)
            assert result.topic == "during"
            assert not gave_up
    by_logger: dict[str, list[tuple[int, str]]] = {}
    for r in caplog.records:
        if r.levelno >= logging.INFO and r.name.startswith(("nsq_ha.producer", "nsq_ha.lookup")):
            by_logger.setdefault(r.name.split(".")[1], []).append((r.levelno, r.getMessage()))
    producer_lines = by_logger.get("producer", [])
    lookup_lines = by_logger.get("lookup", [])
    assert [lv for lv, _ in producer_lines].count(logging.WARNING) == 1, producer_lines
    assert [lv for lv, _ in lookup_lines].count(logging.WARNING) == 1, lookup_lines
    assert any("again" in m for lv, m in producer_lines if lv == logging.INFO), producer_lines
    assert any("again" in m for lv, m in lookup_lines if lv == logging.INFO), lookup_lines
