"""Patching the clients' classes: :func:`instrument` and :func:`uninstrument`.

What is wrapped (on the classes, so every instance, also the blocking ``nsq_ha.sync`` ones):

* ``Producer.publish`` and ``Producer.publish_many``: a PRODUCER span per call, the trace
  context in the message (:mod:`nsq_ha.otel.propagation`), publish latency, messages sent,
  errors by code;
* ``Consumer.run`` and ``Consumer.run_batches``: a CONSUMER span around each handler call;
* ``Producer.__init__``/``close`` and ``Consumer.start``/``close``: which clients' counters
  the observable metrics read, and whether the consumer-lag thread (:mod:`nsq_ha.otel.lag`)
  runs.

``async for`` and ``get()`` hand messages out with no handler call to wrap: wrap your own
handling in :func:`nsq_ha.otel.processing`.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.metrics import MeterProvider, get_meter
from opentelemetry.trace import Link, Span, SpanKind, Tracer, TracerProvider

from nsq_ha import events
from nsq_ha._version import __version__
from nsq_ha.consumer import Consumer
from nsq_ha.otel import attributes as a
from nsq_ha.otel.lag import LagPoller, check_interval
from nsq_ha.otel.metrics import Metrics
from nsq_ha.otel.propagation import extract, fork_trace_id, has_trace_id, with_context
from nsq_ha.producer import Producer

if TYPE_CHECKING:
    from nsq_ha.consumer import Message
    from nsq_ha.producer import PublishResult
    from nsq_ha.producer.routes import Routes

__all__ = ["instrument", "is_instrumented", "processing", "uninstrument"]

_SCOPE = "nsq_ha"


@dataclass
class _State:
    tracer: Tracer
    metrics: Metrics
    propagate: bool
    fork_trace_ids: bool
    lag: LagPoller | None = None
    originals: list[tuple[type, str, Any]] = field(default_factory=list)


_state: _State | None = None


def instrument(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    propagate: bool = True,
    fork_trace_ids: bool = True,
    lag_interval: float | None = 15.0,
) -> None:
    """Trace and measure every :class:`~nsq_ha.producer.Producer` and
    :class:`~nsq_ha.consumer.Consumer` of the process (the global providers unless given).

    ``propagate``: put the trace context into the ext header of messages to ext topics.
    ``fork_trace_ids``: publish to fork topics with the span's trace id (its low 64 bits) as
    the message's trace id, when the caller gave none. That makes every such publish a traced
    one (``PUB_TRACE``/``MPUB_TRACE``, answered with the message's id and queue offset, which
    the span records); turn it off to keep plain ``PUB``/``MPUB``.
    ``lag_interval``: read the consumers' lag (``nsq.consumer.lag``) from nsqd's ``/stats``
    every so many seconds, in a background thread while instrumented consumers run
    (:mod:`nsq_ha.otel.lag`); None turns it off. A positive finite number, else TypeError
    or ValueError.
    Instrumenting twice raises RuntimeError (:func:`uninstrument` first).
    """
    global _state
    interval = check_interval(lag_interval)
    if _state is not None:
        raise RuntimeError("nsq_ha is instrumented already: call uninstrument() first")
    tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider)
    metrics = Metrics(get_meter(_SCOPE, __version__, meter_provider), lag_interval=interval)
    state = _State(tracer, metrics, propagate, fork_trace_ids)
    if interval is not None:
        state.lag = LagPoller(metrics.consumers, metrics.lag, interval)
    _patch(state, Producer, "__init__", _producer_init)
    _patch(state, Producer, "close", _producer_close)
    _patch(state, Producer, "publish", _publish_one)
    _patch(state, Producer, "publish_many", _publish_many)
    _patch(state, Consumer, "start", _consumer_start)
    _patch(state, Consumer, "close", _consumer_close)
    _patch(state, Consumer, "run", _run)
    _patch(state, Consumer, "run_batches", _run_batches)
    events.subscribe(metrics.on_event)
    _state = state


def uninstrument() -> None:
    """Undo :func:`instrument` (clients made meanwhile keep working, untraced). The consumer
    lag thread ends before it returns (a request under way is abandoned; it waits
    :data:`~nsq_ha.otel.lag.STOP_TIMEOUT` seconds at most)."""
    global _state
    state, _state = _state, None
    if state is None:
        return
    events.unsubscribe(state.metrics.on_event)
    state.metrics.active = False
    if state.lag is not None:
        state.lag.stop()
    for cls, name, original in reversed(state.originals):
        setattr(cls, name, original)


def is_instrumented() -> bool:
    """True between :func:`instrument` and :func:`uninstrument`."""
    return _state is not None


def _patch(state: _State, cls: type, name: str, make: Callable[[_State, Any], Any]) -> None:
    original = cls.__dict__[name]
    wrapper = make(state, original)
    functools.update_wrapper(wrapper, original)
    state.originals.append((cls, name, original))
    setattr(cls, name, wrapper)


# -- client registry ----------------------------------------------------------------------------


def _producer_init(state: _State, original: Any) -> Any:
    def __init__(self: Producer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        state.metrics.add_producer(self)

    return __init__


def _producer_close(state: _State, original: Any) -> Any:
    async def close(self: Producer, *args: Any, **kwargs: Any) -> None:
        try:
            await original(self, *args, **kwargs)
        finally:
            state.metrics.producer_closed(self)

    return close


def _consumer_start(state: _State, original: Any) -> Any:
    async def start(self: Consumer) -> None:
        state.metrics.add_consumer(self)
        if state.lag is not None:
            state.lag.start()
        await original(self)

    return start


def _consumer_close(state: _State, original: Any) -> Any:
    async def close(self: Consumer, *args: Any, **kwargs: Any) -> None:
        try:
            await original(self, *args, **kwargs)
        finally:
            state.metrics.consumer_closed(self)
            if state.lag is not None and state.lag.forget():  # the last one: no poller left
                await state.lag.wait_ended()

    return close


# -- publishing ---------------------------------------------------------------------------------


def _publish_one(state: _State, original: Any) -> Any:
    async def publish(self: Producer, topic: str, body: bytes, **kwargs: Any) -> PublishResult:
        async def call(span: Span) -> list[PublishResult]:
            options = await _carry(state, self, span, topic, 1, kwargs, many=False)
            return [await original(self, topic, body, **options)]

        size = len(body) if isinstance(body, bytes | bytearray) else None
        return (await _publishing(state, topic, 1, size, call))[0]

    return publish


def _publish_many(state: _State, original: Any) -> Any:
    async def publish_many(
        self: Producer, topic: str, bodies: Sequence[bytes], **kwargs: Any
    ) -> list[PublishResult]:
        count = len(bodies) if isinstance(bodies, Sequence) else 0

        async def call(span: Span) -> list[PublishResult]:
            options = await _carry(state, self, span, topic, count, kwargs, many=True)
            results: list[PublishResult] = await original(self, topic, bodies, **options)
            return results

        return await _publishing(state, topic, count, None, call)

    return publish_many


async def _publishing(
    state: _State,
    topic: str,
    count: int,
    size: int | None,
    call: Callable[[Span], Any],
) -> list[PublishResult]:
    """Run ``call(span)`` in a PRODUCER span; record its results, or its error, and metrics."""
    attrs: a.Attributes = {
        a.SYSTEM: a.SYSTEM_NAME,
        a.DESTINATION: topic,
        a.OPERATION_TYPE: "send",
        a.OPERATION_NAME: "publish",
    }
    span_attrs = dict(attrs)
    if count != 1:
        span_attrs[a.BATCH_COUNT] = count
    elif size is not None:
        span_attrs[a.BODY_SIZE] = size
    started = time.perf_counter()
    with state.tracer.start_as_current_span(
        f"publish {topic}", kind=SpanKind.PRODUCER, attributes=span_attrs
    ) as span:
        try:
            results: list[PublishResult] = await call(span)
        except Exception as exc:
            failed = {**attrs, **a.error_attributes(exc)}
            span.set_attributes(failed)
            metrics = state.metrics
            metrics.duration.record(time.perf_counter() - started, failed)
            metrics.sent.add(count, failed)
            metrics.errors.add(1, failed)
            raise
        partitions = {r.partition for r in results}
        if len(partitions) == 1 and None not in partitions:
            attrs[a.PARTITION] = str(partitions.pop())
        if results:
            found = a.result_attributes(results[0])
            if count != 1:  # per-message values only for one message
                for name in (a.MESSAGE_ID, a.NSQ_OFFSET, a.NSQ_TRACE_ID):
                    found.pop(name, None)
            span.set_attributes(found)
        state.metrics.duration.record(time.perf_counter() - started, attrs)
        state.metrics.sent.add(count, attrs)
        return results


async def _carry(
    state: _State,
    producer: Producer,
    span: Span,
    topic: str,
    count: int,
    kwargs: dict[str, Any],
    *,
    many: bool,
) -> dict[str, Any]:
    """The publish's keyword arguments with the trace context added where the topic takes it:
    ext topics get it in the header, fork topics the trace id (see
    :mod:`nsq_ha.otel.propagation`)."""
    if not (state.propagate or state.fork_trace_ids) or count < 1:
        return kwargs
    routes: Routes = await producer.topic_routes(topic)
    if routes.fork is not True:
        return kwargs  # vanilla, or nsqd= addresses whose kind is not known yet
    options = dict(kwargs)
    headers = options.get("exts") if many else None
    if headers is not None and not (isinstance(headers, Sequence) and len(headers) == count):
        return kwargs  # the publish refuses it as it would without tracing
    if state.propagate and routes.ext is True:
        if headers is not None:
            if options.get("ext") is None:  # both given: refused by the publish
                options["exts"] = [with_context(h) for h in headers]
        else:
            options["ext"] = with_context(options.get("ext"))
    trace_id = fork_trace_id(span) if state.fork_trace_ids else None
    if trace_id is not None:
        if not many:
            if options.get("trace_id") is None and not has_trace_id(options.get("ext")):
                options["trace_id"] = trace_id
        else:
            given = options.get("trace_ids")
            headers = options.get("exts")
            if (
                given is None or (isinstance(given, Sequence) and len(given) == count)
            ) and not has_trace_id(options.get("ext")):
                ids = list(given) if given is not None else [None] * count
                for i in range(count):
                    if ids[i] is None and not has_trace_id(None if headers is None else headers[i]):
                        ids[i] = trace_id
                options["trace_ids"] = ids
    return options


# -- consuming ----------------------------------------------------------------------------------


@contextmanager
def processing(message: Message) -> Iterator[Span]:
    """A CONSUMER span (``process {topic}``) around your handling of ``message``, a child of
    the publish span when the message's ext header carries its context. For ``async for`` /
    ``get()`` consumers; :meth:`Consumer.run` and :meth:`Consumer.run_batches` do it
    themselves once instrumented. Without :func:`instrument`, the global tracer is used and no
    metric is recorded."""
    state = _state
    tracer = state.tracer if state is not None else trace.get_tracer(_SCOPE, __version__)
    with _process_span(tracer, state, [message]) as span:
        yield span


@contextmanager
def _process_span(
    tracer: Tracer, state: _State | None, messages: Sequence[Message]
) -> Iterator[Span]:
    first = messages[0]
    attrs: a.Attributes = {
        a.SYSTEM: a.SYSTEM_NAME,
        a.DESTINATION: first.topic,
        a.CONSUMER_GROUP: first.channel,
        a.OPERATION_TYPE: "process",
        a.OPERATION_NAME: "process",
    }
    span_attrs = dict(attrs)
    parent = None
    links: list[Link] = []
    if len(messages) == 1:
        span_attrs.update(a.message_attributes(first))
        parent = extract(first)
    else:
        span_attrs[a.BATCH_COUNT] = len(messages)
        for message in messages:
            context = extract(message)
            if context is not None:
                span_context = trace.get_current_span(context).get_span_context()
                if span_context.is_valid:
                    links.append(Link(span_context, a.message_attributes(message)))
    started = time.perf_counter()
    with tracer.start_as_current_span(
        f"process {first.topic}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=span_attrs,
        links=links,
    ) as span:
        try:
            yield span
        except Exception as exc:
            attrs.update(a.error_attributes(exc))
            span.set_attributes(a.error_attributes(exc))
            raise
        finally:
            if state is not None:
                state.metrics.process_duration.record(time.perf_counter() - started, attrs)
                _remember_offsets(state, messages)


def _remember_offsets(state: _State, messages: Sequence[Message]) -> None:
    for message in messages:
        if message.offset is not None and message.partition is not None:
            state.metrics.remember_offset(
                message.topic, message.channel, message.partition, message.offset
            )


def _traced(state: _State, handler: Callable[[Any], Any], batch: bool) -> Callable[[Any], Any]:
    async def traced(argument: Any) -> None:
        messages: Sequence[Message] = argument if batch else [argument]
        if not messages:
            result = handler(argument)
            if inspect.isawaitable(result):
                await result
            return
        with _process_span(state.tracer, state, messages):
            result = handler(argument)
            if inspect.isawaitable(result):
                await result

    return traced


def _run(state: _State, original: Any) -> Any:
    async def run(self: Consumer, handler: Callable[[Any], Any], **kwargs: Any) -> None:
        await original(self, _traced(state, handler, batch=False), **kwargs)

    return run


def _run_batches(state: _State, original: Any) -> Any:
    async def run_batches(self: Consumer, handler: Callable[[Any], Any], **kwargs: Any) -> None:
        await original(self, _traced(state, handler, batch=True), **kwargs)

    return run_batches
