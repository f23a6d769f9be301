"""A listener that raises anything, ``sys.exit()`` included, never stops the clients, on the
embedded cluster: the publish that emitted the event gets its own outcome (PublishError when
the retry policy gives up), and the same producer keeps publishing."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from nsq_ha import events, sync
from nsq_ha.devcluster import DevCluster, DevClusterThread
from nsq_ha.errors import PublishError
from nsq_ha.producer import Producer, RetryPolicy

STUCK = "stuck"  # its one partition refuses every publish (E_FAILED_ON_NOT_WRITABLE)
FINE = "fine"

#: gives up after 3 attempts, well within a second
QUICK = RetryPolicy(attempts=3, deadline=5.0, initial_backoff=0.01, jitter=0.0)


@pytest.fixture
def registry() -> Iterator[list[events.Event]]:
    """The events seen during the test (other tests' listeners kept aside)."""
    saved = events._listeners
    events._listeners = []
    seen: list[events.Event] = []
    events.subscribe(seen.append)
    try:
        yield seen
    finally:
        events._listeners = saved


def stop_the_program(event: events.Event) -> None:
    """What a user might write: give up on the first failed publish."""
    sys.exit(f"giving up: {event}")


class Interrupt(BaseException):
    """Neither SystemExit nor KeyboardInterrupt, and no Exception either."""


def interrupt(event: events.Event) -> None:
    raise Interrupt(event)


def test_a_listener_calling_sys_exit_does_not_stop_the_blocking_producer(
    devcluster: DevClusterThread, registry: list[events.Event]
) -> None:
    """The publish that gave up raises PublishError within its deadline; every later publish
    on the same producer (a healthy topic, and the stuck one again) gets its own outcome."""
    devcluster.create_topic(STUCK, 1, 1)
    devcluster.create_topic(FINE, 2, 1)
    devcluster.call(devcluster.cluster.set_writable, STUCK, 0, False)
    events.subscribe(stop_the_program, events.PublishGaveUp)
    producer = sync.Producer(lookupd=devcluster.lookupd_http, retry=QUICK, close_timeout=2.0)
    try:
        started = time.monotonic()
        with pytest.raises(PublishError, match="E_FAILED_ON_NOT_WRITABLE"):
            producer.publish(STUCK, b"refused", timeout=15)
        assert time.monotonic() - started < 10
        assert [e for e in registry if isinstance(e, events.PublishGaveUp)]
        for i in range(5):
            assert producer.publish(FINE, b"ok%d" % i, timeout=15).topic == FINE
        with pytest.raises(PublishError):
            producer.publish(STUCK, b"refused again", timeout=15)
        assert producer.publish_many(FINE, [b"a", b"b"], timeout=15)[1].topic == FINE
    finally:
        producer.close(timeout=5)
    assert sync.shared_loop().is_running()


@pytest.mark.parametrize("listener", [stop_the_program, interrupt])
async def test_a_listener_raising_base_exception_does_not_break_the_async_producer(
    registry: list[events.Event], listener: events.Listener
) -> None:
    """A listener of every kind of event raises inside the producer's send path: the
    publish gets its PublishError, later publishes succeed, the producer closes cleanly."""
    events.subscribe(listener)
    async with DevCluster(nodes=1) as cluster:
        cluster.create_topic(STUCK, 1, 1)
        cluster.create_topic(FINE, 1, 1)
        cluster.set_writable(STUCK, 0, False)
        async with Producer(lookupd=cluster.lookupd_http, retry=QUICK) as producer:
            with pytest.raises(PublishError, match="E_FAILED_ON_NOT_WRITABLE"):
                await producer.publish(STUCK, b"refused")
            results = [await producer.publish(FINE, b"ok%d" % i) for i in range(5)]
            assert [r.topic for r in results] == [FINE] * 5
            cluster.set_writable(STUCK, 0, True)
            assert (await producer.publish(STUCK, b"accepted")).topic == STUCK
    assert any(isinstance(e, events.PublishGaveUp) for e in registry)
