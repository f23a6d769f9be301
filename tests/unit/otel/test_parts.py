"""``nsq_ha.otel`` without a server: trace context in ext headers, the fork trace id, the
attributes, the event metrics, the channels of closed consumers (retired, reported once,
forgotten), and instrument()/uninstrument()."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from nsq_ha import events, otel
from nsq_ha.consumer import Consumer
from nsq_ha.errors import BrokerError, NotLeaderError, PublishError
from nsq_ha.otel import attributes as a
from nsq_ha.otel.metrics import MAX_RETIRED, Metrics
from nsq_ha.otel.propagation import fork_trace_id, has_trace_id, with_context
from nsq_ha.producer import Producer

TRACER = TracerProvider().get_tracer("test")


@pytest.fixture(autouse=True)
def not_instrumented() -> Iterator[None]:
    assert not otel.is_instrumented()
    yield
    otel.uninstrument()


def test_with_context_outside_a_span_leaves_the_header_alone() -> None:
    header = {"k": "v"}
    assert with_context(header) is header
    assert with_context(None) is None


def test_with_context_adds_traceparent_and_keeps_the_callers_keys() -> None:
    with TRACER.start_as_current_span("publish") as span:
        context = span.get_span_context()
        added = with_context(None)
        assert isinstance(added, dict)
        version, trace_id, span_id, _ = added["traceparent"].split("-")
        assert (version, trace_id, span_id) == (
            "00",
            f"{context.trace_id:032x}",
            f"{context.span_id:016x}",
        )
        header = {"k": "v", "##trace_id": "5"}
        merged = with_context(header)
        assert merged == {**header, "traceparent": added["traceparent"]}
        assert header == {"k": "v", "##trace_id": "5"}  # the caller's object is not changed
        own = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        assert with_context(own) == own  # the application's own context wins
        raw = with_context(b'{"k": 1}')
        assert isinstance(raw, dict)
        assert raw["k"] == 1
        assert "traceparent" in raw
        assert with_context(b"[1]") == b"[1]"  # not an object: left as it is
        assert with_context(b"{nope") == b"{nope"


def test_fork_trace_id_is_the_low_64_bits_of_the_span_trace_id() -> None:
    with TRACER.start_as_current_span("publish") as span:
        trace_id = span.get_span_context().trace_id
        assert fork_trace_id(span) == trace_id & ((1 << 64) - 1)
    assert fork_trace_id(trace.INVALID_SPAN) is None


def test_has_trace_id() -> None:
    assert not has_trace_id(None)
    assert not has_trace_id({"k": "v"})
    assert has_trace_id({"##trace_id": "1"})
    assert has_trace_id(b'{"##trace_id":"1"}')
    assert not has_trace_id(b'{"k":"v"}')


def test_error_attributes_name_the_class_and_the_broker_code() -> None:
    assert a.error_attributes(ValueError("x")) == {"error.type": "ValueError"}
    assert a.error_attributes(BrokerError("E_SOMETHING_NEW")) == {
        "error.type": "BrokerError",
        "nsq.error.code": "E_SOMETHING_NEW",
    }
    last = NotLeaderError("E_FAILED_ON_NOT_LEADER")
    assert a.error_attributes(PublishError("gave up", attempts=3, last_error=last)) == {
        "error.type": "PublishError",
        "nsq.error.code": "E_FAILED_ON_NOT_LEADER",
    }


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:4150", {"server.address": "127.0.0.1", "server.port": 4150}),
        ("[::1]:4150", {"server.address": "::1", "server.port": 4150}),
        ("somewhere", {"server.address": "somewhere"}),
    ],
)
def test_server_attributes(address: str, expected: dict[str, Any]) -> None:
    assert a.server_attributes(address) == expected


def collect(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = [
                    (dict(p.attributes or {}), getattr(p, "value", None))
                    for p in metric.data.data_points
                ]
    return found


def test_event_metrics() -> None:
    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    metrics.on_event(
        events.LeaderChanged(role="consumer", topic="t", partition=1, old="a", new="b", channel="c")
    )
    for attempt in (1, 2):
        metrics.on_event(
            events.Reconnecting(
                role="producer", topic="t", partition=None, address="a", error="x", attempt=attempt
            )
        )
    metrics.on_event(events.PublishGaveUp(topic="t", partition=None, attempts=3, error="x"))
    found = collect(reader)
    base = {"messaging.system": "nsq", "messaging.destination.name": "t"}
    assert found["nsq.client.leader_changes"] == [
        ({**base, "nsq.client.role": "consumer", "messaging.destination.partition.id": "1"}, 1)
    ]
    assert found["nsq.client.reconnects"] == [({**base, "nsq.client.role": "producer"}, 2)]
    assert found["nsq.client.give_ups"] == [({**base, "nsq.client.role": "producer"}, 1)]
    metrics.active = False  # uninstrumented: the observable instruments report nothing
    assert not collect(reader).get("nsq.producer.retries")


def test_instrument_patches_the_clients_and_uninstrument_restores_them() -> None:
    originals = (Producer.publish, Producer.publish_many, Consumer.run, Consumer.run_batches)
    otel.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    assert otel.is_instrumented()
    patched = (Producer.publish, Producer.publish_many, Consumer.run, Consumer.run_batches)
    assert all(p is not o for p, o in zip(patched, originals, strict=True))
    assert Producer.publish.__doc__ == originals[0].__doc__
    assert events._listeners  # the instrumentor listens to the clients' events
    otel.instrument()  # instrumented already: a warning, and nothing changes
    assert (Producer.publish, Producer.publish_many, Consumer.run, Consumer.run_batches) == patched
    otel.uninstrument()
    assert not otel.is_instrumented()
    after = (Producer.publish, Producer.publish_many, Consumer.run, Consumer.run_batches)
    assert after == originals
    otel.uninstrument()  # twice: nothing to undo


async def test_instrumented_producer_counts_retries_after_close() -> None:
    reader = InMemoryMetricReader()
    otel.instrument(
        tracer_provider=TracerProvider(), meter_provider=MeterProvider(metric_readers=[reader])
    )
    producer = Producer(nsqd="127.0.0.1:1")
    producer.stats["retries"] = 4  # as a producer that retried 4 times
    assert collect(reader)["nsq.producer.retries"] == [({"messaging.system": "nsq"}, 4)]
    await producer.close()
    del producer
    assert collect(reader)["nsq.producer.retries"] == [({"messaging.system": "nsq"}, 4)]


def test_with_context_leaves_what_is_not_a_header() -> None:
    with TRACER.start_as_current_span("publish"):
        assert with_context(42) == 42  # the publish refuses it, as it would untraced
        assert not has_trace_id(42)


def offset_points(reader: InMemoryMetricReader) -> dict[str, int]:
    """``nsq.consumer.offset`` at this collection: channel -> offset."""
    found: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for m in scope.metrics:
                if m.name == "nsq.consumer.offset":
                    for p in m.data.data_points:
                        found[str(p.attributes[a.CONSUMER_GROUP])] = int(p.value)  # type: ignore[index, union-attr]
    return found


def counted(consumer: Consumer, partition: int, **counts: int) -> None:
    """As if ``consumer`` had counted ``counts`` (received, finished, ...) on ``partition``."""
    counters = consumer._tally.of(partition)
    for name, count in counts.items():
        counters[name] += count


def consumed(reader: InMemoryMetricReader) -> dict[str, int]:
    """``messaging.client.consumed.messages`` at this collection: channel -> received."""
    found: dict[str, int] = {}
    for attrs, value in collect(reader).get("messaging.client.consumed.messages", []):
        channel = str(attrs[a.CONSUMER_GROUP])
        found[channel] = found.get(channel, 0) + int(value)
    return found


def test_a_channel_is_retired_when_its_last_consumer_goes_and_forgotten_a_collection_later() -> (
    None
):
    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    first, second = (Consumer("t", "c", nsqd="127.0.0.1:4150") for _ in range(2))
    other = Consumer("t", "d", nsqd="127.0.0.1:4150")
    for consumer in (first, second, other):
        metrics.add_consumer(consumer)
    metrics.remember_offset("t", "c", 0, 10)
    metrics.remember_offset("t", "d", 0, 20)
    metrics.remember_offset("t", "nobody", 0, 30)  # no instrumented consumer has it: not kept
    retries = ("retries", ((a.SYSTEM, a.SYSTEM_NAME),))
    metrics.closed.setdefault(None, Counter())[retries] += 1  # a closed producer's: kept
    assert offset_points(reader) == {"c": 10, "d": 20}
    metrics.consumer_closed(first)  # "c" still has a live consumer
    assert offset_points(reader) == {"c": 10, "d": 20}
    assert metrics.retired == {}
    metrics.consumer_closed(second)  # "c" is retired: the next collection still reports it
    assert set(metrics.retired) == {("t", "c")}
    assert metrics.groups == {("t", "d")}
    metrics.remember_offset("t", "c", 0, 11)  # a late handler of a retired channel: not kept
    assert offset_points(reader) == {"c": 10, "d": 20}
    assert offset_points(reader) == {"d": 20}  # and the one after that forgets it
    assert metrics.offsets == {("t", "d"): {0: 20}}
    assert metrics.retired == {}
    del other, consumer  # dropped without close(): retired by the next collection, which
    gc.collect()  # reports it, and forgotten by the one after
    assert offset_points(reader) == {"d": 20}
    assert offset_points(reader) == {}
    assert metrics.offsets == {}
    assert metrics.retired == {}
    assert metrics.closed == {None: Counter({retries: 1})}


def test_a_closed_consumers_final_counts_are_exported_by_one_collection() -> None:
    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    consumer = Consumer("t", "c", nsqd="127.0.0.1:4150")
    metrics.add_consumer(consumer)
    counted(consumer, 0, received=3, finished=3)
    assert consumed(reader) == {"c": 3}
    counted(consumer, 0, received=4, finished=2, requeued=2)  # after that collection
    metrics.consumer_closed(consumer)
    found = collect(reader)  # the next collection exports the final counts
    assert found.get("messaging.client.consumed.messages") == [
        ({a.SYSTEM: a.SYSTEM_NAME, a.DESTINATION: "t", a.CONSUMER_GROUP: "c", a.PARTITION: "0"}, 7)
    ]
    outcomes = {str(attrs[a.NSQ_OUTCOME]): value for attrs, value in found["nsq.consumer.messages"]}
    assert outcomes == {
        "finished": 5,
        "requeued": 2,
        "timed_out": 0,
        "given_up": 0,
        "abandoned": 0,
    }
    assert consumed(reader) == {}  # and the one after that none
    assert "nsq.consumer.messages" not in collect(reader)
    assert metrics.closed == {}
    assert metrics.retired == {}


def test_a_consumer_that_restarts_on_a_retired_channel_continues_its_totals() -> None:
    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    before = Consumer("t", "c", nsqd="127.0.0.1:4150")
    metrics.add_consumer(before)
    counted(before, 0, received=3)
    metrics.consumer_closed(before)
    after = Consumer("t", "c", nsqd="127.0.0.1:4150")
    metrics.add_consumer(after)  # before the next collection: the channel is live again
    assert metrics.retired == {}
    counted(after, 0, received=2)
    assert consumed(reader) == {"c": 5}
    assert consumed(reader) == {"c": 5}  # live: not forgotten
    metrics.consumer_closed(after)
    assert consumed(reader) == {"c": 5}
    assert consumed(reader) == {}


def test_each_instrument_exports_a_retired_channel_once_whatever_the_callback_order() -> None:
    """A consumer closed in the middle of a collection (another thread collects): every
    observable instrument reports the channel's final values in exactly one of its calls, the
    first one after the close, whichever ran first; then the channel is forgotten."""
    metrics = Metrics(MeterProvider().get_meter("test"))
    consumer = Consumer("t", "c", nsqd="127.0.0.1:4150")
    metrics.add_consumer(consumer)
    counted(consumer, 0, received=2, finished=2)
    metrics.remember_offset("t", "c", 0, 7)
    callbacks = {
        "messaging.client.consumed.messages": metrics._received,
        "nsq.consumer.messages": metrics._outcomes,
        "nsq.consumer.offset": metrics._offset,
    }
    reported: dict[str, list[int]] = {name: [] for name in callbacks}

    def call(name: str, collection: int) -> None:
        observations = list(callbacks[name](CallbackOptions()))
        if any(o.attributes and o.attributes.get(a.CONSUMER_GROUP) == "c" for o in observations):
            reported[name].append(collection)

    call("nsq.consumer.messages", 1)  # the consumer is live yet
    metrics.consumer_closed(consumer)
    call("nsq.consumer.offset", 1)
    call("messaging.client.consumed.messages", 1)
    for collection in (2, 3, 4):
        for name in reversed(callbacks):
            call(name, collection)
    assert reported == {
        "messaging.client.consumed.messages": [1],
        "nsq.consumer.messages": [1, 2],
        "nsq.consumer.offset": [1],
    }
    assert (metrics.closed, metrics.offsets, metrics.retired) == ({}, {}, {})


def test_retired_channels_are_capped_when_nothing_collects() -> None:
    """Metrics instrumented and never read: at most MAX_RETIRED retired channels are kept,
    the oldest dropped first, and a later collection reports those and then none."""
    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    channels = [f"c{i:04d}" for i in range(MAX_RETIRED + 500)]
    for channel in channels:
        consumer = Consumer("t", channel, nsqd="127.0.0.1:4150")
        metrics.add_consumer(consumer)
        counted(consumer, 0, received=1, finished=1)
        metrics.remember_offset("t", channel, 0, 1)
        metrics.consumer_closed(consumer)
    kept = channels[-MAX_RETIRED:]
    assert list(metrics.retired) == [("t", c) for c in kept]
    assert set(metrics.closed) == {("t", c) for c in kept}
    assert set(metrics.offsets) == {("t", c) for c in kept}
    assert consumed(reader) == dict.fromkeys(kept, 1)
    assert consumed(reader) == {}
    assert (metrics.closed, metrics.offsets, metrics.retired) == ({}, {}, {})
