"""Spans of the consumers that pull (``async for``, ``get()``, ``get_many()``, the blocking
``get()``), on the embedded broker and on the real fork, with no call to ``otel.processing()``:
a receive span per message handed out, linked to the publish, and a process span per message
(the publish span's child on ext topics) that is current while the loop body runs and ends at
the message's ``finish()``/``requeue()`` (a settle span inside it), at the loop's next message,
or at close."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from nsq_ha import otel, sync
from nsq_ha.admin import TopicSpec
from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer import Consumer, Message
from nsq_ha.producer import Producer

from .backend import Backend

EXT = TopicSpec("nsqha_otel_pull_ext", partitions=2, ext=True)
CLIENT = "otel-pull-test"


class Spans:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")
        otel.instrument(tracer_provider=self.provider, lag_interval=None)

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def of(self, name: str, message: Message) -> list[ReadableSpan]:
        """The spans called ``name`` about ``message``."""
        return [
            s
            for s in self.named(name)
            if (s.attributes or {}).get("messaging.message.id") == message.id.hex()
            and (s.attributes or {}).get("messaging.destination.partition.id")
            == str(message.partition)
        ]

    def children(self, span: ReadableSpan) -> list[ReadableSpan]:
        return [
            s
            for s in self.exporter.get_finished_spans()
            if s.parent is not None and s.parent.span_id == span.context.span_id
        ]


@pytest.fixture
def spans() -> Iterator[Spans]:
    made = Spans()
    try:
        yield made
    finally:
        otel.uninstrument()


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics([EXT])
    return backend


def new_consumer(cluster: Backend, **options: object) -> Consumer:
    return Consumer(
        EXT.name,
        f"pull{uuid.uuid4().hex[:8]}",
        lookupd=cluster.lookupd_http,
        connection=ConnectionConfig(client_id=CLIENT),
        **options,  # type: ignore[arg-type]
    )


async def subscribed(consumer: Consumer) -> None:
    """Start ``consumer`` and wait until every partition is subscribed (a new channel gets only
    what is published after it exists)."""
    await consumer.start()
    deadline = time.monotonic() + 30
    while len(consumer.connections) < EXT.partitions:
        assert time.monotonic() < deadline, consumer.stats
        await asyncio.sleep(0.02)


async def publish(cluster: Backend, count: int) -> None:
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        for i in range(count):
            await producer.publish(EXT.name, b"pull %d" % i, sharding_key=f"k{i}")


def publish_span_of(spans: Spans, message: Message) -> ReadableSpan:
    [found] = spans.of(f"publish {EXT.name}", message)
    return found


def check_receive(spans: Spans, message: Message) -> ReadableSpan:
    [receive] = spans.of(f"receive {EXT.name}", message)
    attrs = receive.attributes or {}
    assert receive.kind is SpanKind.CLIENT
    assert attrs["messaging.operation.type"] == "receive"
    assert attrs["messaging.system"] == "nsq"
    assert attrs["messaging.destination.name"] == EXT.name
    assert attrs["messaging.consumer.group.name"] == message.channel
    assert attrs["messaging.client.id"] == CLIENT
    publish_span = publish_span_of(spans, message)
    assert [link.context.span_id for link in receive.links] == [publish_span.context.span_id]
    return receive


def check_process(spans: Spans, message: Message) -> ReadableSpan:
    [process] = spans.of(f"process {EXT.name}", message)
    attrs = process.attributes or {}
    assert process.kind is SpanKind.CONSUMER
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.consumer.group.name"] == message.channel
    assert attrs["messaging.client.id"] == CLIENT
    publish_span = publish_span_of(spans, message)
    assert process.parent is not None
    assert process.parent.span_id == publish_span.context.span_id
    assert process.context.trace_id == publish_span.context.trace_id
    assert publish_span.context.span_id in {link.context.span_id for link in process.links}
    return process


async def test_async_for_gives_each_message_a_receive_span_and_a_process_span(
    cluster: Backend, spans: Spans
) -> None:
    consumer = new_consumer(cluster)
    await subscribed(consumer)
    await publish(cluster, 2)
    got: list[Message] = []
    inner: list[trace.Span] = []
    async with asyncio.timeout(30):
        async for message in consumer:
            got.append(message)
            with spans.tracer.start_as_current_span("handling") as span:  # the user's own
                inner.append(span)
            await message.finish()
            if len(got) == 2:
                break
    await consumer.close()
    for message, span in zip(got, inner, strict=True):
        receive = check_receive(spans, message)
        process = check_process(spans, message)
        assert receive.end_time is not None
        assert process.start_time is not None
        assert receive.end_time <= process.start_time
        assert (process.attributes or {})["nsq.message.outcome"] == "finished"
        # the loop body runs in the process span; finish() is a settle span in it
        children = spans.children(process)
        assert sorted(s.name for s in children) == [f"finish {EXT.name}", "handling"]
        assert span.get_span_context().span_id in {s.context.span_id for s in children}
        [settle] = [s for s in children if s.name.startswith("finish")]
        assert settle.kind is SpanKind.CLIENT
        assert (settle.attributes or {})["messaging.operation.type"] == "settle"
        assert (settle.attributes or {})["messaging.operation.name"] == "finish"
        assert (settle.attributes or {})["messaging.client.id"] == CLIENT
    assert not trace.get_current_span().get_span_context().is_valid  # nothing left current


async def test_a_process_span_ends_when_the_loop_asks_for_the_next_message(
    cluster: Backend, spans: Spans
) -> None:
    consumer = new_consumer(cluster)
    await subscribed(consumer)
    await publish(cluster, 2)
    got: list[Message] = []
    current: list[int] = []
    async with asyncio.timeout(30):
        async for message in consumer:  # nothing answered in the loop
            got.append(message)
            current.append(trace.get_current_span().get_span_context().span_id)
            if len(got) == 2:
                break
    first, second = got
    process = check_process(spans, first)  # ended by the second iteration
    receive = check_receive(spans, second)
    assert process.end_time is not None
    assert receive.start_time is not None
    assert process.end_time <= receive.start_time
    assert "nsq.message.outcome" not in (process.attributes or {})
    assert current[0] == process.context.span_id
    assert spans.of(f"process {EXT.name}", second) == []  # still open
    requeued = spans.named(f"requeue {EXT.name}")
    await second.requeue(0, backoff=False)
    await first.finish()  # its process span has ended: no settle span
    await consumer.close()
    [later] = spans.of(f"process {EXT.name}", second)
    assert current[1] == later.context.span_id
    assert (later.attributes or {})["nsq.message.outcome"] == "requeued"
    assert len(spans.named(f"requeue {EXT.name}")) == len(requeued) + 1
    assert spans.named(f"finish {EXT.name}") == []


async def test_get_many_makes_a_receive_span_and_a_process_span_per_message(
    cluster: Backend, spans: Spans
) -> None:
    consumer = new_consumer(cluster)
    await subscribed(consumer)
    await publish(cluster, 3)
    got: list[Message] = []
    async with asyncio.timeout(30):
        while len(got) < 3:
            batch = await consumer.get_many(10)
            assert trace.get_current_span() is trace.INVALID_SPAN  # none made current
            got += batch
    for message in got:
        await message.finish()
        check_receive(spans, message)
        process = check_process(spans, message)
        assert [s.name for s in spans.children(process)] == [f"finish {EXT.name}"]
    assert len(spans.named(f"receive {EXT.name}")) == 3
    await consumer.close()


async def test_get_with_no_message_makes_no_span(cluster: Backend, spans: Spans) -> None:
    consumer = new_consumer(cluster)
    await subscribed(consumer)
    assert await consumer.get(timeout=0.05) is None
    assert await consumer.get_many(5, timeout=0.05) == []
    await consumer.close()
    assert spans.named(f"receive {EXT.name}") == []


async def test_close_ends_the_process_span_of_a_message_nobody_answered(
    cluster: Backend, spans: Spans
) -> None:
    consumer = new_consumer(cluster)
    await subscribed(consumer)
    await publish(cluster, 1)
    message = await consumer.get(timeout=30)
    assert message is not None
    assert spans.of(f"process {EXT.name}", message) == []
    await consumer.close(drain_timeout=0)
    process = check_process(spans, message)
    assert (process.attributes or {})["nsq.message.outcome"] == "requeued"  # by the close
    assert not trace.get_current_span().get_span_context().is_valid


async def test_processing_takes_over_the_automatic_process_span(
    cluster: Backend, spans: Spans
) -> None:
    consumer = new_consumer(cluster)
    await subscribed(consumer)
    await publish(cluster, 1)
    message = await consumer.get(timeout=30)
    assert message is not None
    made: list[trace.Span] = []

    def handle(message: Message) -> None:
        with otel.processing(message) as span:
            made.append(span)
            assert trace.get_current_span() is span
            raise ValueError("bad body")

    with pytest.raises(ValueError, match="bad body"):
        handle(message)
    [span] = made
    process = check_process(spans, message)  # one span: ended by the with block
    assert process.context.span_id == span.get_span_context().span_id
    assert (process.attributes or {})["error.type"] == "ValueError"
    await message.requeue(0, backoff=False)  # after the process span: no settle span
    await consumer.close()
    assert spans.named(f"requeue {EXT.name}") == []
    assert len(spans.named(f"process {EXT.name}")) == 1


def test_blocking_get_gives_each_message_a_receive_span_and_a_process_span(
    cluster: Backend, spans: Spans
) -> None:
    with sync.Consumer(
        EXT.name,
        f"pull{uuid.uuid4().hex[:8]}",
        lookupd=cluster.lookupd_http,
        connection=ConnectionConfig(client_id=CLIENT),
    ) as consumer:
        deadline = time.monotonic() + 30
        while consumer.stats["connections"] < EXT.partitions:
            assert time.monotonic() < deadline, consumer.stats
            time.sleep(0.02)
        with sync.Producer(lookupd=cluster.lookupd_http) as producer:
            for i in range(2):
                producer.publish(EXT.name, b"blocking %d" % i, sharding_key=f"b{i}", timeout=30)
        got: list[Message] = []
        for _ in range(2):
            handed = consumer.get(timeout=30)
            assert handed is not None
            got.append(handed.aio)
            handed.finish()
        consumer.sync(timeout=30)
    for message in got:
        check_receive(spans, message)
        process = check_process(spans, message)
        assert (process.attributes or {})["nsq.message.outcome"] == "finished"
        assert [s.name for s in spans.children(process)] == [f"finish {EXT.name}"]


async def test_run_handlers_keep_one_process_span_and_get_no_receive_span(
    cluster: Backend, spans: Spans
) -> None:
    consumer = new_consumer(cluster)
    await subscribed(consumer)
    handled: list[Message] = []
    runner = asyncio.ensure_future(consumer.run(handled.append))
    await publish(cluster, 2)
    deadline = time.monotonic() + 30
    while consumer.stats["finished"] < 2:
        assert time.monotonic() < deadline, consumer.stats
        await asyncio.sleep(0.02)
    await consumer.close()
    await runner
    assert spans.named(f"receive {EXT.name}") == []
    for message in handled:
        [process] = spans.of(f"process {EXT.name}", message)
        assert (process.attributes or {})["messaging.client.id"] == CLIENT
        assert process.parent is not None
        assert process.parent.span_id == publish_span_of(spans, message).context.span_id


async def test_publish_spans_name_the_producers_client_id(cluster: Backend, spans: Spans) -> None:
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        await producer.publish(EXT.name, b"default id", sharding_key="d")
    async with Producer(
        lookupd=cluster.lookupd_http, connection=ConnectionConfig(client_id="named-producer")
    ) as producer:
        await producer.publish(EXT.name, b"named id", sharding_key="n")
    found = [
        (s.attributes or {}).get("messaging.client.id") for s in spans.named(f"publish {EXT.name}")
    ]
    assert found == [socket.gethostname(), "named-producer"]  # what IDENTIFY sends
