"""OpenTelemetry instrumentation (``nsq_ha.otel``) and client events (``nsq_ha.events``) on the
embedded broker and on the real fork: the publish span is the parent of the handler's span on
ext topics (traceparent in the ext header), the fork's trace id ties them on plain topics, the
metrics count what was done, and leader moves and give-ups reach event listeners."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from nsq_ha import events, otel
from nsq_ha.admin import LookupdAdmin, TopicSpec
from nsq_ha.consumer import Consumer, Message
from nsq_ha.errors import PublishError
from nsq_ha.lookup import LookupClient
from nsq_ha.producer import Producer, PublishResult, RetryPolicy

from .backend import Backend

EXT = TopicSpec("nsqha_otel_ext", partitions=2, ext=True)
PLAIN = TopicSpec("nsqha_otel_plain", partitions=2)
MOVE = TopicSpec("nsqha_otel_move", partitions=1, replicas=2)
LAG = TopicSpec("nsqha_otel_lag", partitions=2)
U64 = (1 << 64) - 1


class Telemetry:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        otel.instrument(tracer_provider=tracer_provider, meter_provider=self.meter_provider)

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def points(self, metric: str, **match: str) -> list[Any]:
        """The data points of ``metric`` whose attributes include ``match``."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found += [
                            p
                            for p in m.data.data_points
                            if all(p.attributes.get(k) == v for k, v in match.items())
                        ]
        return found

    def total(self, metric: str, **match: str) -> int:
        return sum(p.value for p in self.points(metric, **match))


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    made = Telemetry()
    try:
        yield made
    finally:
        otel.uninstrument()
        made.meter_provider.shutdown()


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics([EXT, PLAIN, MOVE, LAG])
    return backend


@pytest.fixture
def seen() -> Iterator[list[events.Event]]:
    got: list[events.Event] = []
    events.subscribe(got.append)
    try:
        yield got
    finally:
        events.unsubscribe(got.append)


def channel() -> str:
    return f"otel{uuid.uuid4().hex[:8]}"


async def subscribed(consumer: Consumer, partitions: int) -> None:
    """Start ``consumer`` and wait until every partition is subscribed (a new channel gets only
    what is published after it exists)."""
    await consumer.start()
    deadline = time.monotonic() + 30
    while len(consumer.connections) < partitions:
        assert time.monotonic() < deadline, consumer.stats
        await asyncio.sleep(0.05)


async def until(check: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def publish_and_handle(
    cluster: Backend,
    spec: TopicSpec,
    count: int,
    before_close: Callable[[Consumer], None] = lambda _: None,
) -> tuple[list[PublishResult], list[Message], Consumer]:
    """Publish ``count`` keyed messages to ``spec`` and handle them with ``run()``; then
    ``before_close(consumer)``; the consumer is closed on return."""
    handled: list[Message] = []
    consumer = Consumer(spec.name, channel(), lookupd=cluster.lookupd_http)
    await subscribed(consumer, spec.partitions)
    runner = asyncio.ensure_future(consumer.run(handled.append))
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        results = [
            await producer.publish(spec.name, f"m{i}".encode(), sharding_key=f"k{i}")
            for i in range(count)
        ]
    await until(lambda: len(handled) >= count and consumer.stats["finished"] >= count)
    before_close(consumer)
    await consumer.close()
    await runner
    return results, handled, consumer


def of_span(handled: list[Message], span: ReadableSpan) -> Message:
    """The handled message ``span`` is about."""
    return next(m for m in handled if m.id.hex() == (span.attributes or {})["messaging.message.id"])


def check_publish_span(span: ReadableSpan, topic: str, result: PublishResult) -> None:
    attrs = span.attributes or {}
    assert span.kind is SpanKind.PRODUCER
    assert attrs["messaging.system"] == "nsq"
    assert attrs["messaging.destination.name"] == topic
    assert attrs["messaging.operation.type"] == "send"
    assert attrs["messaging.operation.name"] == "publish"
    assert attrs["messaging.destination.partition.id"] == str(result.partition)
    assert attrs["nsq.message.offset"] == result.offset
    assert result.message_id is not None
    assert attrs["messaging.message.id"] == result.message_id.hex()
    # the fork's trace id of the message is the low 64 bits of the publish span's trace id
    assert result.trace_id == span.context.trace_id & U64
    assert attrs["nsq.trace_id"] == str(result.trace_id)


def check_process_span(span: ReadableSpan, message: Message) -> None:
    attrs = span.attributes or {}
    assert span.kind is SpanKind.CONSUMER
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.destination.name"] == message.topic
    assert attrs["messaging.consumer.group.name"] == message.channel
    assert attrs["messaging.destination.partition.id"] == str(message.partition)
    assert attrs["messaging.message.id"] == message.id.hex()
    assert attrs["nsq.trace_id"] == str(message.trace_id)


async def test_ext_topic_consumer_span_is_a_child_of_the_publish_span(
    cluster: Backend, telemetry: Telemetry
) -> None:
    results, handled, _ = await publish_and_handle(cluster, EXT, 3)
    publishes = telemetry.finished(f"publish {EXT.name}")
    processes = telemetry.finished(f"process {EXT.name}")
    assert len(publishes) == 3
    assert len(processes) == 3
    by_span = {s.context.span_id: (s, r) for s, r in zip(publishes, results, strict=True)}
    for span, result in by_span.values():
        check_publish_span(span, EXT.name, result)
    for process in processes:
        assert process.parent is not None
        parent, result = by_span[process.parent.span_id]  # the publish span is its parent
        assert process.context.trace_id == parent.context.trace_id
        message = next(
            m for m in handled if m.id.hex() == process.attributes["messaging.message.id"]
        )
        assert message.ext["traceparent"].split("-")[2] == f"{parent.context.span_id:016x}"
        check_process_span(process, message)
        assert process.attributes["nsq.trace_id"] == parent.attributes["nsq.trace_id"]


async def test_plain_topic_spans_share_the_fork_trace_id(
    cluster: Backend, telemetry: Telemetry
) -> None:
    results, handled, _ = await publish_and_handle(cluster, PLAIN, 3)
    publishes = telemetry.finished(f"publish {PLAIN.name}")
    processes = telemetry.finished(f"process {PLAIN.name}")
    assert len(publishes) == len(processes) == 3
    for span, result in zip(publishes, results, strict=True):
        check_publish_span(span, PLAIN.name, result)
    by_trace_id = {s.attributes["nsq.trace_id"]: s for s in publishes}
    for process in processes:
        message = next(
            m for m in handled if m.id.hex() == process.attributes["messaging.message.id"]
        )
        check_process_span(process, message)
        # no header to carry a span context: linked by the fork's 64-bit trace id alone
        publish = by_trace_id[process.attributes["nsq.trace_id"]]
        assert message.trace_id == publish.context.trace_id & U64
        assert process.parent is None
        assert message.ext == {}


async def test_metrics_count_what_was_published_and_consumed(
    cluster: Backend, telemetry: Telemetry
) -> None:
    count = 5
    topic = {"messaging.destination.name": PLAIN.name}
    outcome = "nsq.message.outcome"

    def consumer_side(consumer: Consumer) -> None:  # while the consumer runs
        group = {**topic, "messaging.consumer.group.name": consumer.channel}
        assert telemetry.total("messaging.client.consumed.messages", **group) == count
        assert telemetry.total("nsq.consumer.messages", **group, **{outcome: "finished"}) == count
        for other in ("requeued", "timed_out", "given_up", "abandoned"):
            assert telemetry.total("nsq.consumer.messages", **group, **{outcome: other}) == 0
        assert telemetry.total("nsq.consumer.in_flight", **group) == 0

    _, _, consumer = await publish_and_handle(cluster, PLAIN, count, consumer_side)
    group = {**topic, "messaging.consumer.group.name": consumer.channel}
    assert telemetry.total("messaging.client.sent.messages", **topic) == count
    durations = telemetry.points("messaging.client.operation.duration", **topic)
    assert sum(p.count for p in durations) == count
    assert all(p.sum > 0 for p in durations)
    assert telemetry.total("nsq.client.publish.errors", **topic) == 0
    processed = telemetry.points("messaging.process.duration", **group)
    assert sum(p.count for p in processed) == count
    assert telemetry.total("nsq.producer.retries") == 0
    # closed, and no other consumer of its channel: the channel's observed series ended
    for name in ("messaging.client.consumed.messages", "nsq.consumer.messages"):
        assert telemetry.points(name, **group) == [], name


async def test_leader_move_is_an_event_and_a_metric(
    cluster: Backend, telemetry: Telemetry, seen: list[events.Event]
) -> None:
    consumer = Consumer(MOVE.name, channel(), lookupd=cluster.lookupd_http, lookup_interval=0.5)
    await subscribed(consumer, 1)
    lookup = LookupClient(cluster.lookupd_http, refresh_interval=0.5)
    async with Producer(lookup=lookup) as producer:
        await producer.publish(MOVE.name, b"before", partition=0)
        old = cluster.leader(MOVE.name, 0)
        await asyncio.to_thread(cluster.wait_stable)  # nudged: the move would wait for it
        async with LookupdAdmin(cluster.lookupd_http) as admin:
            new = (await admin.move_leader(MOVE.name, 0, timeout=240)).address
        assert new != old

        def moves(role: str) -> list[events.LeaderChanged]:
            return [
                e
                for e in seen
                if isinstance(e, events.LeaderChanged) and e.role == role and e.topic == MOVE.name
            ]

        await until(lambda: bool(moves("producer")) and bool(moves("consumer")), within=60)
        await producer.publish(MOVE.name, b"after", partition=0)
    await lookup.close()
    await consumer.close()
    for role in ("producer", "consumer"):
        event = moves(role)[0]
        assert (event.partition, event.old, event.new) == (0, old, new)
    assert moves("consumer")[0].channel == consumer.channel
    assert moves("producer")[0].channel is None
    changes = telemetry.total(
        "nsq.client.leader_changes", **{"messaging.destination.name": MOVE.name}
    )
    assert changes == len(moves("producer")) + len(moves("consumer"))


async def test_a_message_given_up_is_an_event(
    cluster: Backend, telemetry: Telemetry, seen: list[events.Event]
) -> None:
    given_up: list[Message] = []
    consumer = Consumer(
        PLAIN.name,
        channel(),
        lookupd=cluster.lookupd_http,
        max_attempts=1,
        requeue_delay=0.0,
        backoff=None,
        on_give_up=given_up.append,
    )
    await subscribed(consumer, PLAIN.partitions)

    def fail(message: Message) -> None:
        raise RuntimeError("always")

    runner = asyncio.ensure_future(consumer.run(fail))
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        result = await producer.publish(PLAIN.name, b"doomed", partition=1)
    await until(lambda: bool(given_up))
    await consumer.close()
    await runner
    (event,) = [e for e in seen if isinstance(e, events.MessageGaveUp)]
    assert event.topic == PLAIN.name
    assert event.channel == consumer.channel
    assert event.partition == 1
    assert event.attempts == 2
    assert event.max_attempts == 1
    assert result.message_id is not None
    assert event.message_id == result.message_id.hex() == given_up[0].id.hex()
    assert telemetry.total("nsq.client.give_ups", **{"nsq.client.role": "consumer"}) == 1
    processes = telemetry.finished(f"process {PLAIN.name}")
    assert processes
    assert processes[0].status.status_code.name == "ERROR"
    assert processes[0].attributes["error.type"] == "RuntimeError"


async def test_a_publish_that_gives_up_is_an_event(
    telemetry: Telemetry, seen: list[events.Event], unused_tcp_port: int
) -> None:
    policy = RetryPolicy(attempts=3, deadline=None, initial_backoff=0.01, max_backoff=0.01)
    async with Producer(nsqd=f"127.0.0.1:{unused_tcp_port}", retry=policy) as producer:
        with pytest.raises(PublishError):
            await producer.publish("nsqha_otel_nowhere", b"x")
    gave_up = [e for e in seen if isinstance(e, events.PublishGaveUp)]
    assert [(e.topic, e.attempts, e.operation) for e in gave_up] == [
        ("nsqha_otel_nowhere", 3, "publish")
    ]
    reconnects = [e for e in seen if isinstance(e, events.Reconnecting)]
    assert [e.attempt for e in reconnects] == [1, 2, 3]
    assert {(e.role, e.address) for e in reconnects} == {
        ("producer", f"127.0.0.1:{unused_tcp_port}")
    }
    (span,) = telemetry.finished("publish nsqha_otel_nowhere")
    assert span.status.status_code.name == "ERROR"
    assert span.attributes["error.type"] == "PublishError"
    errors = telemetry.points(
        "nsq.client.publish.errors", **{"messaging.destination.name": "nsqha_otel_nowhere"}
    )
    assert [(p.attributes["error.type"], p.value) for p in errors] == [("PublishError", 1)]
    assert telemetry.total("nsq.client.give_ups", **{"nsq.client.role": "producer"}) == 1
    assert telemetry.total("nsq.client.reconnects", **{"nsq.client.role": "producer"}) == 3
    assert telemetry.total("nsq.producer.retries") == 2


async def test_publish_many_carries_the_context_in_every_message(
    cluster: Backend, telemetry: Telemetry
) -> None:
    handled: list[Message] = []
    consumers = [
        Consumer(spec.name, channel(), lookupd=cluster.lookupd_http) for spec in (EXT, PLAIN)
    ]
    for consumer in consumers:
        await subscribed(consumer, 2)
    runners = [asyncio.ensure_future(c.run(handled.append)) for c in consumers]
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        ext_results = await producer.publish_many(
            EXT.name,
            [b"a", b"b", b"c"],
            exts=[{"k": "1"}, None, {"##trace_id": "77"}],
            partition=0,
        )
        plain_results = await producer.publish_many(
            PLAIN.name, [b"x", b"y"], trace_ids=[5, None], partition=1
        )
    await until(lambda: len(handled) >= 5)
    for consumer in consumers:
        await consumer.close()
    await asyncio.gather(*runners)
    (ext_span,) = telemetry.finished(f"publish {EXT.name}")
    (plain_span,) = telemetry.finished(f"publish {PLAIN.name}")
    assert ext_span.attributes["messaging.batch.message_count"] == 3
    assert ext_span.attributes["messaging.destination.partition.id"] == "0"
    ext_id = ext_span.context.trace_id & U64
    plain_id = plain_span.context.trace_id & U64
    assert [r.trace_id for r in ext_results] == [ext_id, ext_id, 77]
    assert [r.trace_id for r in plain_results] == [5, plain_id]
    by_body = {m.body: m for m in handled}
    assert by_body[b"a"].ext["k"] == "1"
    assert by_body[b"c"].trace_id == 77
    for body in (b"a", b"b", b"c"):
        span_id = by_body[body].ext["traceparent"].split("-")[2]
        assert span_id == f"{ext_span.context.span_id:016x}"
    processes = telemetry.finished(f"process {EXT.name}")
    assert len(processes) == 3
    assert {p.parent.span_id for p in processes if p.parent} == {ext_span.context.span_id}
    assert [by_body[b].trace_id for b in (b"x", b"y")] == [5, plain_id]


class LagTelemetry(Telemetry):
    """Metrics only, with the consumer lag read every ``lag_interval`` seconds."""

    def __init__(self, lag_interval: float) -> None:
        self.spans = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        otel.instrument(meter_provider=self.meter_provider, lag_interval=lag_interval)


@pytest.fixture
def lag_telemetry() -> Iterator[LagTelemetry]:
    made = LagTelemetry(0.2)
    try:
        yield made
    finally:
        otel.uninstrument()
        made.meter_provider.shutdown()


async def test_consumer_lag_per_partition_is_published_minus_finished(
    cluster: Backend, lag_telemetry: LagTelemetry
) -> None:
    published, finished, other = 10, 4, 3
    name = channel()
    group = {"messaging.destination.name": LAG.name, "messaging.consumer.group.name": name}
    async with LookupdAdmin(cluster.lookupd_http) as admin:
        # made before the publishes: a new channel of the fork starts at the partition's end
        assert await admin.create_channel(LAG.name, name) == [0, 1]
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        for i in range(published):
            await producer.publish(LAG.name, b"p0-%d" % i, partition=0)
        for i in range(other):
            await producer.publish(LAG.name, b"p1-%d" % i, partition=1)
    consumer = Consumer(
        LAG.name, name, lookupd=cluster.lookupd_http, partitions=[0], max_in_flight=1
    )
    await consumer.start()
    for _ in range(finished):
        message = await consumer.get(timeout=30)
        assert message is not None
        assert message.partition == 0
        await message.finish()
    await consumer.sync()

    def lags(metric: str) -> dict[str, int]:
        points = lag_telemetry.points(metric, **group)
        return {p.attributes["messaging.destination.partition.id"]: p.value for p in points}

    # nsqd's depth may lag a moment behind the finishes: polled until it matches
    await until(lambda: lags("nsq.consumer.lag") == {"0": published - finished, "1": other})
    in_bytes = lags("nsq.consumer.lag.bytes")
    assert in_bytes["0"] > in_bytes["1"] > 0  # 6 messages behind the end > 3 messages
    assert (
        len(lag_telemetry.points("nsq.consumer.lag", **group, **{"messaging.system": "nsq"})) == 2
    )
    await consumer.close()
    # a closed consumer's values are forgotten
    await until(lambda: not lag_telemetry.points("nsq.consumer.lag", **group), within=5)
