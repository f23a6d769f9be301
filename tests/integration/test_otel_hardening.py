"""OpenTelemetry instrumentation against lying servers and many short-lived consumers: the
consumer-lag poller ends with the instrumentation and bounds every ``/stats`` request in time
and size, and the metrics export the final counts of closed consumers once, then forget their
channels.

The lying nsqd is an HTTP server in the test (:mod:`.lying_http`) that also plays lookupd: it
answers ``/lookup`` with the embedded cluster's own answer, the node's ``http_port`` swapped for
its own, so the consumer connects to the embedded nsqd over TCP and the lag poller, which finds
nsqd HTTP addresses through lookupd as it does for real ones, asks the lying server's ``/stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

from nsq_ha import otel
from nsq_ha.consumer import Consumer, Message
from nsq_ha.devcluster import DevCluster
from nsq_ha.otel import state as otel_state
from nsq_ha.otel.lag_http import MAX_STATS_BYTES, MAX_STATS_CONTAINERS, MAX_STATS_VALUES
from nsq_ha.producer import Producer
from nsq_ha.testing.servers import V1_ACCEPT

from .lying_http import Handler, LyingHttpServer, answer, by_path, repeated, trickler
from .lying_nsqd import LoopLag

TOPIC = "otel_hardening"
#: the thread the lag poller runs in
POLLER = "nsq_ha-otel-lag"
MiB = 1 << 20
#: what a lying server may make the client hold, and stall its loop (the Guarantees)
MEMORY_BOUND = 64 * MiB
LAG_BOUND = 0.1
SLACK = 2.0  # seconds allowed past a deadline on a loaded machine
GROUP = "messaging.consumer.group.name"


@pytest.fixture(autouse=True)
def not_instrumented() -> Iterator[None]:
    assert not otel.is_instrumented()
    yield
    otel.uninstrument()


def pollers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == POLLER]


def stats_requests(server: LyingHttpServer) -> int:
    return sum(1 for head in server.requests if head.startswith("GET /stats"))


async def until(check: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.02)


async def stats_asked(
    server: LyingHttpServer, count: int, within: float = 20.0, *, since: int | None = None
) -> int:
    """Wait until ``/stats`` was asked ``count`` times more than now (or than ``since``
    requests); the requests so far."""
    target = (stats_requests(server) if since is None else since) + count
    await until(lambda: stats_requests(server) >= target, within)
    return stats_requests(server)


@contextlib.contextmanager
def traced_growth() -> Iterator[list[int]]:
    """Yield a list that receives the peak traced memory growth (bytes) at the end."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    growth: list[int] = []
    try:
        yield growth
    finally:
        growth.append(tracemalloc.get_traced_memory()[1] - base)
        if started:
            tracemalloc.stop()


@contextlib.asynccontextmanager
async def lying_stats(stats: Handler) -> AsyncIterator[LyingHttpServer]:
    """A one-node embedded cluster with ``TOPIC``, behind a lying server that serves its lookupd
    answer (naming itself as the node's HTTP address) and answers ``/stats`` with ``stats``."""
    routes: dict[str, Handler] = {}
    async with DevCluster(nodes=1) as cluster, LyingHttpServer(by_path(routes)) as lying:
        cluster.create_topic(TOPIC, 1)
        async with httpx.AsyncClient() as http:
            params = {"topic": TOPIC, "access": "r", "metainfo": "true"}
            got = await http.get(f"{cluster.lookupd_http}/lookup", params=params, headers=V1_ACCEPT)
        found = got.json()
        port = int(lying.url.rsplit(":", 1)[1])
        for node in [*found["partitions"].values(), *(found.get("producers") or [])]:
            node["http_port"] = port
        routes["/lookup"] = answer(found)
        routes["/stats"] = stats
        yield lying


# -- the poller's life and its requests' deadline ---------------------------------------------


async def test_no_lag_poller_outlives_uninstrument_or_the_last_consumer() -> None:
    """``/stats`` trickles a byte every 50 ms and never ends. Each cycle instruments, starts a
    consumer, lets the poller get stuck in the trickle, then either closes the consumer (the
    last one) or uninstruments first: once that call returns no poller thread is left, and
    cycles do not add threads."""
    async with lying_stats(trickler()) as lying:
        counts = []
        for cycle in range(4):
            otel.instrument(meter_provider=MeterProvider(), lag_interval=0.1)
            consumer = Consumer(TOPIC, f"cycle{cycle}", lookupd=lying.url)
            try:
                asked = stats_requests(lying)
                await consumer.start()
                await stats_asked(lying, 1, since=asked)  # the poller is in the trickle now
                assert len(pollers()) == 1
                if cycle % 2:
                    await consumer.close()
                    assert pollers() == [], "the last instrumented consumer closed"
                    otel.uninstrument()
                else:
                    otel.uninstrument()
                    assert pollers() == [], "uninstrument() returned"
                    await consumer.close()
            finally:
                otel.uninstrument()
                await consumer.close()
            counts.append(threading.active_count())
        assert pollers() == []
        assert counts[-1] <= counts[0], f"threads after each cycle: {counts}"


async def test_a_trickling_stats_request_ends_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``/stats`` answer that trickles forever is given up after the request's timeout (the
    whole request, not each read), warned about, and asked again at the next interval."""
    timeout = 1.0
    monkeypatch.setattr("nsq_ha.otel.lag.HTTP_TIMEOUT", timeout)
    caplog.set_level(logging.WARNING, logger="nsq_ha.otel")
    async with lying_stats(trickler()) as lying:
        otel.instrument(meter_provider=MeterProvider(), lag_interval=0.1)
        async with Consumer(TOPIC, "deadline", lookupd=lying.url):
            await stats_asked(lying, 1)
            started = time.monotonic()
            await stats_asked(lying, 1, within=timeout + 0.1 + 3 * SLACK)
            took = time.monotonic() - started
        otel.uninstrument()
    assert took < timeout + 0.1 + SLACK, f"the trickling request lasted {took:.1f} s"
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{TOPIC}/deadline" in warning.message
    assert "Timeout" in warning.message


# -- the size of a /stats answer ----------------------------------------------------------------


async def test_a_huge_stats_answer_is_refused_without_stalling_the_consumer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``/stats`` answers almost 8 MiB of valid JSON, one empty topic entry per 3 bytes (a
    real answer for one topic and channel is a few hundred KiB at most): the poller stops
    reading past its cap and says so, the consumer's event loop never stalls 100 ms, and the
    process does not grow by 64 MiB."""
    caplog.set_level(logging.WARNING, logger="nsq_ha.otel")
    huge = repeated(b'{"topics":[', b"{},", b"{}]}", total=8 * MiB - 1024)
    async with lying_stats(huge) as lying:
        otel.instrument(meter_provider=MeterProvider(), lag_interval=0.2)
        async with Consumer(TOPIC, "huge", lookupd=lying.url):
            await stats_asked(lying, 1)
            with traced_growth() as growth:
                async with LoopLag() as lag:
                    # a whole poll in between: it was over once the next one asked
                    await stats_asked(lying, 2, within=60)
        otel.uninstrument()
    assert lag.worst < LAG_BOUND, f"the event loop stalled for {lag.worst * 1000:.0f} ms"
    assert growth[0] < MEMORY_BOUND, f"memory grew by {growth[0] / MiB:.1f} MiB"
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert any("/stats" in w and "more than" in w for w in warnings), warnings


TOPICS = b'{"topics":['
UNDER_THE_CAPS = [
    # the slowest to parse: as many floats as are let through
    pytest.param(TOPICS, b"1.5,", b"0]}", 4 * (MAX_STATS_VALUES - 2) + 14, id="floats"),
    # the most memory per byte: short strings
    pytest.param(TOPICS, b'"ab",', b"0]}", 5 * (MAX_STATS_VALUES - 2) + 14, id="strings"),
    # objects, as many as are let through
    pytest.param(TOPICS, b"{},", b"0]}", 3 * (MAX_STATS_CONTAINERS - 2) + 14, id="objects"),
    # bytes up to the cap, in one string of escapes
    pytest.param(b'{"topics":[],"x":"', b"\\u00e9", b'"}', MAX_STATS_BYTES, id="escapes"),
]


@pytest.mark.parametrize(("prefix", "unit", "suffix", "size"), UNDER_THE_CAPS)
async def test_a_stats_answer_under_the_caps_stalls_the_consumer_briefly(
    prefix: bytes, unit: bytes, suffix: bytes, size: int, caplog: pytest.LogCaptureFixture
) -> None:
    """``/stats`` answers just under the poller's caps (bytes, JSON values, objects and
    arrays) with what is slowest to parse or allocates most: the answer is parsed (nothing is
    refused), and a whole poll never stalls the consumer's event loop 100 ms nor grows the
    process by 64 MiB."""
    caplog.set_level(logging.WARNING, logger="nsq_ha.otel")
    async with lying_stats(repeated(prefix, unit, suffix, total=size)) as lying:
        otel.instrument(meter_provider=MeterProvider(), lag_interval=0.1)
        async with Consumer(TOPIC, "under", lookupd=lying.url):
            await stats_asked(lying, 1)
            async with LoopLag() as lag:  # a whole poll in between, then one more traced
                await stats_asked(lying, 2)
            with traced_growth() as growth:
                await stats_asked(lying, 2)
        otel.uninstrument()
    assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert lag.worst < LAG_BOUND, f"the event loop stalled for {lag.worst * 1000:.0f} ms"
    assert growth[0] < MEMORY_BOUND, f"memory grew by {growth[0] / MiB:.1f} MiB"


# -- metrics of closed consumers ------------------------------------------------------------


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Per metric, (attributes, value) of each data point at this collection (a histogram's
    value is its count)."""
    found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = [
                    (dict(p.attributes or {}), getattr(p, "value", getattr(p, "count", None)))
                    for p in metric.data.data_points
                ]
    return found


def groups_of(found: dict[str, list[tuple[dict[str, Any], Any]]]) -> dict[str, set[str]]:
    """Per metric of ``found``, the consumer groups (channels) its data points name."""
    groups: dict[str, set[str]] = {}
    for name, found_points in found.items():
        for attributes, _ in found_points:
            if GROUP in attributes:
                groups.setdefault(name, set()).add(str(attributes[GROUP]))
    return groups


def groups_seen(reader: InMemoryMetricReader) -> dict[str, set[str]]:
    """Per metric, the consumer groups (channels) its data points name at this collection."""
    return groups_of(points(reader))


async def consume_one_each(
    lookupd: str,
    producer: Producer,
    channels: list[str],
    while_open: Callable[[], None] = lambda: None,
) -> None:
    """Start a consumer per channel, publish one message (each channel gets a copy), handle it
    with ``run()`` in every consumer, call ``while_open()``, and close them all."""
    consumers = [Consumer(TOPIC, c, lookupd=lookupd, with_offsets=True) for c in channels]
    handled: list[Message] = []
    for consumer in consumers:
        await consumer.start()
    await until(lambda: all(c.connections for c in consumers))
    runners = [asyncio.ensure_future(c.run(handled.append)) for c in consumers]
    await producer.publish(TOPIC, b"one", partition=0)
    await until(lambda: all(c.stats["finished"] >= 1 for c in consumers))
    assert {m.channel for m in handled} == set(channels)
    assert all(m.offset is not None for m in handled)
    while_open()
    for consumer in consumers:
        await consumer.close()
    await asyncio.gather(*runners)


async def test_metrics_export_the_final_counts_of_closed_consumers_once_then_forget_them() -> None:
    """150 short-lived consumers, each on its own channel, 10 at a time, and no collection
    while most of them run: the next collection after they closed exports each channel's final
    counts (received, finished, its offset), the collection after that none of them, and nsq_ha
    then keeps no state about their channels; a reader with delta temporality sees none of
    them in any instrument after one more collection.

    A reader with cumulative temporality still sees them in ``messaging.process.duration``,
    the one synchronous instrument with a channel attribute: the SDK keeps every series of a
    synchronous instrument for ever under cumulative temporality (up to its cardinality limit).
    """
    delta = {
        kind: AggregationTemporality.DELTA
        for kind in (
            Counter,
            UpDownCounter,
            Histogram,
            ObservableCounter,
            ObservableUpDownCounter,
            ObservableGauge,
        )
    }
    cumulative_reader = InMemoryMetricReader()
    delta_reader = InMemoryMetricReader(preferred_temporality=delta)  # type: ignore[arg-type]
    provider = MeterProvider(metric_readers=[cumulative_reader, delta_reader])
    otel.instrument(meter_provider=provider, lag_interval=None)
    state = otel_state.current()  # the state the instrumentation keeps
    assert state is not None
    metrics = state.metrics
    channels = [f"short{i:03d}" for i in range(150)]
    try:
        async with DevCluster(nodes=1) as cluster:
            cluster.create_topic(TOPIC, 1)
            async with Producer(lookupd=cluster.lookupd_http) as producer:

                def all_there() -> None:  # while consumers are open, their series are there
                    seen = groups_seen(cumulative_reader)
                    for name in ("messaging.client.consumed.messages", "nsq.consumer.offset"):
                        assert set(channels[:10]) <= seen.get(name, set()), name

                for start in range(0, len(channels), 10):
                    batch = channels[start : start + 10]
                    check = all_there if start == 0 else lambda: None
                    await consume_one_each(cluster.lookupd_http, producer, batch, check)
            closed = set(channels)
            final = points(cumulative_reader)  # the first collection since they closed
            for name in ("messaging.client.consumed.messages", "nsq.consumer.offset"):
                assert groups_of(final).get(name, set()) >= closed, name
            received = [
                v for p, v in final["messaging.client.consumed.messages"] if p[GROUP] in closed
            ]
            assert received == [1] * len(channels)
            finished = [
                v
                for p, v in final["nsq.consumer.messages"]
                if p[GROUP] in closed and p["nsq.message.outcome"] == "finished"
            ]
            assert finished == [1] * len(channels)
            seen = groups_seen(cumulative_reader)  # the next one
            assert {name for name, groups in seen.items() if groups & closed} == {
                "messaging.process.duration"
            }
            left: dict[str, Any] = {
                "offsets": dict(metrics.offsets),
                "closed counts": [g for g in metrics.closed if g and g[1] in closed],
                "retired": dict(metrics.retired),
                "consumers": list(metrics.consumers),
            }
            assert left == {"offsets": {}, "closed counts": [], "retired": {}, "consumers": []}
            groups_seen(delta_reader)  # what happened since the last collection
            assert groups_seen(delta_reader) == {}
    finally:
        otel.uninstrument()
        provider.shutdown()
